/* GGUF K-quants (Q4_K, Q5_K, Q6_K) read in their own super-blocks of 256 weights, as the
 * file has them (QMat.qs = the raw rows, d = m = NULL, k % 256 == 0):
 *   Q4_K (144 bytes): fp16 d, dmin; 12 bytes of 6-bit scales sc_j and mins m_j for the 8
 *        sub-blocks of 32; 128 bytes of nibbles (32 bytes per 64 weights: low nibbles the
 *        first 32, high the next).  W = (d sc_j) q - (dmin m_j), q in 0..15.
 *   Q5_K (176 bytes): Q4_K's fields and 32 bytes of fifth bits (bit j of byte e: weight e of
 *        sub-block j).  q in 0..31.
 *   Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one
 *        per 16 weights), fp16 d.  W = (d sc_i) (q - 32), q in 0..63.
 *
 * A super-block is unpacked into its weights as bytes q, in order, and fp32 scales (d sc
 * and dmin m: the products gguf-py's dequantize rounds) for dequantization (the fp32 / bf16
 * paths, embeddings), which rounds as gguf-py does, bit for bit: one product, then one
 * difference, never fused. The int8 path (below) takes a token's activations in blocks of
 * 256 and applies a super-block's integer scales in integers: kq_dot here a row at a time
 * (plain C, AVX2, rows past the repacked groups), kx.c's kernels 16 repacked rows at a
 * time, amx_i8.c's tiles; the same operations, so the same bits, on each. */
#include "rlm.h"

/* The 8 scales and 8 mins of a Q4_K / Q5_K super-block's 12 bytes, as bytes (llama.cpp's
 * get_scale_min_k4: sc_j, m_j = low 6 bits of bytes j, j + 4 for j < 4; else 4 bits of byte
 * j + 4 with the top 2 bits of bytes j - 4, j). */
static inline void kq_scale_bytes(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], o[4];
    memcpy(u, s12, 12);
    o[0] = u[0] & 0x3f3f3f3fu;
    o[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    o[2] = u[1] & 0x3f3f3f3fu;
    o[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    memcpy(sc, o, 8);
    memcpy(mn, o + 2, 8);
}

/* Super-block sb (raw bytes p) unpacked: q[256] its weights as bytes in order; ds its scales
 * d sc (8 per super-block; Q6_K: 16), dm (Q4_K / Q5_K) dmin m. */
static inline void kq_unpack_sb(int fmt, const uint8_t *p, uint8_t *q, float *ds, float *dm) {
    if (fmt == FMT_Q6_K) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = H((f16)(p[208] | p[209] << 8));
        for (int i = 0; i < 16; i++) ds[i] = d * (float)sc[i];
        for (int h = 0; h < 2; h++) {
#ifdef RLM_AVX2
            const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            __m256i *out = (__m256i *)(q + 128 * h);
            _mm256_store_si256(out, _mm256_or_si256(
                _mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4)));
            _mm256_store_si256(out + 1, _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4)));
            _mm256_store_si256(out + 2, _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4)));
            _mm256_store_si256(out + 3, _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4)));
#else
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 32; j++)
                    q[128 * h + 32 * t + j] =
                        (uint8_t)(((ql[64 * h + 32 * (t & 1) + j] >> (4 * (t >> 1))) & 0x0f) |
                                  (((qh[32 * h + j] >> (2 * t)) & 3) << 4));
#endif
        }
        return;
    }
    const float d = H((f16)(p[0] | p[1] << 8)), dmin = H((f16)(p[2] | p[3] << 8));
    uint8_t sc[8], mn[8];
    kq_scale_bytes(p + 4, sc, mn);
    for (int j = 0; j < 8; j++) {
        ds[j] = d * (float)sc[j];
        dm[j] = dmin * (float)mn[j];
    }
    const int five = fmt == FMT_Q5_K;
    const uint8_t *qs = p + (five ? 48 : 16), *qh = p + 16;
