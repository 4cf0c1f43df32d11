/* GGUF K-quant rows repacked 16 side by side (QMat.qx) for the int8 kernels, and those
 * kernels: the 512-bit one (16 rows a vector) and the AVX2 one (8 rows a vector, a group's
 * two halves in turn). kquants.c's kq_rows_i8 sends the whole groups of a row range here.
 * Each row's products and sums are the same operations in the same order as kquants.c's
 * (bits equal: tests/test_native_kquants.py). */
#include "rlm.h"
/* ------------------------------------------------------------------ Q4_K, 16 rows side by side
 * QMat.qx: a Q4_K matrix's rows 0 .. n / 16 * 16 repacked in groups of 16 rows for the
 * int8 kernels (kx_rows: 16 rows a 512-bit vector, or 8 a 256-bit one); group g's
 * super-block s is KX_BYTES bytes at qx + (g nsb + s) KX_BYTES:
 *   d[16], dmin[16] fp16 (row r's, as the file has them); sc[8][16], mn[8][16] bytes (row
 *   r's 6-bit scale and min of sub-block j, kq_scale_bytes' values); then per sub-block j 4
 *   vectors of 64 bytes, vector v's byte 4 r + e = element 4 v + e of row r's sub-block j
 *   in its low nibble, element 16 + 4 v + e in its high.
 * One u8 x s8 dot instruction of a vector's nibbles against 4 activations broadcast adds up
 * 4 products of each of the 16 rows, a row a lane: a sub-block's integer sums after 8
 * instructions with no sums across lanes, and the scales of 16 rows are one vector. 2.8%
 * more bytes than the file's rows (the scales as bytes).
 * Q6_K alike, KX6_BYTES (the file's own size) a group's super-block: d[16] fp16, sc[16][16]
 * (row r's int8 scale of group i of 16 weights), then per group i 3 vectors: two of low
 * nibbles (vector v's byte 4 r + e: element 4 v + e of row r's group in its low nibble, 8 + 4 v
 * + e in its high) and one of high bits (byte 4 r + e, bits 2 t and 2 t + 1: element 4 t + e's
 * top two). */
#define KX_BYTES 2368
#define KX5_BYTES 2880 /* Q5_K: Q4_K's fields, a sub-block's 4 nibble vectors followed by
                          its 64 bytes of fifth bits (byte 4 r + e, bit t = element 4 t +
                          e's): one stream through memory (kx_sub_at, kx_fifth_at) */
#define KX6_BYTES 3360
#define KX3_BYTES 1824 /* FMT_Q3_K (kx3.c): kx6's d and sc, then 3-bit weights */
/* Where sub-block j's nibble vectors and (Q5_K) fifth bits start in a group's super-block. */
static inline int kx_sub_at(int five, int j) { return 320 + (five ? 320 : 256) * j; }
static inline int kx_fifth_at(int j) { return kx_sub_at(1, j) + 256; }
static inline int64_t kx_sb_bytes(int fmt) {
    return fmt == FMT_Q6_K ? KX6_BYTES : fmt == FMT_Q5_K ? KX5_BYTES
         : fmt == FMT_Q3_K ? KX3_BYTES : KX_BYTES;
}

#ifdef RLM_AVX2
/* A pass over a group's super-blocks for G tokens reads them from memory when it is the
 * group's first pass of a token tile (later passes find them in L1 / L2): that pass asks
 * for the bytes KX_AHEAD super-blocks ahead of those being read, a piece at a time as the
 * kernel goes (512 bits: a super-block's header at its start, then
 * each sub-block's vectors beside the sub-block being read; AVX2: half the super-block
 * before each 8-row half). G weights / s, one token, a DRAM-sized matrix
 * (bench_kquant_matmul's), Zen 5, alternating in one process: against no prefetch, one
 * thread Q6_K 27.9 -> 45.8, Q5_K 35.2 -> 56.9, Q4_K 59.0 -> 69.4, two threads Q6_K 54.5 ->
 * 89.7, Q4_K 80.0 -> 82.0; against a super-block's lines all asked for at its start, two
 * threads Q6_K 47.4 -> 54.1, Q5_K 58.3 -> 64.6, Q4_K 73.2 -> 74.4, and 4 tokens Q6_K 175 ->
 * 202. The AVX2 build on the same host (a stand-in for an AVX2 CPU), against none: one
 * thread Q4_K 51.0 -> 66.7, Q6_K 24.6 -> 46.5; two Q4_K 67.7 -> 83.3, Q6_K 44.3 -> 52.0; 4
 * tokens, two threads Q4_K 183 -> 228, Q6_K 99 -> 176. First passes of 5-8 tokens ask
 * ahead too, against passes of 4 tokens or fewer only, a 1B Q4_K_M step
 * (bench_decode_step, two alternating pairs): 8 tokens 47-51 -> 20 ms, 16 tokens 66-69 ->
 * 37-40, 64 tokens 163-167 -> 147-155; 1B Q3_K_M (kx3.c) 8 tokens 47 -> 21, Q8_0 (kx32.c)
 * 78 -> 33; the 135M's Q4_1 8 tokens 8.6 -> 5.5-6.6, 16 12.6 -> 9.8-10.2. Prefetches
 * change no result. */
#define KX_AHEAD 3
static inline __attribute__((always_inline)) void kx_ask_ahead(const uint8_t *p, int64_t sb,
                                                              int bytes) {
    prefetch_bytes(p + KX_AHEAD * sb, bytes);
}

/* A token's sums of a by 32 over a super-block (b: its 16 sums by 16) as int16, sub-blocks
 * (2 q, 2 q + 1) in dword q: the Q4_K / Q5_K m terms' other factor, in one vector for
 * every row's lane (|sum| <= 32 x 128: the pack is exact, the scalar pairs' bits). Against
 * the pairs added and packed in scalar code, a 1B Q4_K_M step of 64 tokens (512 bits, Zen
 * 5, five alternating pairs) 128-146 ms against 141-157 (one pair the same), a prompt of
 * 16-300 tokens 3-6% faster (two pairs); the AVX2 build under the caps the same. */
static inline __attribute__((always_inline)) __m128i kx_sum32_pairs(const int16_t *b) {
    const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)b),
                                          _mm256_set1_epi16(1));
    return _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
}

