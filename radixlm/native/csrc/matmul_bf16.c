/* bf16 activations x Q4/Q8 blocks on AVX512-BF16 dot products (ACT_BF16 where AMX tiles
 * are not granted or the step is under RLM_AMX_MIN_ROWS tokens). */
#include "rlm.h"

#ifdef RLM_BF16
/* The 16 horizontal sums of v[0..15], in order, as one vector: a butterfly of in-lane
 * unpacks/shuffles, then across the 128-bit lanes (~45 instructions where 16 separate
 * reductions took ~130, a quarter of a 4x4 bf16 tile's work at k = 576). */
static inline __m512 hsum4_lanes(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* per 128-bit lane q: [sum_q a, sum_q b, sum_q c, sum_q d] */
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
}

static inline __m512 hsum16(const __m512 *v) {
    __m512 r0 = hsum4_lanes(v[0], v[1], v[2], v[3]), r1 = hsum4_lanes(v[4], v[5], v[6], v[7]);
    __m512 r2 = hsum4_lanes(v[8], v[9], v[10], v[11]);
    __m512 r3 = hsum4_lanes(v[12], v[13], v[14], v[15]);
    __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(r0, r1, 0x44), _mm512_shuffle_f32x4(r0, r1, 0xEE));
    __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(r2, r3, 0x44), _mm512_shuffle_f32x4(r2, r3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, z, 0x88), _mm512_shuffle_f32x4(x, z, 0xDD));
}

/* 4 bf16 rows (row stride ldw) x nt <= 4 bf16 tokens (row stride ldx), 32 columns per dot
 * instruction: out[r * 4 + i] for i < nt. nt is a constant where it is inlined (see
 * dot_r4t_bf16): fewer tokens, fewer accumulators, no padding tokens multiplied. */
static inline __attribute__((always_inline)) void dot_r4tn_bf16(
    const uint16_t *wb, int64_t ldw, const uint16_t *x, int64_t ldx, int k, float *out,
    const int nt) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 32) {
        __m512bh xv[4];
        for (int i = 0; i < nt; i++) xv[i] = (__m512bh)_mm512_loadu_si512(x + i * ldx + j);
        for (int r = 0; r < 4; r++) {
            __m512bh wv = (__m512bh)_mm512_load_si512(wb + r * ldw + j);
            for (int i = 0; i < nt; i++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wv, xv[i]);
        }
    }
    _mm512_storeu_ps(out, hsum16(&acc[0][0]));
}

static void dot_r4t_bf16(const uint16_t *wb, int64_t ldw, const uint16_t *x, int64_t ldx,
                         int k, float *out, int nt) {
    switch (nt) {
    case 1: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 1); break;
    case 2: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 2); break;
    case 3: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 3); break;
    default: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 4);
    }
}

static inline float dot1_bf16(const uint16_t *wb, const uint16_t *x, int k) {
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_load_si512(wb + j),
                               (__m512bh)_mm512_loadu_si512(x + j));
    return _mm512_reduce_add_ps(acc);
}

/* ACT_BF16: 4 rows at a time dequantized (W = d q + m) and rounded to bf16 once, then every
 * token against them 4 at a time: twice the multiply-adds per instruction of the fp32 path,
 * for steps with enough tokens to be compute-bound. */
static void qgemv_rows_bf16(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                            int64_t ldy) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    uint16_t wb[4 * k] __attribute__((aligned(64)));
    for (int n = n0; n < n1; n += 4) {
        const int rows = n1 - n < 4 ? n1 - n : 4;
        for (int r = 0; r < rows; r++)
            dequant_row_bf16(w, w->qs + (int64_t)(n + r) * row_bytes,
                             wd_of(w, n + r, nb), wm_of(w, n + r, nb), nb,
                             wb + (int64_t)r * k);
        int t = 0;
        if (rows == 4)
            for (; t < T; t += 4) {
                float out[16];
                const int nt = T - t < 4 ? T - t : 4;
                dot_r4t_bf16(wb, k, a->xb + (int64_t)t * k, k, k, out, nt);
                for (int r = 0; r < 4; r++)
                    for (int i = 0; i < nt; i++) y[(int64_t)(t + i) * ldy + n + r] = out[r * 4 + i];
            }
        for (; t < T; t++)
            for (int r = 0; r < rows; r++)
                y[(int64_t)t * ldy + n + r] = dot1_bf16(wb + (int64_t)r * k,
                                                        a->xb + (int64_t)t * k, k);
    }
}
#endif