#ifdef RLM_AVX2
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i hb = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int g = 0; g < 4; g++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (five) {
            const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * g)), one);
            const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * g + 1)), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
        }
        _mm256_store_si256((__m256i *)(q + 64 * g), lo);
        _mm256_store_si256((__m256i *)(q + 64 * g + 32), hi);
    }
#else
    for (int g = 0; g < 4; g++)
        for (int e = 0; e < 32; e++) {
            const uint8_t v = qs[32 * g + e];
            q[64 * g + e] = (uint8_t)((v & 0x0f) | (five ? ((qh[e] >> (2 * g)) & 1) << 4 : 0));
            q[64 * g + 32 + e] =
                (uint8_t)((v >> 4) | (five ? ((qh[e] >> (2 * g + 1)) & 1) << 4 : 0));
        }
#endif
}

/* Bytes of one of the file's super-blocks (FMT_Q3_K: the Q3_K rows kx3.c repacks). */
static inline int kq_sb_bytes(int fmt) {
    return fmt == FMT_Q4_K ? 144 : fmt == FMT_Q5_K ? 176 : fmt == FMT_Q3_K ? 110 : 210;
}

/* Scales a row's unpacking holds per super-block (ds; dm has 8). */
static inline int kq_scales_per_sb(int fmt) { return kq_six(fmt) ? 16 : 8; }

/* A row (raw bytes wq) unpacked: q [k] bytes, ds [k / 256 * kq_scales_per_sb], dm [k / 32]. */
static void kq_unpack_row(const QMat *w, const uint8_t *wq, uint8_t *q, float *ds, float *dm) {
    const int nsb = w->k / 256, sb = kq_sb_bytes(w->fmt), ns = kq_scales_per_sb(w->fmt);
    for (int s = 0; s < nsb; s++)
        kq_unpack_sb(w->fmt, wq + (int64_t)s * sb, q + 256 * s, ds + ns * s, dm + 8 * s);
}

/* A row dequantized to fp32 from its unpacked bytes q and products ds, dm (kq_unpack_row's,
 * or kx_unpack_row's from repacked rows: the same values), rounded as gguf-py's dequantize:
 * Q4_K / Q5_K (d sc) q, then minus (dmin m); Q6_K (d sc) (q - 32). The product is kept
 * apart from the difference (gcc would otherwise fuse them into one multiply-add and round
 * once). */
static void kq_dequant_unpacked(const QMat *w, const uint8_t *q, const float *ds,
                                const float *dm, float *out) {
    const int k = w->k, ns = kq_scales_per_sb(w->fmt);
    const int six = kq_six(w->fmt);
    for (int j = 0; j < k; j += 16) { /* 16 weights share a scale in every format */
        const float s = ds[j / 256 * ns + (six ? j % 256 / 16 : j % 256 / 32)];
        const float m = six ? 0.f : dm[j / 32];
#ifdef RLM_AVX2
        for (int h = 0; h < 16; h += 8) {
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(q + j + h))));
            if (six) v = _mm256_sub_ps(v, _mm256_set1_ps(32.f)); /* exact: small integers */
            __m256 t = _mm256_mul_ps(_mm256_set1_ps(s), v);
            __asm__("" : "+x"(t)); /* keep the product rounded on its own */
            _mm256_storeu_ps(out + j + h, _mm256_sub_ps(t, _mm256_set1_ps(m)));
        }
#else
        for (int i = 0; i < 16; i++) {
            volatile float t = s * (float)((int)q[j + i] - (six ? 32 : 0));
            out[j + i] = t - m;
        }
#endif
    }
}

/* Row wq (the file's layout) dequantized so. */
static void kq_dequant_row(const QMat *w, const uint8_t *wq, float *out) {
    const int k = w->k;
    uint8_t q[k] __attribute__((aligned(64)));
    float ds[k / 256 * 16 + 1], dm[k / 32 + 1];
    kq_unpack_row(w, wq, q, ds, dm);
    kq_dequant_unpacked(w, q, ds, dm, out);
}

