/* A GGUF Q3_K matrix's numbers at 3 bits a weight, 16 rows side by side (QMat fmt FMT_Q3_K,
 * qx only), and their 512-bit int8 kernel.
 *
 * recode.c rewrites Q3_K super-blocks as Q6_K ones of the same numbers: (d sc_i) (q - 32)
 * with q - 32 in -4..3, so q in 28..35. Read as Q6_K (kx.c's kx6 layout, 210 bytes a row's
 * super-block) a step streams 1.9x the file's bytes. Here the same numbers keep only what
 * they need, u = q - 28 in 0..7 (the file's 3 bits: its 2-bit pair and its high bit),
 * repacked from the file's rows: 114 bytes a row's super-block against the file's 110.
 * Group g's super-block s is KX3_BYTES bytes at qx + (g nsb + s) KX3_BYTES:
 *   d[16] fp16, sc[16][16] int8 (row r's scale of group i of 16 weights at 32 + 16 i + r):
 *   kx6's first 288 bytes, at the same places; then per pair p of groups (2p, 2p + 1) 192
 *   bytes: two vectors of low bits, one a group (byte 4 r + e, bits 2v and 2v + 1: u's low
 *   two of element 4 v + e of row r's group), and one of high bits (byte 4 r + e, bit v:
 *   u's bit 2 of element 4 v + e of group 2p; bit 4 + v: of group 2p + 1).
 * The kernel is kx6_group's with u for q: I_s = sum_i sc_i ((sum u a)_i - 4 (sum a)_i), the
 * integer kx6_group makes of the same numbers (q a - 32 a = u a - 4 a), then the same float
 * operations: the same bits as the Q6_K rows on every path (tests/test_native_recode.py).
 * The embedding lookup and the row-at-a-time paths unpack a row to Q6_K's bytes
 * (kx3_unpack_row). The AVX2 kernel reads a group's two 8-row halves as kx.c's AVX2 one does
 * (kx6_half_sums' operations). Only where every step is int8 on an AVX2 or 512-bit build
 * without AMX int8 tiles (rlm_kx3_rows); elsewhere Q3_K runs as its Q6_K rows. */
#include "rlm.h"

/* Row r's Q3_K super-block p (recode.c's layout: element 128 h + 32 t + l's low two bits at
 * bits 2 t of qs[32 h + l], its bit 2 at bit 4 h + t of hmask[l]) into group o: d, the
 * scales as recode.c rewrites them (s - 32), u's bits. Group i of 16 is elements 16 i ..
 * 16 i + 15: h = i / 8, t = i % 8 / 2, l = 16 (i % 2) + 4 v + e. Four bytes at a time: word
 * v of the 16 source bytes at l0 holds elements 4 v .. 4 v + 3, so byte e of the output
 * word gathers element 4 v + e of each v (no bit crosses a byte: a value < 4 shifted by
 * 2 v <= 6, a bit by v + 4 <= 7). */
static inline uint32_t kx3_word(const uint8_t *b) {
    uint32_t x;
    memcpy(&x, b, 4);
    return x;
}

static void kx3_put_row(const uint8_t *p, int r, uint8_t *o) {
    const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
    memcpy(o + 2 * r, p + 108, 2);
    for (int j = 0; j < 16; j++) {
        const int lo = (sc[j & 7] >> (4 * (j >> 3))) & 15;
        const int hi = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        o[32 + 16 * j + r] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
    }
    for (int i = 0; i < 16; i++) {
        const int h = i / 8, t = i % 8 / 2, l0 = 16 * (i % 2);
        uint32_t lb = 0, hb = 0;
        for (int v = 0; v < 4; v++) {
            lb |= ((kx3_word(qs + 32 * h + l0 + 4 * v) >> (2 * t)) & 0x03030303u) << (2 * v);
            hb |= ((kx3_word(hm + l0 + 4 * v) >> (4 * h + t)) & 0x01010101u) << v;
        }
        uint8_t *lov = o + 288 + 192 * (i / 2) + 64 * (i & 1) + 4 * r;
        uint8_t *hiv = o + 288 + 192 * (i / 2) + 128 + 4 * r;
        hb = (hb << (4 * (i & 1))) | kx3_word(hiv);
        memcpy(lov, &lb, 4);
        memcpy(hiv, &hb, 4);
    }
}

/* The file's Q3_K rows src [16, nsb * 110] (row stride rb) as one kx3 group at dst. */
static void kx3_repack_group(const uint8_t *src, int64_t rb, int nsb, uint8_t *dst) {
    for (int s = 0; s < nsb; s++) {
        uint8_t *o = dst + (int64_t)s * KX3_BYTES;
        memset(o + 288, 0, KX3_BYTES - 288);
        for (int r = 0; r < 16; r++)
            kx3_put_row(src + r * rb + (int64_t)s * kq_sb_bytes(FMT_Q3_K), r, o);
    }
}

