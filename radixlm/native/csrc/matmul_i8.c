/* The int8-block matmul's kernels: the block dot products the AVX2 paths share, and the
 * 512-bit path (qgemv_rows_i8zmm); qgemv_rows in matmul.c picks them. */
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

#ifdef RLM_I8_ZMM
/* 512-bit int8 blocks. A row's full chunks of 16 blocks are read transposed: step s of a
 * chunk holds elements 4s .. 4s + 3 of all 16 blocks, one block a 32-bit lane (the order of
 * chunk_block), so 8 u8 x s8 dot instructions leave each block's whole integer sum in its
 * own lane, and a token pays one conversion and one multiply-add per chunk for the scales.
 * The activations come laid out to match (interleave_act); the transposition of the weights
 * is done once per row and shared by the step's tokens. Q4 rows only: a Q8 chunk's 16 x 8
 * transpose is 24 shuffles, more than it saves at one token, so Q8 rows, and a last
 * partial chunk (k % 512), are read as pairs of blocks, one 256-bit half each; a Q8 pair's
 * 16 partial sums are then added up to whole blocks (pair_sums16), so each block is scaled
 * once, as the AMX int8 tiles compute it (amx_i8.c). */

/* u8 x s8 products, 4 to a 32-bit lane, added to acc */
static inline __m512i dot_acc_512(__m512i acc, __m512i u, __m512i s) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
                                                    _mm512_set1_epi16(1)));
#endif
}

/* 16 int32 partial sums of u8 x s8 over 64 bytes */
static inline __m512i dot_u8s8_512(__m512i u, __m512i s) {
    return dot_acc_512(_mm512_setzero_si512(), u, s);
}

/* Blocks b, b + 1 of a Q4 row as 64 unsigned bytes, the nibbles: [q_b, q_b, q_b+1,
 * q_b+1], odd 128-bit lanes shifted by 4 (lone: block b alone, b + 1's half zeros). */
static inline __m512i pair_u8(const uint8_t *wq, int b, int lone) {
    __m512i v = _mm512_castsi256_si512(
        _mm256_maskz_loadu_epi8(lone ? 0xffffu : ~0u, (const void *)(wq + b * 16)));
    v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0));
    v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

/* Four 4 x 4 transposes of 32-bit elements, one per 128-bit lane, across r[0..3]. */
static inline void transpose4(const __m512i r[4], __m512i *out) {
    const __m512i a0 = _mm512_unpacklo_epi32(r[0], r[1]), a1 = _mm512_unpackhi_epi32(r[0], r[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(r[2], r[3]), a3 = _mm512_unpackhi_epi32(r[2], r[3]);
    out[0] = _mm512_unpacklo_epi64(a0, a2);
    out[1] = _mm512_unpackhi_epi64(a0, a2);
    out[2] = _mm512_unpacklo_epi64(a1, a3);
    out[3] = _mm512_unpackhi_epi64(a1, a3);
}

/* The 8 steps of the full chunk at block c of a Q4 row: st[s] lane l = the nibbles of
 * elements 4s .. 4s + 3 of block c + chunk_block(l) as bytes. lo/hi[q] hold blocks 4q ..
 * 4q + 3 a 128-bit lane each, elements 0-15 / 16-31. */
static inline void chunk_steps(const uint8_t *wq, int c, __m512i st[8]) {
    __m512i lo[4], hi[4];
    for (int q = 0; q < 4; q++) {
        const __m512i v = _mm512_loadu_si512((const void *)(wq + c * 16 + q * 64));
        lo[q] = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
        hi[q] = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
    }
    transpose4(lo, st);
    transpose4(hi, st + 4);
}

#ifdef __AVX512VNNI__
/* Q8 on VNNI: the activations + 128 as unsigned bytes (xu, made once per matmul) against
 * the signed weights, 128 sum_j w_j taken off the sums (dpbusd does not saturate as
 * maddubs would): the same integers as the sign trick, one instruction less a token. */
#define RLM_Q8_BIAS 1
#endif
#define RLM_XU_BYTES 32768

/* G tokens' products with the full Q4 chunk at block c, scaled (wdl: H(d_b) in lane
 * order; the tokens' dx in lane order, see interleave_act) into acc: 4 tokens at a time
 * against the chunk's steps transposed once, d[i] lane l = block chunk_block(l)'s
 * sum_j q_j a_j for token i. */
static inline __attribute__((always_inline)) void chunk_fma(
    const uint8_t *wq, const int8_t *xa, const float *xd, int c, int nb, int k, int G,
    __m512 wdl, __m512 *acc) {
    __m512i st[8];
    chunk_steps(wq, c, st);
#pragma GCC unroll 2
    for (int i0 = 0; i0 < G; i0 += 4) {
        const int g = G - i0 < 4 ? G - i0 : 4;
        const int8_t *x = xa + (int64_t)i0 * k + c * 32;
        __m512i d[4];
        for (int i = 0; i < g; i++) d[i] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++)
            for (int i = 0; i < g; i++) {
                const __m512i xs = _mm512_loadu_si512((const void *)(x + (int64_t)i * k + s * 64));
#ifdef __AVX512VNNI__
                d[i] = _mm512_dpbusd_epi32(d[i], st[s], xs);
#else /* int16 sums over the 8 steps, as the AVX2 path (no saturation: see there) */
                d[i] = _mm512_add_epi16(d[i], _mm512_maddubs_epi16(st[s], xs));
#endif
            }
#ifndef __AVX512VNNI__
        for (int i = 0; i < g; i++) d[i] = _mm512_madd_epi16(d[i], _mm512_set1_epi16(1));
#endif
        for (int i = 0; i < g; i++)
            acc[i0 + i] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(d[i]),
                _mm512_mul_ps(wdl, _mm512_loadu_ps(xd + (int64_t)(i0 + i) * nb + c)),
                acc[i0 + i]);
    }
}

