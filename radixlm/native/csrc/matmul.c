/* The quantized matmul's entry: qgemv_rows picks the path of the prepared activations
 * (AMX tiles, bf16 dot products, fp32, or int8 blocks, the last one here), and gemv
 * splits a matrix's rows over the team. */
#include "rlm.h"

/* ------------------------------------------------------------------ int8 blocks
 * A token's dot product with a row is computed in the same order at every step size (the
 * block products into two accumulators by block parity, then their sum, then Q4's m term
 * by q4_msum; on AVX-512 the order of qdot_group): the same bits whether the token runs
 * alone or among others, so a step that verifies drafts at one-token rounding reproduces
 * decoding exactly. */
#ifdef RLM_AVX2
/* Block b's 8 int32 partial sums of a row (Q4: the nibbles; Q8: |w| against sign(x, w)). */
static inline __m256i blk_dot(const QMat *w, const uint8_t *wq, const int8_t *xa, int b) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(xa + b * 32));
    if (w->fmt == FMT_Q4) return dot_u8s8(unpack_q4(wq + b * 16), x);
    const __m256i wv = _mm256_loadu_si256((const __m256i *)(wq + b * 32));
    return dot_u8s8(_mm256_abs_epi8(wv), _mm256_sign_epi8(x, wv));
}

static inline __m256 blk_fma(__m256i p, float scale, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc);
}
#endif

#if defined(RLM_AVX2) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RLM_I8_ZMM 1
/* 512-bit int8 blocks: blocks b and b + 1 in one vector (b's 8 partial sums in the low half,
 * b + 1's in the high half), so the low half accumulates exactly as the AVX2 path's even
 * blocks and the high half as its odd ones: the dot part is the AVX2 build's bits. */

/* 16 int32 partial sums of u8 x s8 over 64 bytes */
static inline __m512i dot_u8s8_512(__m512i u, __m512i s) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

/* Blocks b, b + 1 of a row as 64 unsigned bytes (Q4: the nibbles; Q8: |w|, with *neg the
 * mask of its negative weights). */
static inline __m512i pair_u8(const QMat *w, const uint8_t *wq, int b, __mmask64 *neg) {
    if (w->fmt == FMT_Q4) { /* [q_b, q_b, q_b+1, q_b+1], odd 128-bit lanes shifted by 4 */
        __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wq + b * 16)));
        v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0));
        v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
        return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    }
    const __m512i v = _mm512_loadu_si512((const void *)(wq + b * 32));
    *neg = _mm512_movepi8_mask(v);
    return _mm512_abs_epi8(v);
}

#ifdef __AVX512VNNI__
/* Q8 on VNNI: the activations + 128 as unsigned bytes (xu, made once per matmul) against
 * the signed weights, the products starting from -128 sum_j w_j (dpbusd does not saturate
 * as maddubs would): the same integers as the sign trick, one instruction less a token. */
#define RLM_Q8_BIAS 1
#define RLM_XU_BYTES 32768
static inline __m512i q8_pair_dot(const uint8_t *wq, int b, const uint8_t *xu, int64_t k,
                                  int G, __m512i *out) {
    const __m512i v = _mm512_loadu_si512((const void *)(wq + b * 32));
    const __m512i base = _mm512_sub_epi32(
        _mm512_setzero_si512(),
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), v));
    for (int i = 0; i < G; i++)
        out[i] = _mm512_dpbusd_epi32(
            base, _mm512_loadu_si512((const void *)(xu + i * k + b * 32)), v);
    return v;
}
#endif

/* Q4's m term of a chunk of up to 16 blocks, m_b (dx_b sum_j a_j) a lane, into acc. */
static inline __m512 q4_mterm(const f16 *wm, const float *xs, int c, __mmask16 m, __m512 acc) {
    const __m512 mv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, wm + c));
    return _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(m, xs + c), acc);
}

/* G tokens (rows xa + i k of the step, G <= 8) against one weight row, each token's sums
 * in one fixed order whatever G is: per 16-block chunk the scales H(d_b) dx_b, the m
 * term's lanes and then the pairs' products into one accumulator (a lone last block into
 * its low half); at the end its two halves, then their 8 lanes. */
static inline __attribute__((always_inline)) void qdot_group(
    const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm, const int8_t *xa,
    const uint8_t *xu, const float *xd, const float *xs, int nb, int k, int G, float *y,
    int64_t ldy) {
    __m512 acc[8];
    for (int i = 0; i < G; i++) acc[i] = _mm512_setzero_ps();
    for (int c = 0; c < nb; c += 16) {
        const int nc = nb - c < 16 ? nb - c : 16;
        const __mmask16 m = (__mmask16)((1u << nc) - 1);
        const __m512 wdv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, wd + c));
        __m512 sv[8];
        for (int i = 0; i < G; i++) {
            sv[i] = _mm512_mul_ps(wdv, _mm512_maskz_loadu_ps(m, xd + (int64_t)i * nb + c));
            if (wm) acc[i] = q4_mterm(wm, xs + (int64_t)i * nb, c, m, acc[i]);
        }
        __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        int p = 0;
        for (; p + 2 <= nc; p += 2) {
            const int b = c + p;
            __m512i d[8];
#ifdef RLM_Q8_BIAS
            if (xu)
                q8_pair_dot(wq, b, xu, k, G, d);
            else
#endif
            {
                __mmask64 neg = 0;
                const __m512i u = pair_u8(w, wq, b, &neg);
                for (int i = 0; i < G; i++) {
                    __m512i x = _mm512_loadu_si512((const void *)(xa + (int64_t)i * k + b * 32));
                    if (w->fmt == FMT_Q8) x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                    d[i] = dot_u8s8_512(u, x);
                }
            }
            for (int i = 0; i < G; i++) {
                const __m512 s = _mm512_permutexvar_ps(idx, sv[i]);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i]), s, acc[i]);
            }
            idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2));
        }
        if (p < nc)
            for (int i = 0; i < G; i++) {
                const __m256i d = blk_dot(w, wq, xa + (int64_t)i * k, c + p);
                const __m512 s = _mm512_permutexvar_ps(idx, sv[i]);
                acc[i] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(d)), s,
                                               acc[i], 0x00ff);
            }
    }
    for (int i = 0; i < G; i++) {
        y[(int64_t)i * ldy] = hsum256(_mm256_add_ps(_mm512_castps512_ps256(acc[i]),
                                                    _mm512_extractf32x8_ps(acc[i], 1)));
    }
}