/* Row n of a kx3 matrix unpacked as kx_unpack_row unpacks its Q6_K twin: the Q6_K bytes q
 * (28..35) and ds[16 s + i] = d sc_i. */
static void kx3_unpack_row(const QMat *w, int64_t n, uint8_t *q, float *ds) {
    const int nsb = w->k / 256, r = (int)(n % 16);
    const uint8_t *g = w->qx + n / 16 * nsb * KX3_BYTES;
    for (int s = 0; s < nsb; s++) {
        const uint8_t *o = g + (int64_t)s * KX3_BYTES;
        const float d = H((f16)(o[2 * r] | o[2 * r + 1] << 8));
        for (int i = 0; i < 16; i++) {
            ds[16 * s + i] = d * (float)(int8_t)o[32 + 16 * i + r];
            const uint8_t *lo = o + 288 + 192 * (i / 2) + 64 * (i & 1) + 4 * r;
            const uint8_t *hi = o + 288 + 192 * (i / 2) + 128 + 4 * r;
            for (int e = 0; e < 4; e++)
                for (int v = 0; v < 4; v++)
                    q[256 * s + 16 * i + 4 * v + e] =
                        (uint8_t)(28 + ((lo[e] >> (2 * v)) & 3) +
                                  4 * ((hi[e] >> (v + 4 * (i & 1))) & 1));
        }
    }
}

#if defined(RLM_AVX2) && !(defined(RLM_AMX) && defined(__AMX_INT8__))
#define RLM_KX3 1
#endif

#if defined(RLM_AVX2) && !defined(RLM_I8_ZMM)
/* kx3_high on 256 bits */
static inline __m256i kx3_high256(__m256i h, int bit) {
    const __m256i m = _mm256_and_si256(h, _mm256_set1_epi8((char)(1 << bit)));
    return bit > 2 ? _mm256_srli_epi16(m, bit - 2) : bit < 2 ? _mm256_slli_epi16(m, 2 - bit) : m;
}

/* kx6_half_sums (kx.c) for kx3 rows: half h (rows 8 h .. 8 h + 7) of super-block s (at o),
 * tokens t .. t + G - 1, with u for q and 4 for 32 in the correction. */
static inline __attribute__((always_inline)) void kx3_half_sums(const uint8_t *o, int h,
                                                                const Act *a, int t, const int G,
                                                                int k, int s, __m256i *isum) {
    const __m256i m3 = _mm256_set1_epi8(0x03);
    for (int i = 0; i < G; i++) isum[i] = _mm256_setzero_si256();
    for (int p = 0; p < 8; p++) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(o + 288 + 192 * p + 128 + 32 * h));
        for (int half = 0; half < 2; half++) {
            const int l = 2 * p + half;
            const __m256i scv = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 32 + 16 * l + 8 * h)));
            const __m256i lo = _mm256_loadu_si256((const __m256i *)(o + 288 + 192 * p + 64 * half + 32 * h));
            __m256i st[4];
            for (int v = 0; v < 4; v++)
                st[v] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 2 * v), m3),
                                        kx3_high256(hv, v + 4 * half));
            kx6_half_dots(st, scv, a, t, G, k, s, l, isum);
        }
    }
    kx6_half_correct(o, h, a, t, G, k, s, 2, isum);
}

/* G (up to 4) tokens against both halves of kx3 group qx, one pass over its super-blocks
 * (kx_both's), kx_half_sb's float operations for Q6_K. */
static inline __attribute__((always_inline)) void kx3_both(const uint8_t *qx, int nsb,
                                                           const Act *a, int t, const int G,
                                                           int k, float *y, int64_t ldy, int n) {
    __m256 acc[2][4];
    for (int i = 0; i < G; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *o = qx + (int64_t)s * KX3_BYTES;
        for (int h = 0; h < 2; h++) {
            __m256i isum[4];
            kx3_half_sums(o, h, a, t, G, k, s, isum);
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * h)));
            for (int i = 0; i < G; i++) {
                const __m256 kdv = _mm256_set1_ps(a->kd[(int64_t)(t + i) * nsb + s]);
                acc[h][i] = _mm256_fmadd_ps(_mm256_mul_ps(dv, kdv), _mm256_cvtepi32_ps(isum[i]),
                                            acc[h][i]);
            }
        }
    }
    for (int i = 0; i < G; i++) {
        _mm256_storeu_ps(y + (int64_t)(t + i) * ldy + n, acc[0][i]);
        _mm256_storeu_ps(y + (int64_t)(t + i) * ldy + n + 8, acc[1][i]);
    }
}