/* Integer sums of groups of partial sums, one round of a tree: v[q] = the lanes of v[2q]
 * and v[2q + 1] (q < n / 2) paired up and added, round r halving each group (round 0: 8
 * partials of 2 groups a vector -> 4 of 4; 1: 4 of 4 -> 2 of 8; 2: 2 of 8 -> 1 of 16), the
 * groups kept in order. Integer adds are exact, so the tree's shape does not matter. */
static inline __attribute__((always_inline)) void sums_round(__m512i *v, int n, int r) {
    static const int32_t ia[3][16] __attribute__((aligned(64))) = {
        {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
        {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
        {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}};
    static const int32_t ib[3][16] __attribute__((aligned(64))) = {
        {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31},
        {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31},
        {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}};
    const __m512i a = _mm512_load_si512(ia[r]), b = _mm512_load_si512(ib[r]);
    for (int q = 0; q < n / 2; q++)
        v[q] = _mm512_add_epi32(_mm512_permutex2var_epi32(v[2 * q], a, v[2 * q + 1]),
                                _mm512_permutex2var_epi32(v[2 * q], b, v[2 * q + 1]));
}

/* The 16 blocks' integer sums from the 8 pair vectors of a chunk's dot instructions (d[p]
 * lanes 0-7: block 2p's 8 partial sums, 8-15: block 2p + 1's), block l in lane l. */
static inline __m512i pair_sums16(const __m512i *d) {
    __m512i v[8];
    for (int p = 0; p < 8; p++) v[p] = d[p];
    sums_round(v, 8, 0);
    sums_round(v, 4, 1);
    sums_round(v, 2, 2);
    return v[0];
}

/* G tokens' products with the nc (< 16) blocks at block c of a Q4 row (its partial last
 * chunk, the activations as quantize_row wrote them): per pair of blocks one dot
 * instruction, then pair_sums16 to each block's exact integer sum (block c + l in lane l), times
 * H(d_b) dx_b, into acc (the m terms were added before); blocks past nb are zeros. */
static inline __attribute__((always_inline)) void q4_partial_fma(
    const uint8_t *wq, const int8_t *xa, const float *xd, int c, int nc, int nb, int k, int G,
    __m512 wdv, __m512 *acc) {
    const __mmask16 m = (__mmask16)((1u << nc) - 1);
    __m512i u[8];
    for (int p = 0; p < 8; p++) {
        const int left = nc - 2 * p;
        u[p] = left >= 2 ? pair_u8(wq, c + 2 * p, 0)
                         : left == 1 ? pair_u8(wq, c + 2 * p, 1) : _mm512_setzero_si512();
    }
    for (int i = 0; i < G; i++) {
        __m512i t[8];
        for (int p = 0; p < 8; p++) {
            const int left = nc - 2 * p;
            const __mmask64 xm = left >= 2 ? ~0ull : left == 1 ? 0xffffffffull : 0;
            t[p] = dot_u8s8_512(u[p], _mm512_maskz_loadu_epi8(
                                          xm, xa + i * (int64_t)k + (c + 2 * p) * 32));
        }
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_sums16(t)),
                                 _mm512_mul_ps(wdv, _mm512_maskz_loadu_ps(m, xd + (int64_t)i * nb + c)),
                                 acc[i]);
    }
}