/* All T tokens against row n, in groups of up to 8 (one specialized body per size). */
static void qdot_tokens(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                        const Act *act, const uint8_t *xu0, int nb, int k, int T, float *y,
                        int64_t ldy) {
    for (int t = 0; t < T;) {
        const int left = T - t, groups = (left + 7) / 8, g = (left + groups - 1) / groups;
        const int8_t *xa = act->xa + (int64_t)t * k;
        const float *xd = act->xd + (int64_t)t * nb, *xs = act->xs + (int64_t)t * nb;
        const uint8_t *xu = xu0 ? xu0 + (int64_t)t * k : NULL;
        float *yt = y + (int64_t)t * ldy;
        switch (g) {
#define RLM_G(n) \
        case n: qdot_group(w, wq, wd, wm, xa, xu, xd, xs, nb, k, n, yt, ldy); break;
        RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4) RLM_G(5) RLM_G(6) RLM_G(7) RLM_G(8)
#undef RLM_G
        }
        t += g;
    }
}
/* The int8 path of qgemv_rows on 512-bit vectors. */
static void qgemv_rows_i8zmm(const QMat *w, int n0, int n1, int T, const Act *act, float *y,
                             int64_t ldy) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    const uint8_t *xu = NULL;
#ifdef RLM_Q8_BIAS
    uint8_t xub[RLM_XU_BYTES] __attribute__((aligned(64)));
    if (w->fmt == FMT_Q8 && (int64_t)T * k <= RLM_XU_BYTES) { /* else the sign trick */
        for (int64_t j = 0; j < (int64_t)T * k; j += 32)
            _mm256_store_si256((__m256i *)(xub + j),
                               _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(act->xa + j)),
                                                _mm256_set1_epi8((char)0x80)));
        xu = xub;
    }
#endif
    for (int n = n0; n < n1; n++) {
        if (((n - n0) & 3) == 0) prefetch_rows(w, n + 8, 4, n1);
        qdot_tokens(w, w->qs + (int64_t)n * row_bytes, w->d + (int64_t)n * nb,
                    w->fmt == FMT_Q4 ? w->m + (int64_t)n * nb : NULL, act, xu, nb, k, T,
                    y + n, ldy);
    }
}
#endif

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
#ifdef RLM_I8_ZMM
    qgemv_rows_i8zmm(w, n0, n1, T, act, y, ldy);
    return;
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
        /* unpack the row once (Q4: nibbles -> bytes; Q8: |w|), reuse for every token */
        if (w->fmt == FMT_Q4) {
            for (int b = 0; b < nb; b++)
                _mm256_store_si256((__m256i *)(ubuf + b * 32), unpack_q4(wq + b * 16));
        } else {
            for (int b = 0; b < nb; b++)
                _mm256_store_si256((__m256i *)(ubuf + b * 32),
                                   _mm256_abs_epi8(_mm256_loadu_si256(
                                       (const __m256i *)(wq + b * 32))));
        }
        int t = 0;
        for (; t + 4 <= T; t += 4) { /* 4 tokens against the unpacked row, as qdot_row1 */
            __m256 ae[4], ao[4];
            for (int i = 0; i < 4; i++) ae[i] = ao[i] = _mm256_setzero_ps();
            const int8_t *a0 = xa + (int64_t)t * k;
            const float *d0 = xd + (int64_t)t * nb, *s0 = xs + (int64_t)t * nb;
#define RLM_BLOCK(b, acc)                                                                    \
    {                                                                                       \
        const __m256i u = _mm256_load_si256((const __m256i *)(ubuf + (b) * 32));            \
        const __m256i sg = w->fmt == FMT_Q8                                                 \
            ? _mm256_loadu_si256((const __m256i *)(wq + (b) * 32)) : u;                     \
        for (int i = 0; i < 4; i++) {                                                       \
            __m256i x = _mm256_loadu_si256((const __m256i *)(a0 + (int64_t)i * k + (b) * 32)); \
            if (w->fmt == FMT_Q8) x = _mm256_sign_epi8(x, sg);                              \
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
            for (int i = 0; i < 4; i++) {
                const float msum = wm ? q4_msum(wm, s0 + i * nb, nb) : 0.f;
                y[(int64_t)(t + i) * ldy + n] = hsum256(_mm256_add_ps(ae[i], ao[i])) + msum;
            }
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

/* Split [0, n) into nthreads contiguous chunks (multiples of 4 rows). */
static inline void chunk(int n, int tid, int nth, int *lo, int *hi) {
    int per = ((n + nth - 1) / nth + 3) & ~3;
    *lo = tid * per < n ? tid * per : n;
    *hi = (tid + 1) * per < n ? (tid + 1) * per : n;
}

/* Rows of m for thread tid of nth: y [T, m->n]. */
static void gemv(const QMat *m, int T, const Act *a, float *y, int tid, int nth) {
    int lo, hi;
    chunk(m->n, tid, nth, &lo, &hi);
    qgemv_rows(m, lo, hi, T, a, y, m->n);
}