/* kx3 groups g0 .. g1 - 1, all T tokens (kx.c's AVX2 kx_rows' tiling). */
static void kx3_rows(const QMat *w, int g0, int g1, int T, const Act *a, float *y,
                     int64_t ldy) {
    const int k = w->k, nsb = k / 256;
    for (int t0 = 0; t0 < T; t0 += 32) {
        const int t1 = T - t0 < 32 ? T : t0 + 32;
        for (int g = g0; g < g1; g++) {
            const uint8_t *qx = w->qx + (int64_t)g * nsb * KX3_BYTES;
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 3) / 4, G = (left + groups - 1) / groups;
                switch (G) {
#define RLM_G(G) case G: kx3_both(qx, nsb, a, t, G, k, y, ldy, 16 * g); break;
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
/* u's bit 2 of the element a byte's step v reads (bit v + 4 half of the high vector h) at
 * bit 2, nothing else set: the bit masked, then moved within its byte. */
static inline __m512i kx3_high(__m512i h, int bit) {
    const __m512i m = _mm512_and_si512(h, _mm512_set1_epi8((char)(1 << bit)));
    return bit > 2 ? _mm512_srli_epi16(m, bit - 2) : bit < 2 ? _mm512_slli_epi16(m, 2 - bit) : m;
}

/* G tokens (from token t) against kx3 group qx (16 rows from row n): kx6_group's
 * operations with u (see the top). */
static inline __attribute__((always_inline)) void kx3_group(const uint8_t *qx, int nsb,
                                                            const Act *a, int t, const int G,
                                                            int k, float *y, int64_t ldy, int n,
                                                            const int ahead) {
    const __m512i m3 = _mm512_set1_epi8(0x03);
    __m512 acc[8]; /* (fixed sizes, G <= 8: registers once G is a constant; see kx_group) */
    for (int i = 0; i < G; i++) acc[i] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *o = qx + (int64_t)s * KX3_BYTES;
        if (ahead) kx_ask_ahead(o, KX3_BYTES, 288); /* (kx.c's streaming requests) */
        __m512i isum[8];
        for (int i = 0; i < G; i++) isum[i] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            if (ahead) kx_ask_ahead(o + 288 + 192 * p, KX3_BYTES, 192);
            const __m512i h = _mm512_loadu_si512((const void *)(o + 288 + 192 * p + 128));
            for (int half = 0; half < 2; half++) {
                const int l = 2 * p + half;
                const __m512i scv = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(o + 32 + 16 * l)));
                const __m512i lo = _mm512_loadu_si512((const void *)(o + 288 + 192 * p + 64 * half));
                /* a byte's bits 0-1 from the low vector, bit 2 from the high (m3 ? lo : hi) */
                const __m512i st[4] = {
                    _mm512_ternarylogic_epi32(lo, kx3_high(h, 4 * half), m3, 0xE4),
                    _mm512_ternarylogic_epi32(_mm512_srli_epi16(lo, 2), kx3_high(h, 1 + 4 * half), m3, 0xE4),
                    _mm512_ternarylogic_epi32(_mm512_srli_epi16(lo, 4), kx3_high(h, 2 + 4 * half), m3, 0xE4),
                    _mm512_ternarylogic_epi32(_mm512_srli_epi16(lo, 6), kx3_high(h, 3 + 4 * half), m3, 0xE4)};
                kx6_dots(st, scv, a, t, G, k, s, l, isum);
            }
        }
        kx6_finish(o, a, t, G, k, s, nsb, 2, isum, acc);
    }
    for (int i = 0; i < G; i++) _mm512_storeu_ps(y + (int64_t)(t + i) * ldy + n, acc[i]);
}

/* kx3 groups g0 .. g1 - 1 (rows 16 g0 .. 16 g1), all T tokens (kx_rows' tiling). */
static void kx3_rows(const QMat *w, int g0, int g1, int T, const Act *a, float *y,
                     int64_t ldy) {
    const int k = w->k, nsb = k / 256;
    for (int t0 = 0; t0 < T; t0 += 64) {
        const int t1 = T - t0 < 64 ? T : t0 + 64;
        for (int g = g0; g < g1; g++) {
            const uint8_t *qx = w->qx + (int64_t)g * nsb * KX3_BYTES;
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 7) / 8, G = (left + groups - 1) / groups;
                const int ahead = t == t0; /* (kx_rows') */
                switch (G) {
#define RLM_G(G) case G: kx3_group(qx, nsb, a, t, G, k, y, ldy, 16 * g, ahead); break;
                RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4) RLM_G(5) RLM_G(6) RLM_G(7) RLM_G(8)
#undef RLM_G
                }
                t += G;
            }
        }
    }
}
#endif