/* Q8: G tokens' products with the nc blocks at block c: per pair of blocks one dot
 * instruction (Q8_BIAS: the activations + 128 against the signed weights, 128 sum_j w_j
 * taken off after the tree; else |w| against sign(x, w)), then pair_sums16 to each block's
 * exact integer sum in lane c + l - c, times H(d_b) dx_b, into acc: one rounding per block,
 * the order AMX int8 tiles reproduce (amx_i8.c). Blocks past nb are zeros. */
static inline __attribute__((always_inline)) void q8_chunk_fma(
    const uint8_t *wq, const int8_t *xa, const uint8_t *xu, const float *xd, int c, int nc,
    int nb, int k, int G, __m512 wdv, __m512 *acc) {
    const __mmask16 m = (__mmask16)((1u << nc) - 1);
    __m512i wv[8];
    for (int p = 0; p < 8; p++) {
        const int left = nc - 2 * p;
        const __mmask16 pm = left >= 2 ? 0xffff : left == 1 ? 0x00ff : 0;
        wv[p] = _mm512_maskz_loadu_epi32(pm, wq + (c + 2 * p) * 32);
    }
#ifdef RLM_Q8_BIAS
    __m512i base = _mm512_setzero_si512();
    if (xu) {
        __m512i t[8];
        for (int p = 0; p < 8; p++)
            t[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), wv[p]);
        base = pair_sums16(t);
    }
#endif
    for (int i = 0; i < G; i++) {
        __m512i t[8];
        for (int p = 0; p < 8; p++) {
            const int left = nc - 2 * p;
            const __mmask64 xm = left >= 2 ? ~0ull : left == 1 ? 0xffffffffull : 0;
            const int64_t at = i * (int64_t)k + (c + 2 * p) * 32;
#ifdef RLM_Q8_BIAS
            if (xu) {
                t[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                           _mm512_maskz_loadu_epi8(xm, xu + at), wv[p]);
                continue;
            }
#endif
            __m512i x = _mm512_maskz_loadu_epi8(xm, xa + at);
            x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(wv[p]), _mm512_setzero_si512(), x);
            t[p] = dot_u8s8_512(_mm512_abs_epi8(wv[p]), x);
        }
        __m512i s = pair_sums16(t);
#ifdef RLM_Q8_BIAS
        s = _mm512_sub_epi32(s, base);
#endif
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                 _mm512_mul_ps(wdv, _mm512_maskz_loadu_ps(m, xd + (int64_t)i * nb + c)),
                                 acc[i]);
    }
}

/* 16 Q8 blocks (512 bytes at p: a row's chunk, or a token's) as the 8 steps of a chunk in
 * lane order, as chunk_steps lays out Q4's: st[s] lane l = bytes 4s .. 4s + 3 of block
 * chunk_block(l). lo/hi[q]: blocks 4q .. 4q + 3 a 128-bit lane each, bytes 0-15 / 16-31. */
static inline void q8_chunk_steps(const uint8_t *p, __m512i st[8]) {
    __m512i lo[4], hi[4];
    for (int q = 0; q < 4; q++) {
        const __m512i a = _mm512_loadu_si512((const void *)(p + q * 128));
        const __m512i b = _mm512_loadu_si512((const void *)(p + q * 128 + 64));
        lo[q] = _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        hi[q] = _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    }
    transpose4(lo, st);
    transpose4(hi, st + 4);
}

/* A step's Q8 activations for q8_full_fma, made once per matmul: each full chunk of a
 * token's blocks as q8_chunk_steps (the partial last chunk as it is), + 128 as unsigned
 * bytes where RLM_Q8_BIAS takes them. */
