/* The quantized matmul's entry: qgemv_rows picks the path of the prepared activations
 * (AMX tiles, bf16 dot products, fp32, or int8 blocks: matmul_i8.c on 512-bit vectors, the
 * AVX2 and plain C ones here), and gemv splits a matrix's rows over the team. */
#include "rlm.h"

/* Q4's m term of a token: sum_b m_b (dx_b sum_j a_j), two blocks at a time. */
static inline float q4_msum(const f16 *wm, const float *xs, int nb) {
    float msum = 0.f;
    int b = 0;
    for (; b + 2 <= nb; b += 2) msum += H(wm[b]) * xs[b] + H(wm[b + 1]) * xs[b + 1];
    for (; b < nb; b++) msum += H(wm[b]) * xs[b];
    return msum;
}

/* One row of a Q4/Q8 matrix against one quantized activation row. */
static inline float qdot_row1(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                              const int8_t *xa, const float *xd, const float *xs, int nb) {
#ifdef RLM_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        acc0 = blk_fma(blk_dot(w, wq, xa, b), H(wd[b]) * xd[b], acc0);
        acc1 = blk_fma(blk_dot(w, wq, xa, b + 1), H(wd[b + 1]) * xd[b + 1], acc1);
    }
    if (b < nb) acc0 = blk_fma(blk_dot(w, wq, xa, b), H(wd[b]) * xd[b], acc0);
    const float msum = wm ? q4_msum(wm, xs, nb) : 0.f;
    return hsum256(_mm256_add_ps(acc0, acc1)) + msum;
#else
    float acc = 0.f;
    for (int b = 0; b < nb; b++) {
        int isum = 0;
        if (w->fmt == FMT_Q4) {
            for (int j = 0; j < 16; j++) {
                isum += (wq[b * 16 + j] & 0x0f) * xa[b * 32 + j];
                isum += (wq[b * 16 + j] >> 4) * xa[b * 32 + j + 16];
            }
            acc += H(wd[b]) * xd[b] * (float)isum + H(wm[b]) * xs[b];
        } else {
            for (int j = 0; j < 32; j++) isum += (int8_t)wq[b * 32 + j] * xa[b * 32 + j];
            acc += H(wd[b]) * xd[b] * (float)isum;
        }
    }
    return acc;
#endif
}