#endif

/* Q6_K group i of 16 weights e16 (one byte each) as the three dwords a row takes in the
 * repacked layout: bytes 0-3 elements e | 8 + e << 4, 4-7 4 + e | 12 + e << 4, 8-11 the top
 * bits of e, 4 + e, 8 + e, 12 + e two by two (dword 3: anything). */
#ifdef RLM_AVX2
static inline __m128i kx6_row_dwords(const uint8_t *e16) {
    const __m128i x = _mm_load_si128((const __m128i *)e16);
    const __m128i lo = _mm_and_si128(x, _mm_set1_epi8(15));
    const __m128i hb = _mm_srli_epi16(_mm_andnot_si128(_mm_set1_epi8(15), x), 4);
    const __m128i t = _mm_or_si128(lo, _mm_slli_epi16(_mm_srli_si128(lo, 8), 4));
    const __m128i u = _mm_or_si128(
        _mm_or_si128(hb, _mm_slli_epi16(_mm_srli_si128(hb, 4), 2)),
        _mm_or_si128(_mm_slli_epi16(_mm_srli_si128(hb, 8), 4),
                     _mm_slli_epi16(_mm_srli_si128(hb, 12), 6)));
    return _mm_unpacklo_epi64(t, u);
}
#endif

/* Q6_K rows src [16, nsb * 210] (row stride rb) as one repacked group at dst: dword k of
 * group i of row r at 288 + 192 i + 64 k + 4 r (4 rows' dwords transposed, 16-byte stores). */
static void kx6_repack_group(const uint8_t *src, int64_t rb, int nsb, uint8_t *dst) {
    uint8_t q[4][256] __attribute__((aligned(64)));
    float ds[16], dm[8];
    for (int s = 0; s < nsb; s++) {
        uint8_t *o = dst + (int64_t)s * KX6_BYTES;
        for (int r4 = 0; r4 < 16; r4 += 4) {
            for (int k = 0; k < 4; k++) {
                const int r = r4 + k;
                const uint8_t *p = src + r * rb + (int64_t)s * 210;
                kq_unpack_sb(FMT_Q6_K, p, q[k], ds, dm);
                memcpy(o + 2 * r, p + 208, 2);
                for (int i = 0; i < 16; i++) o[32 + 16 * i + r] = p[192 + i];
            }
            for (int i = 0; i < 16; i++) {
                uint8_t *v = o + 288 + 192 * i + 4 * r4;
#ifdef RLM_AVX2
                const __m128i t0 = kx6_row_dwords(q[0] + 16 * i), t1 = kx6_row_dwords(q[1] + 16 * i);
                const __m128i t2 = kx6_row_dwords(q[2] + 16 * i), t3 = kx6_row_dwords(q[3] + 16 * i);
                const __m128i a0 = _mm_unpacklo_epi32(t0, t1), a1 = _mm_unpacklo_epi32(t2, t3);
                const __m128i a2 = _mm_unpackhi_epi32(t0, t1), a3 = _mm_unpackhi_epi32(t2, t3);
                _mm_storeu_si128((__m128i *)v, _mm_unpacklo_epi64(a0, a1));
                _mm_storeu_si128((__m128i *)(v + 64), _mm_unpackhi_epi64(a0, a1));
                _mm_storeu_si128((__m128i *)(v + 128), _mm_unpacklo_epi64(a2, a3));
                continue;
#endif
                for (int k = 0; k < 4; k++) {
                    const uint8_t *e16 = q[k] + 16 * i;
                    for (int e = 0; e < 4; e++) {
                        v[4 * k + e] = (uint8_t)((e16[e] & 15) | (e16[8 + e] & 15) << 4);
                        v[64 + 4 * k + e] = (uint8_t)((e16[4 + e] & 15) | (e16[12 + e] & 15) << 4);
                        v[128 + 4 * k + e] = (uint8_t)((e16[e] >> 4) | (e16[4 + e] >> 4) << 2 |
                                                       (e16[8 + e] >> 4) << 4 |
                                                       (e16[12 + e] >> 4) << 6);
                    }
                }
            }
        }
    }
}

/* Q4_K (five = 0) or Q5_K rows src [16, nsb * 144 | 176] (row stride rb) as one repacked
 * group at dst. */