static void q8_act_steps(const int8_t *xa, int64_t T, int k, uint8_t *xi) {
    const int nb = k / 32, full = nb / 16 * 16;
#ifdef RLM_Q8_BIAS
    const __m512i flip = _mm512_set1_epi8((char)0x80);
#else
    const __m512i flip = _mm512_setzero_si512();
#endif
    for (int64_t t = 0; t < T; t++) {
        const uint8_t *src = (const uint8_t *)xa + t * k;
        uint8_t *dst = xi + t * k;
        for (int c = 0; c < full; c += 16) {
            __m512i st[8];
            q8_chunk_steps(src + c * 32, st);
            for (int s = 0; s < 8; s++)
                _mm512_storeu_si512((void *)(dst + c * 32 + s * 64), _mm512_xor_si512(st[s], flip));
        }
        for (int j = full * 32; j < k; j += 32)
            _mm256_storeu_si256((__m256i *)(dst + j),
                                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src + j)),
                                                 _mm512_castsi512_si256(flip)));
    }
}

/* Q8: G tokens' products with the full chunk at block c, the row's chunk transposed once
 * (q8_chunk_steps) and shared by the tokens (xi: q8_act_steps' layout): 8 dot instructions
 * leave each block's exact integer sum in its lane (RLM_Q8_BIAS: the activations + 128
 * against the signed weights, 128 sum_j w_j taken off; else |w| against sign(x, w)),
 * scaled by H(d_b) dx_b in lane order (wdl, and the token's dx permuted alike). */
static inline __attribute__((always_inline)) void q8_full_fma(
    const uint8_t *wq, const uint8_t *xi, const float *xd, int c, int nb, int k, int G,
    __m512 wdl, __m512 *acc) {
    const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i st[8];
    q8_chunk_steps(wq + c * 32, st);
#ifdef RLM_Q8_BIAS
    __m512i base = _mm512_setzero_si512();
    for (int s = 0; s < 8; s++) base = _mm512_dpbusd_epi32(base, _mm512_set1_epi8((char)0x80), st[s]);
#else
    __mmask64 neg[8];
    for (int s = 0; s < 8; s++) {
        neg[s] = _mm512_movepi8_mask(st[s]);
        st[s] = _mm512_abs_epi8(st[s]);
    }
#endif
    for (int i = 0; i < G; i++) {
        const uint8_t *x = xi + i * (int64_t)k + c * 32;
        __m512i d = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            const __m512i xs = _mm512_loadu_si512((const void *)(x + s * 64));
#ifdef RLM_Q8_BIAS
            d = _mm512_dpbusd_epi32(d, xs, st[s]);
#else
            d = dot_acc_512(d, st[s], _mm512_mask_sub_epi8(xs, neg[s], _mm512_setzero_si512(), xs));
#endif
        }
#ifdef RLM_Q8_BIAS
        d = _mm512_sub_epi32(d, base);
#endif
        const __m512 xv = _mm512_permutexvar_ps(lanes, _mm512_loadu_ps(xd + (int64_t)i * nb + c));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(wdl, xv), acc[i]);
    }
}

/* G tokens (rows xa + i k of the step, G <= 8) against one weight row, each token's sums
 * in one fixed order whatever G is: per chunk of 16 blocks Q4's m term m_b (dx_b sum_j a_j)
 * a lane, then the blocks' products scaled by H(d_b) dx_b (a full Q4 chunk: one block a
 * lane; Q8: one block a lane, its exact integer sum (q8_chunk_fma); a Q4 row's partial last
 * chunk: pairs of blocks, a lone last block into the low half) into one accumulator, out[4
 * i] for token i (its lanes summed by sum4_rows). */
static inline __attribute__((always_inline)) void qdot_group(
    const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm, const int8_t *xa,
    const uint8_t *xu, const float *xd, const float *xs, int nb, int k, int G, __m512 *out) {
    const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 acc[8];
    for (int i = 0; i < G; i++) acc[i] = _mm512_setzero_ps();
    for (int c = 0; c < nb; c += 16) {
        const int nc = nb - c < 16 ? nb - c : 16;
        const __mmask16 m = (__mmask16)((1u << nc) - 1);
        if (wm) {
            const __m512 mv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, wm + c));
            for (int i = 0; i < G; i++)
                acc[i] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(m, xs + (int64_t)i * nb + c),
                                         acc[i]);
        }
        const __m512 wdv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, wd + c));
        if (nc == 16 && w->fmt == FMT_Q4) { /* xd of the chunk in lane order (interleave_act) */
            /* lane l of wdl: block chunk_block(l)'s scale */
            chunk_fma(wq, xa, xd, c, nb, k, G, _mm512_permutexvar_ps(lanes, wdv), acc);
            continue;
        }
        if (nc == 16 && w->fmt == FMT_Q8) {
            q8_full_fma(wq, xu, xd, c, nb, k, G, _mm512_permutexvar_ps(lanes, wdv), acc);
            continue;
        }
        if (w->fmt == FMT_Q8)
            q8_chunk_fma(wq, (const int8_t *)xu, xu, xd, c, nc, nb, k, G, wdv, acc);
        else
            q4_partial_fma(wq, xa, xd, c, nc, nb, k, G, wdv, acc);
    }
    for (int i = 0; i < G; i++) out[i * 4] = acc[i];
}