/* y[t, n] (row stride ldy) for n in [n0, n1), all T tokens. */
static void qgemv_rows(const QMat *w, int n0, int n1, int T, const Act *act, float *y,
                       int64_t ldy) {
#ifdef RLM_AMX
    if (act->amx == 2) {
        qgemm_amx_large(w, n0, n1, T, act, y, ldy);
        return;
    }
    if (act->amx) {
        qgemv_rows_amx(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
#ifdef RLM_BF16
    if (act->xb) {
        qgemv_rows_bf16(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
    if (act->f32 || is_dense(w)) { /* (int8 blocks of activations are for block weights) */
        qgemv_rows_f32(w, n0, n1, T, act, y, ldy);
        return;
    }
#ifdef RLM_AMX_I8
    if (act->xq && act->xq_k == is_kquant(w)) { /* (dense rows never take int8 blocks) */
        qgemm_amx_i8(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
    if (is_kquant(w)) {
        kq_rows_i8(w, n0, n1, T, act, y, ldy);
        return;
    }
#ifdef RLM_KX32
    if (w->qx) { /* Q8 / Q4 rows repacked (their only copy) */
        kx32_rows(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
#ifdef RLM_I8_ZMM
    qgemv_rows_i8zmm(w, n0, n1, T, act, y, ldy);
    return;
#elif defined(RLM_AVX2)
    if (w->fmt == FMT_Q4) {
        qgemv_rows_q4_avx2(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    const int8_t *xa = act->xa;
    const float *xd = act->xd, *xs = act->xs;
#ifdef RLM_AVX2
    uint8_t ubuf[k] __attribute__((aligned(64)));
#endif
    for (int n = n0; n < n1; n++) {
        const f16 *wd = w->d + (int64_t)n * nb;
        const f16 *wm = w->fmt == FMT_Q4 ? w->m + (int64_t)n * nb : NULL;
        const uint8_t *wq = w->qs + (int64_t)n * row_bytes;
#ifdef RLM_AVX2
        if (T < 4) {
            for (int t = 0; t < T; t++)
                y[(int64_t)t * ldy + n] = qdot_row1(w, wq, wd, wm, xa + (int64_t)t * k,
                                                    xd + (int64_t)t * nb, xs + (int64_t)t * nb,
                                                    nb);
            continue;
        }
        /* Q8 (Q4 rows run qgemv_rows_q4_avx2): |w| once, reused for every token */
        for (int b = 0; b < nb; b++)
            _mm256_store_si256((__m256i *)(ubuf + b * 32),
                               _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(wq + b * 32))));
        int t = 0;
        for (; t + 4 <= T; t += 4) { /* 4 tokens against the unpacked row, as qdot_row1 */
            __m256 ae[4], ao[4];
            for (int i = 0; i < 4; i++) ae[i] = ao[i] = _mm256_setzero_ps();
            const int8_t *a0 = xa + (int64_t)t * k;
            const float *d0 = xd + (int64_t)t * nb;
#define RLM_BLOCK(b, acc)                                                                    \
    {                                                                                       \
        const __m256i u = _mm256_load_si256((const __m256i *)(ubuf + (b) * 32));            \
        const __m256i sg = _mm256_loadu_si256((const __m256i *)(wq + (b) * 32));            \
        for (int i = 0; i < 4; i++) {                                                       \
            const __m256i x = _mm256_sign_epi8(                                             \
                _mm256_loadu_si256((const __m256i *)(a0 + (int64_t)i * k + (b) * 32)), sg); \
            acc[i] = blk_fma(dot_u8s8(u, x), H(wd[b]) * d0[i * nb + (b)], acc[i]);          \
        }                                                                                   \
    }
            int b = 0;
            for (; b + 2 <= nb; b += 2) {
                RLM_BLOCK(b, ae)
                RLM_BLOCK(b + 1, ao)
            }
            if (b < nb) RLM_BLOCK(b, ae)
#undef RLM_BLOCK
            for (int i = 0; i < 4; i++)
                y[(int64_t)(t + i) * ldy + n] = hsum256(_mm256_add_ps(ae[i], ao[i]));
        }
        for (; t < T; t++)
            y[(int64_t)t * ldy + n] = qdot_row1(w, wq, wd, wm, xa + (int64_t)t * k,
                                                xd + (int64_t)t * nb, xs + (int64_t)t * nb, nb);
#else
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ldy + n] = qdot_row1(w, wq, wd, wm, xa + (int64_t)t * k,
                                                xd + (int64_t)t * nb, xs + (int64_t)t * nb, nb);
#endif
    }
}

/* Split [0, n) into nthreads contiguous chunks (multiples of 16 rows: whole groups of
 * repacked Q4_K rows, see kquants.c). */
static inline void chunk(int n, int tid, int nth, int *lo, int *hi) {
    int per = ((n + nth - 1) / nth + 15) & ~15;
    *lo = tid * per < n ? tid * per : n;
    *hi = (tid + 1) * per < n ? (tid + 1) * per : n;
}

/* Rows of m for thread tid of nth: y [T, m->n]. */
static void gemv(const QMat *m, int T, const Act *a, float *y, int tid, int nth) {
    int lo, hi;
    chunk(m->n, tid, nth, &lo, &hi);
    qgemv_rows(m, lo, hi, T, a, y, m->n);
}

/* Rows of the concatenation c for thread tid of nth: y [T, cat_rows(c)], part i's rows
 * after those of the parts before it. */
static void gemv_cat(const QCat *c, int T, const Act *a, float *y, int tid, int nth) {
    const int n = (int)cat_rows(c);
    int lo, hi, off = 0;
    chunk(n, tid, nth, &lo, &hi);
    for (int i = 0; i < c->count; i++) {
        const QMat *m = &c->part[i];
        const int a0 = lo > off ? lo - off : 0, a1 = hi - off < m->n ? hi - off : m->n;
        if (a0 < a1) qgemv_rows(m, a0, a1, T, a, y + off, n);
        off += m->n;
    }
}
