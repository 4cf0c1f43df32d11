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
 * and dmin m: the products gguf-py's dequantize rounds): in registers on 512-bit builds,
 * shared by up to 8 tokens (4 rows side by side for 1-2 tokens); a row at a time into a
 * buffer on AVX2 and plain C. Each token's int8 activation blocks (quantize_row's plain
 * layout: dx, dx sum a per 32) run against it: per 32-block j, (d sc_j dx_j) sum q a -
 * (dmin m_j) (dx_j sum a); Q6_K's (q - 32) in integers, its two scales of a block one per
 * half of the lanes. A token's sums run in one order whatever the step's size, so its bits
 * do not depend on its neighbours. Dequantization (the fp32 / bf16 paths, embeddings)
 * rounds as gguf-py does, bit for bit: one product, then one difference, never fused. */
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

#ifdef RLM_AVX2
/* kq_scale_bytes in a vector: bytes 0-7 the scales, 8-15 the mins (reads 16 bytes at s12:
 * a super-block's quants follow its scales). */
static inline __m128i kq_scale_vec(const uint8_t *s12) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s12);       /* u0 u1 u2 . */
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f,
                                                     0x0f0f0f0f));
    const __m128i top = _mm_and_si128(_mm_slli_epi32(_mm_srli_epi32(b, 6), 4),
                                      _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(low, top);
}
#endif

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

/* Bytes of one super-block. */
static inline int kq_sb_bytes(int fmt) {
    return fmt == FMT_Q4_K ? 144 : (fmt == FMT_Q5_K ? 176 : 210);
}

/* Scales a row's unpacking holds per super-block (ds; dm has 8). */
static inline int kq_scales_per_sb(int fmt) { return fmt == FMT_Q6_K ? 16 : 8; }

/* A row (raw bytes wq) unpacked: q [k] bytes, ds [k / 256 * kq_scales_per_sb], dm [k / 32]. */
static void kq_unpack_row(const QMat *w, const uint8_t *wq, uint8_t *q, float *ds, float *dm) {
    const int nsb = w->k / 256, sb = kq_sb_bytes(w->fmt), ns = kq_scales_per_sb(w->fmt);
    for (int s = 0; s < nsb; s++)
        kq_unpack_sb(w->fmt, wq + (int64_t)s * sb, q + 256 * s, ds + ns * s, dm + 8 * s);
}

/* Row wq dequantized to fp32, rounded as gguf-py's dequantize: Q4_K / Q5_K (d sc) q, then
 * minus (dmin m); Q6_K (d sc) (q - 32). The product is kept apart from the difference
 * (gcc would otherwise fuse them into one multiply-add and round once). */