static void kx_repack_group(const uint8_t *src, int64_t rb, int nsb, uint8_t *dst, int five) {
    for (int s = 0; s < nsb; s++) {
        uint8_t *o = dst + (int64_t)s * (five ? KX5_BYTES : KX_BYTES);
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = src + r * rb + (int64_t)s * (five ? 176 : 144);
            for (int j = 0; five && j < 8; j++) { /* bit j of qh byte e: element e of j */
#if defined(RLM_AVX2) && defined(__BMI2__)
                /* the 32 elements' bits in a mask (bit el), then every 4th from e */
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
                const uint32_t m = (uint32_t)_mm256_movemask_epi8(
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << j))), 7 - j));
                for (int e = 0; e < 4; e++)
                    o[kx_fifth_at(j) + 4 * r + e] = (uint8_t)_pext_u32(m, 0x11111111u << e);
                continue;
#endif
                for (int e = 0; e < 4; e++) {
                    uint8_t b = 0;
                    for (int t = 0; t < 8; t++) b |= (uint8_t)(((p[16 + 4 * t + e] >> j) & 1) << t);
                    o[kx_fifth_at(j) + 4 * r + e] = b;
                }
            }
            uint8_t sc[8], mn[8];
            memcpy(o + 2 * r, p, 2);
            memcpy(o + 32 + 2 * r, p + 2, 2);
            kq_scale_bytes(p + 4, sc, mn);
            for (int j = 0; j < 8; j++) {
                o[64 + 16 * j + r] = sc[j];
                o[192 + 16 * j + r] = mn[j];
            }
        }
        /* sub-block j's 16 bytes a row: element e's nibble low, 16 + e's high; dword e of
         * row r at kx_sub_at(j) + 64 e + 4 r */
        for (int j = 0; j < 8; j++) {
            const int qo = (five ? 48 : 16) + 32 * (j / 2), sh = 4 * (j & 1);
            uint8_t *v = o + kx_sub_at(five, j);
#ifdef RLM_AVX2
            const __m128i m = _mm_set1_epi8(15);
            for (int r = 0; r < 16; r += 4) { /* 4 rows' 16 bytes, dwords transposed */
                __m128i t[4];
                for (int i = 0; i < 4; i++) {
                    const uint8_t *qs = src + (r + i) * rb + (int64_t)s * (five ? 176 : 144) + qo;
                    const __m128i a = _mm_loadu_si128((const __m128i *)qs);
                    const __m128i b = _mm_loadu_si128((const __m128i *)(qs + 16));
                    t[i] = sh ? _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m), _mm_andnot_si128(m, b))
                              : _mm_or_si128(_mm_and_si128(a, m), _mm_slli_epi16(_mm_and_si128(b, m), 4));
                }
                const __m128i a0 = _mm_unpacklo_epi32(t[0], t[1]), a1 = _mm_unpacklo_epi32(t[2], t[3]);
                const __m128i a2 = _mm_unpackhi_epi32(t[0], t[1]), a3 = _mm_unpackhi_epi32(t[2], t[3]);
                _mm_storeu_si128((__m128i *)(v + 4 * r), _mm_unpacklo_epi64(a0, a1));
                _mm_storeu_si128((__m128i *)(v + 64 + 4 * r), _mm_unpackhi_epi64(a0, a1));
                _mm_storeu_si128((__m128i *)(v + 128 + 4 * r), _mm_unpacklo_epi64(a2, a3));
                _mm_storeu_si128((__m128i *)(v + 192 + 4 * r), _mm_unpackhi_epi64(a2, a3));
            }
            continue;
#endif
            for (int r = 0; r < 16; r++) {
                const uint8_t *qs = src + r * rb + (int64_t)s * (five ? 176 : 144) + qo;
                for (int e = 0; e < 16; e++)
                    v[64 * (e / 4) + 4 * r + e % 4] =
                        (uint8_t)(((qs[e] >> sh) & 15) | ((qs[16 + e] >> sh) & 15) << 4);
            }
        }
    }
}

/* Row n (< n / 16 * 16) of a repacked Q4_K matrix unpacked as kq_unpack_row does it from
 * the file's rows: the same bytes q and the same products ds, dm. */
