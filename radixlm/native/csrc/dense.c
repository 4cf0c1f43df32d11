/* Dense weight rows (FMT_BF16, FMT_F32: a checkpoint run at its own precision) against
 * fp32 activations in steps of 1-3 tokens: each weight is read once and multiplied in fp32
 * (a bf16 weight widened exactly by a shift), one fused multiply-add per product, as a
 * torch fp32 linear computes (up to summation order). Steps of more tokens, bf16
 * activations and AMX tiles read dense rows through the dequantizers of blocks.c (a copy
 * or a conversion per row), so every path of the block formats runs them too. */
#include "rlm.h"

/* Row `row` (k values in w's dense format) as fp32 into out[k]. */
static void dense_row_f32(const QMat *w, const uint8_t *row, int k, float *out) {
    if (w->fmt == FMT_F32) {
        memcpy(out, row, sizeof(float) * (size_t)k);
        return;
    }
    const uint16_t *h = (const uint16_t *)row;
    for (int j = 0; j < k; j++) out[j] = bf16_to_f32(h[j]);
}

#ifdef AV_W
/* AV_W weights of a dense row from column j, as fp32. BF: bf16 rows (else fp32); a
 * constant where it is inlined. */
static inline __attribute__((always_inline)) avec dense_load(const int BF, const uint8_t *row,
                                                             int j) {
    if (!BF) return AV_LOADU((const float *)row + j);
    const uint16_t *h = (const uint16_t *)row + j;
#if AV_W == 16
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)), 16));
#else
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16));
#endif
}

/* Four rows (rb bytes apart) against NT (1-3) tokens (ldx floats apart): out[i * 4 + r].
 * The tokens' vectors are loaded once for the four rows and each row's once for the
 * tokens; BF and NT are constants where it is inlined. */
static inline __attribute__((always_inline)) void dense_x4(const int BF, const int NT,
                                                           const uint8_t *w, int64_t rb, int k,
                                                           const float *x, int64_t ldx,
                                                           float *out) {
    avec acc[4][3];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NT; i++) acc[r][i] = AV_ZERO();
    for (int j = 0; j < k; j += AV_W) {
        avec xv[3];
        for (int i = 0; i < NT; i++) xv[i] = AV_LOADU(x + i * ldx + j);
        for (int r = 0; r < 4; r++) {
            avec wv = dense_load(BF, w + r * rb, j);
            for (int i = 0; i < NT; i++) acc[r][i] = AV_FMA(wv, xv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NT; i++) out[i * 4 + r] = AV_SUM(acc[r][i]);
}

static void dense_x4_any(int bf, int nt, const uint8_t *w, int64_t rb, int k, const float *x,
                         int64_t ldx, float *out) {
    switch (bf * 4 + nt) {
    case 1: dense_x4(0, 1, w, rb, k, x, ldx, out); break;
    case 2: dense_x4(0, 2, w, rb, k, x, ldx, out); break;
    case 3: dense_x4(0, 3, w, rb, k, x, ldx, out); break;
    case 5: dense_x4(1, 1, w, rb, k, x, ldx, out); break;
    case 6: dense_x4(1, 2, w, rb, k, x, ldx, out); break;
    default: dense_x4(1, 3, w, rb, k, x, ldx, out); break;
    }
}

static float dense_dot1(int bf, const uint8_t *row, const float *x, int k) {
    avec acc = AV_ZERO();
    for (int j = 0; j < k; j += AV_W)
        acc = AV_FMA(bf ? dense_load(1, row, j) : dense_load(0, row, j), AV_LOADU(x + j), acc);
    return AV_SUM(acc);
}
#else
static float dense_dot1(int bf, const uint8_t *row, const float *x, int k) {
    float acc = 0.f;
    for (int j = 0; j < k; j++)
        acc += (bf ? bf16_to_f32(((const uint16_t *)row)[j]) : ((const float *)row)[j]) * x[j];
    return acc;
}
#endif

/* y[t, n] (row stride ldy) = sum_j W[n, j] x[t, j] for rows [n0, n1) and all T tokens of
 * x [T, k] (fp32 rows): four rows x up to three tokens at a time, then the rest one by
 * one. */
static void dense_rows_f32(const QMat *w, int n0, int n1, int T, const float *x, float *y,
                           int64_t ldy) {
    const int k = w->k, bf = w->fmt == FMT_BF16;
    const int64_t rb = row_bytes_of(w);
    int n = n0;
#ifdef AV_W
    for (; n + 4 <= n1; n += 4) {
        prefetch_rows(w, n + 8, 4, n1);
        for (int t = 0; t < T; t += 3) {
            const int nt = T - t < 3 ? T - t : 3;
            float out[12];
            dense_x4_any(bf, nt, w->qs + (int64_t)n * rb, rb, k, x + (int64_t)t * k, k, out);
            for (int i = 0; i < nt; i++)
                for (int r = 0; r < 4; r++) y[(int64_t)(t + i) * ldy + n + r] = out[i * 4 + r];
        }
    }
#endif
    for (; n < n1; n++)
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ldy + n] = dense_dot1(bf, w->qs + (int64_t)n * rb,
                                                 x + (int64_t)t * k, k);
}