static void kq_dequant_row(const QMat *w, const uint8_t *wq, float *out) {
    const int k = w->k, ns = kq_scales_per_sb(w->fmt);
    uint8_t q[k] __attribute__((aligned(64)));
    float ds[k / 256 * 16 + 1], dm[k / 32 + 1];
    kq_unpack_row(w, wq, q, ds, dm);
    const int six = w->fmt == FMT_Q6_K;
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

/* ------------------------------------------------------------------ int8 activations */
/* One token's sum over a row unpacked (q, ds, dm) against its int8 blocks (x, xd, xs) where
 * the 512-bit kernels do not run (AVX2's rows past the repacked groups, plain C): in the
 * order every build's kernels share, so a token's bits are the same on every build. Per
 * super-block s and scale group (Q4_K / Q5_K: sub-block j of 32; Q6_K: group i of 16) the
 * exact integer sum (Q6_K: sum q a - 32 sum a), then lane L (8 (s % 2) + j; Q6_K: i) of 16
 * accumulators += sum (d sc dx) and m lane j of 8 += (dmin m_j) (dx_j sum a), one rounded
 * product and one fused multiply-add each; then kq_lanes_tree. */
static inline float kq_lanes_tree(const float *a, const float *m) {
    float s[4];
    for (int j = 0; j < 4; j++) s[j] = (a[4 * j] + a[4 * j + 2]) + (a[4 * j + 1] + a[4 * j + 3]);
    return ((s[0] + s[2]) + (s[1] + s[3])) - (((m[0] + m[2]) + (m[1] + m[3])) +
                                              ((m[4] + m[6]) + (m[5] + m[7])));
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

static inline float kq_dot(int fmt, int nsb, const uint8_t *q, const float *ds,
                           const float *dm, const int8_t *x, const float *xd,
                           const float *xs) {
    float acc[16] = {0}, accm[8] = {0};
    for (int s = 0; s < nsb; s++) {
        if (fmt == FMT_Q6_K) {
            for (int i = 0; i < 16; i++) {
                const int o = 256 * s + 16 * i;
                int sa = 0;
                for (int e = 0; e < 16; e++) sa += x[o + e];
                const float sv = ds[16 * s + i] * xd[8 * s + i / 2];
                acc[i] = fmaf((float)(kq_isum(q + o, x + o, 16) - 32 * sa), sv, acc[i]);
            }
            continue;
        }
        for (int j = 0; j < 8; j++) {
            const int o = 256 * s + 32 * j, b = 8 * s + j, L = 8 * (s & 1) + j;
            const float sv = ds[b] * xd[b];
            acc[L] = fmaf((float)kq_isum(q + o, x + o, 32), sv, acc[L]);
            accm[j] = fmaf(dm[b], xs[b], accm[j]);
        }
    }
    return kq_lanes_tree(acc, accm);
}

#ifdef RLM_I8_ZMM
/* ------------------------------------------------------------------ 512-bit, in registers
 * A super-block unpacked into registers and used by up to 8 tokens before the next: 4
 * vectors of 64 weights as bytes (in order), the scales d sc (8, or Q6_K's 16) and mins
 * dmin m (the values kq_unpack_sb makes). A token's products and sums run in one order
 * whatever the group and row counts. */
typedef struct {
    __m512i u[4];
    __m512 ds;  /* Q4_K / Q5_K: 8 scales in the low half; Q6_K: 16 */
    __m256 dm;
} KSB;

static inline __attribute__((always_inline)) void ksb_load(const int fmt, const uint8_t *p,
                                                           KSB *s) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (fmt == FMT_Q6_K) {
        const __m512i m2 = _mm512_set1_epi8(0x03);
        for (int h = 0; h < 2; h++) { /* weights 128 h .. 128 h + 127 */
            const __m512i l = _mm512_loadu_si512((const void *)(p + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h)));
            const __m512i b01 = _mm512_and_si512(
                _mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m2);
            const __m512i b23 = _mm512_and_si512(
                _mm512_srlv_epi64(qh, _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4)), m2);
            s->u[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(b01, 4));
            s->u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                              _mm512_slli_epi16(b23, 4));
        }
        const float d = H((f16)(p[208] | p[209] << 8));
        s->ds = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                     _mm_loadu_si128((const __m128i *)(p + 192)))));
        s->dm = _mm256_setzero_ps();
        return;
    }
    const __m128i b = kq_scale_vec(p + 4);
    const float d = H((f16)(p[0] | p[1] << 8)), dmin = H((f16)(p[2] | p[3] << 8));
    s->ds = _mm512_castps256_ps512(
        _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b))));
    s->dm = _mm256_mul_ps(_mm256_set1_ps(dmin),
                          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))));
    const int five = fmt == FMT_Q5_K;
    const uint8_t *qs = p + (five ? 48 : 16);
    const __m512i qh = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 16)))
                            : _mm512_setzero_si512();
    for (int a = 0; a < 2; a++) { /* sub-blocks 4a .. 4a + 3 */
        const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * a));
        __m512i lo = _mm512_and_si512(v, m4);                        /* [4a | 4a + 2] */
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);  /* [4a + 1 | 4a + 3] */
        if (five) {
            const __m512i one = _mm512_set1_epi8(1);
            const __m512i s0 = _mm512_set_epi64(4 * a + 2, 4 * a + 2, 4 * a + 2, 4 * a + 2,
                                                4 * a, 4 * a, 4 * a, 4 * a);
            const __m512i s1 = _mm512_add_epi64(s0, _mm512_set1_epi64(1));
            lo = _mm512_or_si512(lo, _mm512_slli_epi16(
                                         _mm512_and_si512(_mm512_srlv_epi64(qh, s0), one), 4));
            hi = _mm512_or_si512(hi, _mm512_slli_epi16(
                                         _mm512_and_si512(_mm512_srlv_epi64(qh, s1), one), 4));
        }
        s->u[2 * a] = _mm512_shuffle_i64x2(lo, hi, 0x44);     /* [4a | 4a + 1] */
        s->u[2 * a + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE); /* [4a + 2 | 4a + 3] */
    }
}

/* One token's products with super-block s into acc (and its m term into accm), each
 * scale's integers summed whole first (sums_round: exact), then scaled once: Q4_K / Q5_K's
 * 8 sub-blocks of 32 into lanes 8 (s % 2) .. + 7 (odd: the super-block's place in a pair),
 * Q6_K's 16 groups of 16 into lanes 0-15, (d sc) dx a lane, so a lane holds the blocks b
 * with b % 16 = lane in order: the order AMX int8 tiles reproduce (amx_i8.c).
 * Q6_K: c32[p] = 32 sum a over each lane's 4 activations of vector p (the token's alone:
 * made once for the rows that share it). */