static void kx_unpack_row(const QMat *w, int64_t n, uint8_t *q, float *ds, float *dm) {
    if (w->fmt == FMT_Q3_K) {
        kx3_unpack_row(w, n, q, ds);
        return;
    }
    const int nsb = w->k / 256, r = (int)(n % 16);
    const uint8_t *g = w->qx + n / 16 * nsb * kx_sb_bytes(w->fmt);
    for (int s = 0; w->fmt == FMT_Q6_K && s < nsb; s++) {
        const uint8_t *o = g + (int64_t)s * KX6_BYTES;
        const float d = H((f16)(o[2 * r] | o[2 * r + 1] << 8));
        for (int i = 0; i < 16; i++) {
            ds[16 * s + i] = d * (float)(int8_t)o[32 + 16 * i + r];
            const uint8_t *v = o + 288 + 192 * i + 4 * r;
            uint8_t *e16 = q + 256 * s + 16 * i;
            for (int e = 0; e < 4; e++)
                for (int t = 0; t < 4; t++)
                    e16[4 * t + e] = (uint8_t)(((v[64 * (t & 1) + e] >> (4 * (t >> 1))) & 15) |
                                               ((v[128 + e] >> (2 * t)) & 3) << 4);
        }
    }
    const int five = w->fmt == FMT_Q5_K;
    for (int s = 0; !kq_six(w->fmt) && s < nsb; s++) {
        const uint8_t *o = g + (int64_t)s * kx_sb_bytes(w->fmt);
        const float d = H((f16)(o[2 * r] | o[2 * r + 1] << 8));
        const float dmin = H((f16)(o[32 + 2 * r] | o[33 + 2 * r] << 8));
        for (int j = 0; j < 8; j++) {
            ds[8 * s + j] = d * (float)o[64 + 16 * j + r];
            dm[8 * s + j] = dmin * (float)o[192 + 16 * j + r];
            const uint8_t *v = o + kx_sub_at(five, j) + 4 * r;
            for (int e = 0; e < 16; e++) {
                const uint8_t b = v[64 * (e / 4) + e % 4];
                q[256 * s + 32 * j + e] = b & 15;
                q[256 * s + 32 * j + 16 + e] = b >> 4;
            }
            for (int e = 0; five && e < 32; e++)
                q[256 * s + 32 * j + e] |=
                    (uint8_t)(((o[kx_fifth_at(j) + 4 * r + e % 4] >> (e / 4)) & 1) << 4);
        }
    }
}

#if defined(RLM_AVX2) && !defined(RLM_I8_ZMM)
/* ------------------------------------------------------------------ AVX2, repacked rows
 * The repacked groups (kx_repack_group) 8 rows a 256-bit vector, the two halves of a group
 * one after the other; the 512-bit kernels' operations per row (kx_group), so the same
 * bits. Without VNNI a step's u8 x s8 pairs are summed in int16 over a sub-block's 8 steps
 * (nibbles times |a| <= 128: at most 8 x 2 x 15 x 128 = 30720, no saturation), Q6_K's over
 * two steps (6 bits: 2 x 2 x 63 x 128 = 32256), then widened by madd against the rows'
 * scales in int16 pairs (sc, sc): the scale applied in the widening, no mullo. */
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define RLM_KX_VNNI256 /* 256-bit dot instructions: int32 sums, then times sc_j */
#endif

static inline __m256i kx_bcast4_256(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Group l of 16 weights of super-block s, 8 rows' values st (4 vectors: byte 4 r + e of
 * st[v] is element 4 v + e of row r's group) against tokens t .. t + G - 1, times the rows'
 * scales scv into isum. Without VNNI two steps' u8 x s8 pairs are summed in int16 (2 x 2 x
 * 63 x 128 = 32256) and widened by madd against (sc, sc): the same integers. */
static inline __attribute__((always_inline)) void kx6_half_dots(const __m256i *st, __m256i scv,
                                                                const Act *a, int t,
                                                                const int G, int k, int s,
                                                                int l, __m256i *isum) {
#ifndef RLM_KX_VNNI256
    const __m256i sc2 = _mm256_blend_epi16(scv, _mm256_slli_epi32(scv, 16), 0xAA);
#endif
    for (int i = 0; i < G; i++) {
        const int8_t *x = a->ka + (int64_t)(t + i) * k + 256 * s + 16 * l;
#ifdef RLM_KX_VNNI256
        __m256i p = dot_u8s8(st[0], kx_bcast4_256(x));
        for (int e = 1; e < 4; e++)
            p = _mm256_add_epi32(p, dot_u8s8(st[e], kx_bcast4_256(x + 4 * e)));
        isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(p, scv));
#else
        const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(st[0], kx_bcast4_256(x)),
                                             _mm256_maddubs_epi16(st[1], kx_bcast4_256(x + 4)));
        const __m256i q16 = _mm256_add_epi16(_mm256_maddubs_epi16(st[2], kx_bcast4_256(x + 8)),
                                             _mm256_maddubs_epi16(st[3], kx_bcast4_256(x + 12)));
        isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(p16, sc2),
                                                             _mm256_madd_epi16(q16, sc2)));
#endif
    }
}

/* I_s less (sum_i sc_i (sum a)_i) << shift for half h of a Q6_K-numbers super-block s (at
 * o), tokens t .. t + G - 1: the rows' scales in int16 pairs against the token's sums by 16
 * (shift 5 for q - 32, 2 for kx3's u - 4). */
static inline __attribute__((always_inline)) void kx6_half_correct(const uint8_t *o, int h,
                                                                   const Act *a, int t,
                                                                   const int G, int k, int s,
                                                                   const int shift,
                                                                   __m256i *isum) {
    __m256i sp[8]; /* lane r: (sc_2m, sc_2m+1) of row 8 h + r as int16 */
    for (int m = 0; m < 8; m++) {
        const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 32 + 32 * m + 8 * h)));
        const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 48 + 32 * m + 8 * h)));
        sp[m] = _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xAA);
    }
    for (int i = 0; i < G; i++) {
        const int16_t *b = a->kb + (int64_t)(t + i) * (k / 16) + 16 * s;
        __m256i c = _mm256_setzero_si256();
        for (int m = 0; m < 8; m++) {
            const uint32_t pair = (uint16_t)b[2 * m] | (uint32_t)(uint16_t)b[2 * m + 1] << 16;
            c = _mm256_add_epi32(c, _mm256_madd_epi16(sp[m], _mm256_set1_epi32((int32_t)pair)));
        }
        isum[i] = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(c, shift));
    }
}