/* ------------------------------------------------------------------ int8 activations */
/* A K-quant row against a token's int8 activations in blocks of 256 (quantize_row_k: one
 * scale kd_s a super-block s, kb the sums of a by 16), llama.cpp's Q8_K scheme: the
 * sub-block scales apply in integers, so per super-block one exact integer and two float
 * operations:
 *   Q4_K / Q5_K: I_s = sum_j sc_j (sum q a)_j,  M_s = sum_j m_j (sum a)_j  (sub-blocks of 32)
 *                acc = fma(d kd_s, I_s, acc); acc = fma(-(dmin kd_s), M_s, acc)
 *   Q6_K:        I_s = sum_i sc_i ((sum q a)_i - 32 (sum a)_i)              (groups of 16)
 *                acc = fma(d kd_s, I_s, acc)
 * from acc = 0, super-blocks in order, each product (d kd_s) rounded on its own and I_s, M_s
 * converted to float once. Every kernel (plain C, AVX2, 512-bit, repacked rows, AMX tiles)
 * makes these operations for a row and a token, whatever the step's size: the same bits on
 * every path and build (tests/test_native_kquants.py). Bounds: |I_s| < 2^27 (Q5_K: 8 x 63 x
 * 32 x 31 x 127), |M_s| < 2^21. */

/* Row n's integer scales (file or repacked layout, as kq_rows_i8 reads it): sc[16 s + j] =
 * sc_j and sc[16 s + 8 + j] = m_j (Q4_K / Q5_K), sc[16 s + i] (Q6_K, signed); dd[2 s],
 * dd[2 s + 1] = d, dmin (Q6_K: d, 0). */
static void kq_row_scales(const QMat *w, int64_t n, int16_t *sc, float *dd) {
    const int nsb = w->k / 256, six = kq_six(w->fmt);
    if (w->qx && n < w->n / 16 * 16) {
        const int r = (int)(n % 16);
        const uint8_t *g = w->qx + n / 16 * nsb * kx_sb_bytes(w->fmt);
        for (int s = 0; s < nsb; s++) {
            const uint8_t *o = g + (int64_t)s * kx_sb_bytes(w->fmt);
            dd[2 * s] = H((f16)(o[2 * r] | o[2 * r + 1] << 8));
            dd[2 * s + 1] = six ? 0.f : H((f16)(o[32 + 2 * r] | o[33 + 2 * r] << 8));
            for (int i = 0; i < 16; i++)
                sc[16 * s + i] = six ? (int8_t)o[32 + 16 * i + r]
                                     : o[(i < 8 ? 64 : 192) + 16 * (i % 8) + r];
        }
        return;
    }
    const uint8_t *row = w->qs + n * row_bytes_of(w);
    for (int s = 0; s < nsb; s++) {
        const uint8_t *p = row + (int64_t)s * kq_sb_bytes(w->fmt);
        if (six) {
            dd[2 * s] = H((f16)(p[208] | p[209] << 8));
            dd[2 * s + 1] = 0.f;
            for (int i = 0; i < 16; i++) sc[16 * s + i] = (int8_t)p[192 + i];
            continue;
        }
        uint8_t b[8], m[8];
        kq_scale_bytes(p + 4, b, m);
        dd[2 * s] = H((f16)(p[0] | p[1] << 8));
        dd[2 * s + 1] = H((f16)(p[2] | p[3] << 8));
        for (int j = 0; j < 8; j++) {
            sc[16 * s + j] = b[j];
            sc[16 * s + 8 + j] = m[j];
        }
    }
}