static inline __attribute__((always_inline)) void ksb_token(
    const int fmt, const KSB *s, const int odd, const int8_t *x, const float *xd,
    const float *xs, const __m512i *c32, __m512 *acc, __m256 *accm) {
    __m512i d[4];
    for (int p = 0; p < 4; p++) {
        d[p] = dot_u8s8_512(s->u[p], _mm512_loadu_si512((const void *)(x + 64 * p)));
        if (fmt == FMT_Q6_K) d[p] = _mm512_sub_epi32(d[p], c32[p]);
    }
    if (fmt == FMT_Q6_K) { /* 4 groups of 4 partials a vector -> 16 groups */
        const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        const __m512 sv = _mm512_mul_ps(s->ds, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(
                                                                          _mm256_loadu_ps(xd))));
        sums_round(d, 4, 1);
        sums_round(d, 2, 2);
        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[0]), sv, *acc);
        return;
    }
    /* 2 sub-blocks of 8 partials a vector -> 8 sums, in both halves (the last round pairs
     * the vector with itself) */
    const __m256 sv8 = _mm256_mul_ps(_mm512_castps512_ps256(s->ds), _mm256_loadu_ps(xd));
    *accm = _mm256_fmadd_ps(s->dm, _mm256_loadu_ps(xs), *accm);
    sums_round(d, 4, 0);
    sums_round(d, 2, 1);
    d[1] = d[0];
    sums_round(d, 2, 2);
    const __m512 sv = _mm512_insertf32x8(_mm512_castps256_ps512(sv8), sv8, 1);
    *acc = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(d[0]), sv, *acc,
                                 odd ? (__mmask16)0xff00 : (__mmask16)0x00ff);
}

/* A row's 16 lane sums and 8 m-term sums (acc lanes 16, accm lanes 8) in one fixed tree:
 * S_j = (a_4j + a_4j+2) + (a_4j+1 + a_4j+3), (S_0 + S_2) + (S_1 + S_3); minus ((m_0 +
 * m_2) + (m_1 + m_3)) + ((m_4 + m_6) + (m_5 + m_7)). amx_i8.c sums its lanes alike. */
static inline float kq_lanes_sum(__m512 acc, __m256 accm) {
    float a[16], m[8], s[4];
    _mm512_storeu_ps(a, acc);
    _mm256_storeu_ps(m, accm);
    for (int j = 0; j < 4; j++) s[j] = (a[4 * j] + a[4 * j + 2]) + (a[4 * j + 1] + a[4 * j + 3]);
    return ((s[0] + s[2]) + (s[1] + s[3])) - (((m[0] + m[2]) + (m[1] + m[3])) +
                                              ((m[4] + m[6]) + (m[5] + m[7])));
}

/* G tokens (from token t) against R rows (from row n, raw bytes of row r at row + r rb):
 * y[(t + i) ldy + n + r]. The rows' super-blocks are read side by side (R streams from
 * memory: one kept the core's reads too few to fill DRAM's latency). */