/* Q6_K's integer I_s of super-block s (at o) for tokens t .. t + G - 1, half h of a group:
 * per group l of 16 weights the rows' sums of q a times sc_l, less 32 sum_l sc_l (sum a)_l
 * (the rows' scales in int16 pairs against the token's sums by 16, once a super-block, as
 * kx6_group). Without VNNI two steps' u8 x s8 pairs are summed in int16 (2 x 2 x 63 x 128 =
 * 32256) and widened by madd against (sc_l, sc_l): the same integers. */
static inline __attribute__((always_inline)) void kx6_half_sums(const uint8_t *o, int h,
                                                                const Act *a, int t, const int G,
                                                                int k, int s, __m256i *isum) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int i = 0; i < G; i++) isum[i] = _mm256_setzero_si256();
    for (int l = 0; l < 16; l++) {
        const __m256i scv = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 32 + 16 * l + 8 * h)));
        const uint8_t *v = o + 288 + 192 * l + 32 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)v);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(v + 64));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(v + 128));
        const __m256i st[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30))};
        kx6_half_dots(st, scv, a, t, G, k, s, l, isum);
    }
    kx6_half_correct(o, h, a, t, G, k, s, 5, isum);
}

/* Super-block s (at o) of half h of a repacked group, tokens t .. t + G - 1, into acc: the
 * 512-bit kernels' operations per row (kx_group, kx6_group). */
static inline __attribute__((always_inline)) void kx_half_sb(const int fmt, const uint8_t *o,
                                                             int h, const Act *a, int t,
                                                             const int G, int k, int s, int nsb,
                                                             __m256 *acc) {
    const int six = fmt == FMT_Q6_K, five = fmt == FMT_Q5_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * h)));
    __m256i isum[4];
    for (int i = 0; i < G; i++) isum[i] = _mm256_setzero_si256();
    if (six) {
        kx6_half_sums(o, h, a, t, G, k, s, isum);
        for (int i = 0; i < G; i++) {
            const __m256 kdv = _mm256_set1_ps(a->kd[(int64_t)(t + i) * nsb + s]);
            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dv, kdv), _mm256_cvtepi32_ps(isum[i]), acc[i]);
        }
        return;
    }
    for (int j = 0; j < 8; j++) {
        const __m256i scv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 64 + 16 * j + 8 * h)));
#ifndef RLM_KX_VNNI256
        const __m256i sc2 = _mm256_or_si256(scv, _mm256_slli_epi32(scv, 16)); /* (sc_j, sc_j) */
#endif
        __m256i st[8];
        for (int v = 0; v < 4; v++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(o + kx_sub_at(five, j) + 64 * v + 32 * h));
            st[v] = _mm256_and_si256(b, m4);
            st[v + 4] = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        }
        if (five) { /* step v's fifth bits (bit v of the plane) to bit 4 */
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(o + kx_fifth_at(j) + 32 * h));
            const __m256i u[8] = {_mm256_slli_epi16(hb, 4), _mm256_slli_epi16(hb, 3),
                                  _mm256_slli_epi16(hb, 2), _mm256_slli_epi16(hb, 1), hb,
                                  _mm256_srli_epi16(hb, 1), _mm256_srli_epi16(hb, 2),
                                  _mm256_srli_epi16(hb, 3)};
            for (int v = 0; v < 8; v++) st[v] = _mm256_or_si256(st[v], _mm256_and_si256(u[v], m10));
        }
        for (int i = 0; i < G; i++) {
            const int8_t *x = a->ka + (int64_t)(t + i) * k + 256 * s + 32 * j;
#ifdef RLM_KX_VNNI256
            __m256i p = _mm256_setzero_si256();
            for (int v = 0; v < 8; v++)
                p = _mm256_add_epi32(p, dot_u8s8(st[v], kx_bcast4_256(x + 4 * v)));
            isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(p, scv));
#else
            /* (Q5_K's 5 bits: int16 sums over 4 steps at most, 4 x 2 x 31 x 128 = 31744);
             * the int16 sums widened by madd against the rows' sc_j pairs: sc_j times
             * the pair's sum, exactly what the mullo of their int32 sum gives */
            __m256i p16 = _mm256_maddubs_epi16(st[0], kx_bcast4_256(x));
            for (int v = 1; v < 8; v++) {
                if (five && v == 4) {
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p16, sc2));
                    p16 = _mm256_setzero_si256();
                }
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(st[v], kx_bcast4_256(x + 4 * v)));
            }
            isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p16, sc2));
#endif
        }
    }
    __m256i mp[4]; /* lane r: (m_2q, m_2q+1) of the group's row 8 h + r as int16 */
    for (int q = 0; q < 4; q++)
        mp[q] = _mm256_or_si256(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 192 + 32 * q + 8 * h))),
            _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 208 + 32 * q + 8 * h))), 16));
    const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 32 + 16 * h)));
    for (int i = 0; i < G; i++) {
        const __m256i pk = _mm256_castsi128_si256(
            kx_sum32_pairs(a->kb + (int64_t)(t + i) * (k / 16) + 16 * s));
        __m256i ms = _mm256_setzero_si256();
        for (int q = 0; q < 4; q++)
            ms = _mm256_add_epi32(ms, _mm256_madd_epi16(
                mp[q], _mm256_permutevar8x32_epi32(pk, _mm256_set1_epi32(q))));
        const __m256 kdv = _mm256_set1_ps(a->kd[(int64_t)(t + i) * nsb + s]);
        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dv, kdv), _mm256_cvtepi32_ps(isum[i]), acc[i]);
        acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(dmv, kdv), _mm256_cvtepi32_ps(ms), acc[i]);
    }
}