/* sum_e q[e] x[e] over n bytes (n % 16 == 0; q unsigned < 64, x signed) */
static inline int kq_isum(const uint8_t *q, const int8_t *x, int n) {
#ifdef RLM_AVX2
    __m128i acc = _mm_setzero_si128();
    for (int e = 0; e < n; e += 16)
        acc = _mm_add_epi32(acc, _mm_madd_epi16(
            _mm_maddubs_epi16(_mm_loadu_si128((const __m128i *)(q + e)),
                              _mm_loadu_si128((const __m128i *)(x + e))), _mm_set1_epi16(1)));
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, _MM_SHUFFLE(1, 0, 3, 2)));
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(acc);
#else
    int sum = 0;
    for (int e = 0; e < n; e++) sum += q[e] * x[e];
    return sum;
#endif
}

/* One token (x, kd, kb) against a row unpacked (q, and kq_row_scales' sc, dd): the
 * operations above. */
static inline float kq_dot(int fmt, int nsb, const uint8_t *q, const int16_t *sc,
                           const float *dd, const int8_t *x, const float *kd,
                           const int16_t *kb) {
    float acc = 0.f;
    for (int s = 0; s < nsb; s++) {
        const uint8_t *qs = q + 256 * s;
        const int8_t *xs = x + 256 * s;
        const int16_t *c = sc + 16 * s, *b = kb + 16 * s;
        int isum = 0, msum = 0;
        if (kq_six(fmt)) {
            for (int i = 0; i < 16; i++)
                isum += c[i] * (kq_isum(qs + 16 * i, xs + 16 * i, 16) - 32 * b[i]);
        } else {
            for (int j = 0; j < 8; j++) {
                isum += c[j] * kq_isum(qs + 32 * j, xs + 32 * j, 32);
                msum += c[8 + j] * (b[2 * j] + b[2 * j + 1]);
            }
        }
        acc = fmaf(dd[2 * s] * kd[s], (float)isum, acc);
        if (!kq_six(fmt)) acc = fmaf(-(dd[2 * s + 1] * kd[s]), (float)msum, acc);
    }
    return acc;
}

/* Tokens a row's unpacking serves before the next row's: their activations stay in L2. */
#define KQ_TILE 32

/* y[t, n] (row stride ldy) for K-quant rows n in [n0, n1), all T tokens, int8 blocks of
 * 256 (a->ka): the repacked groups of 16 rows by kx_rows, the others (rows past the last
 * group, or a matrix read in the file's layout) a row at a time by kq_dot. */
static void kq_rows_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                       int64_t ldy) {
#ifdef RLM_AVX2
    if (w->qx) {
        const int g0 = (n0 + 15) / 16, g1 = n1 / 16 < w->n / 16 ? n1 / 16 : w->n / 16;
        if (g0 < g1) {
            if (n0 < 16 * g0) kq_rows_i8(w, n0, 16 * g0, T, a, y, ldy);
            kx_rows(w, g0, g1, T, a, y, ldy);
            if (16 * g1 < n1) kq_rows_i8(w, 16 * g1, n1, T, a, y, ldy);
            return;
        }
    }
#endif
    const int k = w->k, nsb = k / 256;
    uint8_t q[k] __attribute__((aligned(64)));
    float ds[nsb * 16], dm[k / 32], dd[2 * nsb];
    int16_t sc[16 * nsb];
    for (int t0 = 0; t0 < T; t0 += KQ_TILE) {
        const int t1 = T - t0 < KQ_TILE ? T : t0 + KQ_TILE;
        for (int n = n0; n < n1; n++) {
            if (w->qx && n < w->n / 16 * 16) kx_unpack_row(w, n, q, ds, dm);
            else {
                prefetch_rows(w, n + 2, 1, n1);
                kq_unpack_row(w, w->qs + (int64_t)n * row_bytes_of(w), q, ds, dm);
            }
            kq_row_scales(w, n, sc, dd);
            for (int t = t0; t < t1; t++)
                y[(int64_t)t * ldy + n] = kq_dot(w->fmt, nsb, q, sc, dd, a->ka + (int64_t)t * k,
                                                 a->kd + (int64_t)t * nsb,
                                                 a->kb + (int64_t)t * (k / 16));
        }
    }
}