/* The lane sums of 4 rows' accumulators a[0..3] (one token), in one fixed tree whatever
 * the other rows hold: pairs of rows folded to 8 lanes each, then all four to 4 per
 * 128-bit lane, then the 128-bit lanes added. */
static inline __m128 sum4_rows(const __m512 *a) {
    const __m512 u01 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const __m512 u23 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    const __m512 v = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u01), _mm512_castps_pd(u23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u01), _mm512_castps_pd(u23))));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The int8 path of qgemv_rows on 512-bit vectors. */
static void qgemv_rows_i8zmm(const QMat *w, int n0, int n1, int T, const Act *act, float *y,
                             int64_t ldy) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    /* Q8: the step's activations as q8_act_steps lays them out (xu), on the stack or for a
     * big step on the heap */
    uint8_t xub[RLM_XU_BYTES] __attribute__((aligned(64)));
    uint8_t *xu = NULL, *heap = NULL;
    if (w->fmt == FMT_Q8) {
        xu = (int64_t)T * k <= RLM_XU_BYTES ? xub : (heap = (uint8_t *)malloc((size_t)T * k));
        if (!xu) abort(); /* no memory for one step's activations: nothing sensible left */
        q8_act_steps(act->xa, T, k, xu);
    }
    for (int n = n0; n < n1; n += 4) { /* 4 rows at a time, the tokens in groups of <= 8 */
        const int nr = n1 - n < 4 ? n1 - n : 4;
        prefetch_rows(w, n + 8, 4, n1);
        for (int t = 0; t < T;) {
            const int left = T - t, groups = (left + 7) / 8, g = (left + groups - 1) / groups;
            const int8_t *xa = act->xa + (int64_t)t * k;
            const float *xd = act->xd + (int64_t)t * nb, *xs = act->xs + (int64_t)t * nb;
            const uint8_t *xt = xu ? xu + (int64_t)t * k : NULL;
            __m512 part[8 * 4];
            for (int r = 0; r < 4; r++) {
                if (r >= nr) {
                    for (int i = 0; i < g; i++) part[i * 4 + r] = _mm512_setzero_ps();
                    continue;
                }
                const uint8_t *wq = w->qs + (int64_t)(n + r) * row_bytes;
                const f16 *wd = w->d + (int64_t)(n + r) * nb, *wm = wm_of(w, n + r, nb);
                switch (g) { /* one specialized body per group size */
#define RLM_G(G) \
                case G: qdot_group(w, wq, wd, wm, xa, xt, xd, xs, nb, k, G, part + r); break;
                RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4) RLM_G(5) RLM_G(6) RLM_G(7) RLM_G(8)
#undef RLM_G
                }
            }
            for (int i = 0; i < g; i++)
                _mm_mask_storeu_ps(y + (int64_t)(t + i) * ldy + n, (__mmask8)((1u << nr) - 1),
                                   sum4_rows(part + i * 4));
            t += g;
        }
    }
    free(heap);
}
#endif

#if defined(RLM_AVX2) && !defined(RLM_I8_ZMM)
/* AVX2 int8 blocks against Q4 rows: the 512-bit path's transposed chunks at 8 blocks, one a
 * 32-bit lane of a 256-bit vector, the row's chunks transposed once into a buffer the step's
 * tokens share. Without VNNI maddubs' u8 x s8 pairs are summed in int16 over a chunk's 8
 * steps (nibbles 0..15 times |a| <= 127: at most 8 x 2 x 15 x 127 = 30480, no saturation)
 * and widened once. Per token and row: per full chunk the m term's 8 lanes, then the
 * blocks' sums scaled by H(d_b) dx_b, into one accumulator; then the last partial chunk's
 * blocks one by one (and their m terms in a scalar); the accumulator's lanes summed, then
 * that scalar added: the same order at every step size. */

/* 8 fp16 values as floats */
static inline __m256 load8_f16(const f16 *p) {
#ifdef __F16C__
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = H(p[i]);
    return _mm256_loadu_ps(f);
#endif
}