/* G (up to 4) tokens against both 8-row halves of a group in one pass over its super-blocks:
 * each line of the group is used while it is being fetched (a pass per half left the first
 * DRAM-bound, the second compute-bound); each half's operations are kx_half_sb's. */
static inline __attribute__((always_inline)) void kx_both(const int fmt, const uint8_t *qx,
                                                          int nsb, const Act *a, int t,
                                                          const int G, int k, float *y,
                                                          int64_t ldy, int n, const int ahead) {
    __m256 acc[2][4]; /* (fixed sizes: registers once G is a constant) */
    for (int i = 0; i < G; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    const int64_t sb = kx_sb_bytes(fmt), part = (sb / 2 + 63) / 64 * 64;
    for (int s = 0; s < nsb; s++) {
        const uint8_t *o = qx + (int64_t)s * sb;
        /* the super-block 3 ahead, half before each half, on a group's first pass of the
         * tile (on every pass: 64 tokens 3-5% slower under the AVX2 caps on the Zen 5,
         * four alternating pairs; 1 to 16 tokens the same) */
        if (ahead) kx_ask_ahead(o, sb, (int)part);
        kx_half_sb(fmt, o, 0, a, t, G, k, s, nsb, acc[0]);
        if (ahead) kx_ask_ahead(o + part, sb, (int)(sb - part));
        kx_half_sb(fmt, o, 1, a, t, G, k, s, nsb, acc[1]);
    }
    for (int i = 0; i < G; i++) {
        _mm256_storeu_ps(y + (int64_t)(t + i) * ldy + n, acc[0][i]);
        _mm256_storeu_ps(y + (int64_t)(t + i) * ldy + n + 8, acc[1][i]);
    }
}

/* Repacked groups g0 .. g1 - 1 (rows 16 g0 .. 16 g1), all T tokens, up to 4 at a time. */
static void kx_rows(const QMat *w, int g0, int g1, int T, const Act *a, float *y,
                    int64_t ldy) {
    if (w->fmt == FMT_Q3_K) {
        kx3_rows(w, g0, g1, T, a, y, ldy);
        return;
    }
    const int k = w->k, nsb = k / 256, six = w->fmt == FMT_Q6_K;
    const int64_t sb = kx_sb_bytes(w->fmt);
    for (int t0 = 0; t0 < T; t0 += 32) { /* a tile of tokens' activations stays in L2 */
        const int t1 = T - t0 < 32 ? T : t0 + 32;
        for (int g = g0; g < g1; g++) {
            const uint8_t *qx = w->qx + (int64_t)g * nsb * sb;
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 3) / 4, G = (left + groups - 1) / groups;
                const int ahead = t == t0; /* the pass that reads the group from memory */
                switch (G + 8 * six + 16 * (w->fmt == FMT_Q5_K)) {
#define RLM_G(G) case G: kx_both(FMT_Q4_K, qx, nsb, a, t, G, k, y, ldy, 16 * g, ahead); break; \
                 case G + 8: kx_both(FMT_Q6_K, qx, nsb, a, t, G, k, y, ldy, 16 * g, ahead); break; \
                 case G + 16: kx_both(FMT_Q5_K, qx, nsb, a, t, G, k, y, ldy, 16 * g, ahead); break;
                RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4)
#undef RLM_G
                }
                t += G;
            }
        }
    }
}
#endif

#ifdef RLM_I8_ZMM
/* 4 activations (bytes p[0..3]) in every 32-bit lane */
static inline __m512i kx_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc + pairs of int16 products summed to 32 bits (exact: the sums stay small) */
static inline __m512i kx_dot16(__m512i acc, __m512i u, __m512i v) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(acc, u, v);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(u, v));
#endif
}

/* Token t + i's (kd_s, kd_s)-scaled super-block sums into acc: kq_dot's two float
 * operations, lane r row n + r's (d, dmin: the rows' fp16 scales as a vector). */
static inline __m512 kx_scale(__m512 acc, __m512 dv, __m512 dmv, float kd, __m512i isum,
                              __m512i msum, const int mterm) {
    const __m512 kdv = _mm512_set1_ps(kd);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(dv, kdv), _mm512_cvtepi32_ps(isum), acc);
    if (mterm) acc = _mm512_fnmadd_ps(_mm512_mul_ps(dmv, kdv), _mm512_cvtepi32_ps(msum), acc);
    return acc;
}

/* G tokens (from token t) against repacked group qx (16 rows from row n), kq_dot's
 * operations a row a lane: per super-block s and sub-block j the 16 rows' integer sums (8
 * dot instructions) times the rows' sc_j into I_s; M_s from the rows' m_j in int16 pairs
 * against the token's sums of a by 32; then the two float operations. */