static inline __attribute__((always_inline)) void kq_rows_group(
    const int fmt, const uint8_t *row, int64_t rb, const int R, int nsb, const Act *a, int t,
    const int G, int k, float *y, int64_t ldy, int n) {
    const int nb = k / 32, sb = kq_sb_bytes(fmt);
    __m512 acc[8];
    __m256 accm[8];
    for (int i = 0; i < R * G; i++) {
        acc[i] = _mm512_setzero_ps();
        accm[i] = _mm256_setzero_ps();
    }
    for (int s = 0; s < nsb; s++) {
        __m512i c32[fmt == FMT_Q6_K ? 4 * G : 1];
        for (int i = 0; fmt == FMT_Q6_K && i < G; i++)
            for (int p = 0; p < 4; p++)
                c32[4 * i + p] = dot_u8s8_512(_mm512_set1_epi8(32), _mm512_loadu_si512(
                    (const void *)(a->xa + (int64_t)(t + i) * k + 256 * s + 64 * p)));
        for (int r = 0; r < R; r++) {
            KSB b;
            ksb_load(fmt, row + r * rb + (int64_t)s * sb, &b);
            for (int i = 0; i < G; i++) {
                const int64_t ti = t + i;
                ksb_token(fmt, &b, s & 1, a->xa + ti * k + 256 * s, a->xd + ti * nb + 8 * s,
                          a->xs + ti * nb + 8 * s, c32 + 4 * i, &acc[r * G + i],
                          &accm[r * G + i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < G; i++)
            y[(int64_t)(t + i) * ldy + n + r] = kq_lanes_sum(acc[r * G + i], accm[r * G + i]);
}

static void kq_rows_fmt(const int fmt, const QMat *w, int n0, int n1, int T, const Act *a,
                        float *y, int64_t ldy) {
    const int k = w->k, nsb = k / 256;
    const int64_t rb = row_bytes_of(w);
    for (int t0 = 0; t0 < T; t0 += 64) { /* a tile of tokens' activations stays in L2 */
        const int t1 = T - t0 < 64 ? T : t0 + 64;
        for (int n = n0; n < n1;) {
            /* 4 rows side by side for 1-2 tokens; one row for groups of more */
            const int R = t1 - t0 <= 2 && n + 4 <= n1 ? 4 : 1;
            const uint8_t *row = w->qs + (int64_t)n * rb;
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 7) / 8, g = (left + groups - 1) / groups;
                switch (R * 16 + g) {
#define RLM_G(R, G) case R * 16 + G: kq_rows_group(fmt, row, rb, R, nsb, a, t, G, k, y, ldy, n); break;
                RLM_G(4, 1) RLM_G(4, 2)
                RLM_G(1, 1) RLM_G(1, 2) RLM_G(1, 3) RLM_G(1, 4) RLM_G(1, 5) RLM_G(1, 6)
                RLM_G(1, 7) RLM_G(1, 8)
#undef RLM_G
                }
                t += g;
            }
            n += R;
        }
    }
}

/* y[t, n] (row stride ldy) for K-quant rows n in [n0, n1), all T tokens, int8 blocks. */
static void kq_rows_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                       int64_t ldy) {
    if (w->qx) { /* whole repacked groups of 16 rows there, the rest from the file's */
        const int g0 = (n0 + 15) / 16, g1 = n1 / 16 < w->n / 16 ? n1 / 16 : w->n / 16;
        if (g0 < g1) {
            if (n0 < 16 * g0) kq_rows_i8(&(QMat){w->fmt, w->n, w->k, w->qs, NULL, NULL, NULL},
                                         n0, 16 * g0, T, a, y, ldy);
            kx_rows(w, g0, g1, T, a, y, ldy);
            if (16 * g1 < n1) kq_rows_i8(&(QMat){w->fmt, w->n, w->k, w->qs, NULL, NULL, NULL},
                                         16 * g1, n1, T, a, y, ldy);
            return;
        }
    }
    switch (w->fmt) {
    case FMT_Q4_K: kq_rows_fmt(FMT_Q4_K, w, n0, n1, T, a, y, ldy); break;
    case FMT_Q5_K: kq_rows_fmt(FMT_Q5_K, w, n0, n1, T, a, y, ldy); break;
    default: kq_rows_fmt(FMT_Q6_K, w, n0, n1, T, a, y, ldy);
    }
}
#else
/* Tokens a row's unpacking serves before the next row's: their activations stay in L2. */
#define KQ_TILE 32

/* y[t, n] (row stride ldy) for K-quant rows n in [n0, n1), all T tokens, int8 blocks. */
static void kq_rows_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                       int64_t ldy) {
#ifdef RLM_AVX2
    if (w->qx) { /* whole repacked groups of 16 rows there, the rest from the file's */
        const int g0 = (n0 + 15) / 16, g1 = n1 / 16 < w->n / 16 ? n1 / 16 : w->n / 16;
        if (g0 < g1) {
            if (n0 < 16 * g0) kq_rows_i8(&(QMat){w->fmt, w->n, w->k, w->qs, NULL, NULL, NULL},
                                         n0, 16 * g0, T, a, y, ldy);
            kx_rows(w, g0, g1, T, a, y, ldy);
            if (16 * g1 < n1) kq_rows_i8(&(QMat){w->fmt, w->n, w->k, w->qs, NULL, NULL, NULL},
                                         16 * g1, n1, T, a, y, ldy);
            return;
        }
    }
#endif
    const int k = w->k, nb = k / 32, nsb = k / 256;
    const int64_t row_bytes = row_bytes_of(w);
    uint8_t q[k] __attribute__((aligned(64)));
    float ds[nsb * 16], dm[nb];
    for (int t0 = 0; t0 < T; t0 += KQ_TILE) {
        const int t1 = T - t0 < KQ_TILE ? T : t0 + KQ_TILE;
        for (int n = n0; n < n1; n++) {
            prefetch_rows(w, n + 2, 1, n1);
            kq_unpack_row(w, w->qs + (int64_t)n * row_bytes, q, ds, dm);
            for (int t = t0; t < t1; t++)
                y[(int64_t)t * ldy + n] = kq_dot(w->fmt, nsb, q, ds, dm, a->xa + (int64_t)t * k,
                                                 a->xd + (int64_t)t * nb, a->xs + (int64_t)t * nb);
        }
    }
}
#endif