/* Row wq's full chunks of 8 blocks transposed into u: chunk c's step s (32 bytes) at
 * u + c * 32 + s * 32, lane l = the nibbles of elements 4s .. 4s + 3 of block c +
 * chunk_block(l) as bytes. lo/hi[q]: blocks 2q, 2q + 1 a 128-bit lane each, elements 0-15
 * / 16-31; one 4 x 4 transpose of 32-bit elements per 128-bit lane. */
static inline void q4_row_steps(const uint8_t *wq, int nb, uint8_t *u) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    for (int c = 0; c + 8 <= nb; c += 8) {
        __m256i lo[4], hi[4];
        for (int q = 0; q < 4; q++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(wq + c * 16 + q * 32));
            lo[q] = _mm256_and_si256(v, mask);
            hi[q] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        }
        for (int h = 0; h < 2; h++) {
            const __m256i *r = h ? hi : lo;
            const __m256i a0 = _mm256_unpacklo_epi32(r[0], r[1]), a1 = _mm256_unpackhi_epi32(r[0], r[1]);
            const __m256i a2 = _mm256_unpacklo_epi32(r[2], r[3]), a3 = _mm256_unpackhi_epi32(r[2], r[3]);
            __m256i *out = (__m256i *)(u + c * 32 + h * 128);
            _mm256_store_si256(out, _mm256_unpacklo_epi64(a0, a2));
            _mm256_store_si256(out + 1, _mm256_unpackhi_epi64(a0, a2));
            _mm256_store_si256(out + 2, _mm256_unpacklo_epi64(a1, a3));
            _mm256_store_si256(out + 3, _mm256_unpackhi_epi64(a1, a3));
        }
    }
}

/* A chunk's 8 block sums sum_j q_j a_j, one a lane, from its steps u and the token's x. */
static inline __m256i q4_chunk_dot(const uint8_t *u, const int8_t *x) {
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
    __m256i d = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        const __m256i us = _mm256_load_si256((const __m256i *)(u + s * 32));
        const __m256i xs = _mm256_loadu_si256((const __m256i *)(x + s * 32));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        d = _mm256_dpbusd_epi32(d, us, xs);
#else
        d = _mm256_dpbusd_avx_epi32(d, us, xs);
#endif
    }
    return d;
#else
    __m256i h = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++)
        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(
                                    _mm256_load_si256((const __m256i *)(u + s * 32)),
                                    _mm256_loadu_si256((const __m256i *)(x + s * 32))));
    return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
#endif
}

/* y[t, n] for Q4 rows n in [n0, n1), all T tokens (activations as interleave_act). */
static void qgemv_rows_q4_avx2(const QMat *w, int n0, int n1, int T, const Act *act,
                               float *y, int64_t ldy) {
    const int k = w->k, nb = k / 32, full = nb / 8 * 8;
    const __m256i lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); /* chunk_block */
    uint8_t u[full * 32 + 32] __attribute__((aligned(32)));
    for (int n = n0; n < n1; n++) {
        if (((n - n0) & 3) == 0) prefetch_rows(w, n + 8, 4, n1);
        const uint8_t *wq = w->qs + (int64_t)n * (k / 2);
        const f16 *wd = w->d + (int64_t)n * nb, *wm = w->m + (int64_t)n * nb;
        q4_row_steps(wq, nb, u);
        for (int t = 0; t < T; t++) {
            const int8_t *x = act->xa + (int64_t)t * k;
            const float *xd = act->xd + (int64_t)t * nb, *xs = act->xs + (int64_t)t * nb;
            __m256 acc = _mm256_setzero_ps();
            for (int c = 0; c < full; c += 8) {
                acc = _mm256_fmadd_ps(load8_f16(wm + c), _mm256_loadu_ps(xs + c), acc);
                const __m256 s = _mm256_mul_ps(_mm256_permutevar8x32_ps(load8_f16(wd + c), lanes),
                                               _mm256_loadu_ps(xd + c));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_chunk_dot(u + c * 32, x + c * 32)),
                                      s, acc);
            }
            float msum = 0.f;
            for (int b = full; b < nb; b++) {
                acc = blk_fma(blk_dot(w, wq, x, b), H(wd[b]) * xd[b], acc);
                msum += H(wm[b]) * xs[b];
            }
            y[(int64_t)t * ldy + n] = hsum256(acc) + msum;
        }
    }
}
#endif