static inline __attribute__((always_inline)) void kx_group(const uint8_t *qx, int nsb,
                                                           const Act *a, int t, const int G,
                                                           int k, float *y, int64_t ldy,
                                                           int n, const int five,
                                                           const int ahead) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    /* fixed sizes (G <= 8): registers once G is a constant. Sized [G] they were arrays of
     * variable length to gcc, kept on the stack: every token's sums loaded and stored at
     * every sub-block. Fixed, a 1B step (three alternating pairs, Zen 5) Q4_K_M 16 / 64
     * tokens 31-43 / 124-141 ms against 35-45 / 147-170, Q6_K 38 / 131 against 54 / 197,
     * Q3_K_M 64 tokens 139 against 168; the same bits */
    __m512 acc[8];
    for (int i = 0; i < G; i++) acc[i] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *o = qx + (int64_t)s * (five ? KX5_BYTES : KX_BYTES);
        const int64_t sb = five ? KX5_BYTES : KX_BYTES;
        if (ahead) kx_ask_ahead(o, sb, 320);
        __m512i isum[8];
        for (int i = 0; i < G; i++) isum[i] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            if (ahead) kx_ask_ahead(o + kx_sub_at(five, j), sb, five ? 320 : 256);
            const __m512i scv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(o + 64 + 16 * j)));
            __m512i st[8];
            for (int v = 0; v < 4; v++) {
                const __m512i b = _mm512_loadu_si512((const void *)(o + kx_sub_at(five, j) + 64 * v));
                st[v] = _mm512_and_si512(b, m4);
                st[v + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
            }
            if (five) { /* step v's fifth bits (bit v of the plane) to bit 4: st | (h & 0x10) */
                const __m512i h = _mm512_loadu_si512((const void *)(o + kx_fifth_at(j)));
                const __m512i u[8] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 3),
                                      _mm512_slli_epi16(h, 2), _mm512_slli_epi16(h, 1), h,
                                      _mm512_srli_epi16(h, 1), _mm512_srli_epi16(h, 2),
                                      _mm512_srli_epi16(h, 3)};
                for (int v = 0; v < 8; v++) st[v] = _mm512_ternarylogic_epi32(st[v], u[v], m10, 0xF8);
            }
            for (int i = 0; i < G; i++) {
                const int8_t *x = a->ka + (int64_t)(t + i) * k + 256 * s + 32 * j;
                __m512i p0 = dot_u8s8_512(st[0], kx_bcast4(x));
                __m512i p1 = dot_u8s8_512(st[4], kx_bcast4(x + 16));
                for (int v = 1; v < 4; v++) {
                    p0 = dot_acc_512(p0, st[v], kx_bcast4(x + 4 * v));
                    p1 = dot_acc_512(p1, st[v + 4], kx_bcast4(x + 16 + 4 * v));
                }
                isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(_mm512_add_epi32(p0, p1), scv));
            }
        }
        __m512i mp[4]; /* lane r: (m_2q, m_2q+1) of row n + r as int16 */
        for (int q = 0; q < 4; q++)
            mp[q] = _mm512_or_si512(
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(o + 192 + 32 * q))),
                _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(o + 208 + 32 * q))), 16));
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 32)));
        for (int i = 0; i < G; i++) {
            const __m512i pk = _mm512_castsi128_si512(
                kx_sum32_pairs(a->kb + (int64_t)(t + i) * (k / 16) + 16 * s));
            __m512i ms = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++)
                ms = kx_dot16(ms, mp[q], _mm512_permutexvar_epi32(_mm512_set1_epi32(q), pk));
            acc[i] = kx_scale(acc[i], dv, dmv, a->kd[(int64_t)(t + i) * nsb + s], isum[i], ms, 1);
        }
    }
    for (int i = 0; i < G; i++) _mm512_storeu_ps(y + (int64_t)(t + i) * ldy + n, acc[i]);
}

/* Group l of 16 weights of super-block s, 16 rows' values st (byte 4 r + e of st[v]:
 * element 4 v + e of row r's group) against G tokens, times the rows' scales scv into
 * isum. */
static inline __attribute__((always_inline)) void kx6_dots(const __m512i *st, __m512i scv,
                                                           const Act *a, int t, const int G,
                                                           int k, int s, int l, __m512i *isum) {
    for (int i = 0; i < G; i++) {
        const int8_t *x = a->ka + (int64_t)(t + i) * k + 256 * s + 16 * l;
        __m512i p = dot_u8s8_512(st[0], kx_bcast4(x));
        for (int e = 1; e < 4; e++) p = dot_acc_512(p, st[e], kx_bcast4(x + 4 * e));
        isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(p, scv));
    }
}

/* The end of a Q6_K-numbers super-block s (at o: d and sc where kx6 has them) for G
 * tokens: I_s less (sum_i sc_i (sum a)_i) << shift (the rows' scales in int16 pairs against
 * the token's sums by 16; shift 5 for q - 32, 2 for kx3's u - 4), then kq_dot's float
 * operation into acc. */
static inline __attribute__((always_inline)) void kx6_finish(const uint8_t *o, const Act *a,
                                                             int t, const int G, int k, int s,
                                                             int nsb, const int shift,
                                                             __m512i *isum, __m512 *acc) {
    __m512i sp[8]; /* lane r: (sc_2m, sc_2m+1) of row n + r as int16 */
    for (int m = 0; m < 8; m++)
        sp[m] = _mm512_or_si512(
            _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(o + 32 + 32 * m))),
                             _mm512_set1_epi32(0xffff)),
            _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(o + 48 + 32 * m))), 16));
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
    for (int i = 0; i < G; i++) {
        const int16_t *b = a->kb + (int64_t)(t + i) * (k / 16) + 16 * s;
        __m512i c = _mm512_setzero_si512();
        for (int m = 0; m < 8; m++) {
            const uint32_t pair = (uint16_t)b[2 * m] | (uint32_t)(uint16_t)b[2 * m + 1] << 16;
            c = kx_dot16(c, sp[m], _mm512_set1_epi32((int32_t)pair));
        }
        isum[i] = _mm512_sub_epi32(isum[i], _mm512_slli_epi32(c, shift));
        acc[i] = kx_scale(acc[i], dv, dv, a->kd[(int64_t)(t + i) * nsb + s], isum[i], isum[i], 0);
    }
}

/* Q6_K's kx_group: per super-block s and group l of 16 weights the 16 rows' sums of q a (4
 * dot instructions) times the rows' sc_l into I_s, less 32 sum_l sc_l (sum a)_l (the rows'
 * scales in int16 pairs against the token's sums by 16): kq_dot's integer. */
static inline __attribute__((always_inline)) void kx6_group(const uint8_t *qx, int nsb,
                                                            const Act *a, int t, const int G,
                                                            int k, float *y, int64_t ldy, int n,
                                                            const int ahead) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m33 = _mm512_set1_epi8(0x33);
    const __m512i mcc = _mm512_set1_epi8((char)0xcc);
    __m512 acc[8]; /* (fixed sizes, G <= 8: registers once G is a constant; see kx_group) */
    for (int i = 0; i < G; i++) acc[i] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *o = qx + (int64_t)s * KX6_BYTES;
        if (ahead) kx_ask_ahead(o, KX6_BYTES, 288);
        __m512i isum[8];
        for (int i = 0; i < G; i++) isum[i] = _mm512_setzero_si512();
        for (int l = 0; l < 16; l++) {
            const __m512i scv = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(o + 32 + 16 * l)));
            const uint8_t *v = o + 288 + 192 * l;
            if (ahead) kx_ask_ahead(v, KX6_BYTES, 192);
            const __m512i l0 = _mm512_loadu_si512((const void *)v);
            const __m512i l1 = _mm512_loadu_si512((const void *)(v + 64));
            const __m512i h = _mm512_loadu_si512((const void *)(v + 128));
            /* a byte's low nibble from lo, bits 4-5 from hi: m4 ? lo : hi (vpternlogd 0xE4),
             * hi's bits 6-7 zero (h's other pair masked off before the shift; what a 16-bit
             * shift carries into a byte's low bits falls under m4, taken from lo) */
            const __m512i h03 = _mm512_and_si512(h, m33), h47 = _mm512_and_si512(h, mcc);
            const __m512i st[4] = {
                _mm512_ternarylogic_epi32(l0, _mm512_slli_epi16(h03, 4), m4, 0xE4),
                _mm512_ternarylogic_epi32(l1, _mm512_slli_epi16(h47, 2), m4, 0xE4),
                _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4), h03, m4, 0xE4),
                _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4), _mm512_srli_epi16(h47, 2), m4,
                                          0xE4)};
            kx6_dots(st, scv, a, t, G, k, s, l, isum);
        }
        kx6_finish(o, a, t, G, k, s, nsb, 5, isum, acc);
    }
    for (int i = 0; i < G; i++) _mm512_storeu_ps(y + (int64_t)(t + i) * ldy + n, acc[i]);
}

/* Repacked groups g0 .. g1 - 1 (rows 16 g0 .. 16 g1), all T tokens. */
static void kx_rows(const QMat *w, int g0, int g1, int T, const Act *a, float *y,
                    int64_t ldy) {
    if (w->fmt == FMT_Q3_K) {
        kx3_rows(w, g0, g1, T, a, y, ldy);
        return;
    }
    const int k = w->k, nsb = k / 256, six = w->fmt == FMT_Q6_K;
    const int64_t sb = kx_sb_bytes(w->fmt);
    for (int t0 = 0; t0 < T; t0 += 64) { /* a tile of tokens' activations stays in L2 */
        const int t1 = T - t0 < 64 ? T : t0 + 64;
        for (int g = g0; g < g1; g++) {
            const uint8_t *qx = w->qx + (int64_t)g * nsb * sb;
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 7) / 8, G = (left + groups - 1) / groups;
                const int ahead = t == t0; /* the pass that reads the group from memory */
                switch (G + 16 * six + 32 * (w->fmt == FMT_Q5_K)) {
#define RLM_G(G) case G: kx_group(qx, nsb, a, t, G, k, y, ldy, 16 * g, 0, ahead); break; \
                 case G + 16: kx6_group(qx, nsb, a, t, G, k, y, ldy, 16 * g, ahead); break; \
                 case G + 32: kx_group(qx, nsb, a, t, G, k, y, ldy, 16 * g, 1, ahead); break;
                RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4) RLM_G(5) RLM_G(6) RLM_G(7) RLM_G(8)
#undef RLM_G
                }
                t += G;
            }
        }
    }
}
#endif
