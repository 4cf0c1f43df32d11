/* GGUF Q3_K super-blocks rewritten as Q6_K super-blocks of the same numbers, and IQ4_NL /
 * IQ4_XS nibbles as the int8 values of Q8_0 blocks (native/recode.py says why, and holds the
 * numpy twins these are tested against).
 *   Q3_K (110 bytes): 32 bytes of high bits (bit 4 h + t of byte l: element 128 h + 32 t + l,
 *        set meaning no -4), 64 of 2-bit pairs (bits 2 t of byte 32 h + l: the same element's
 *        low two), 12 of 6-bit scales (16, each biased by 32; llama.cpp's packing), fp16 d.
 *        W = (d (s_i - 32)) q, q in -4..3.
 *   Q6_K (210 bytes): kquants.c's layout.  W = (d sc_i) (q - 32), here q - 32 in -4..3. */
#include "rlm.h"

static void q3k_as_q6k_sb(const uint8_t *p, uint8_t *o) {
    const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
    uint8_t u[256]; /* element e's Q6_K value (q + 32, in 28..35) */
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int l = 0; l < 32; l++)
                u[128 * h + 32 * t + l] = (uint8_t)(((qs[32 * h + l] >> (2 * t)) & 3) + 28 +
                                                    4 * ((hm[l] >> (4 * h + t)) & 1));
    for (int j = 0; j < 16; j++) {
        const int lo = (sc[j & 7] >> (4 * (j >> 3))) & 15;
        const int hi = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        o[192 + j] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
    }
    for (int h = 0; h < 2; h++) {
        for (int b = 0; b < 64; b++)
            o[64 * h + b] = (uint8_t)((u[128 * h + b] & 15) | (u[128 * h + 64 + b] & 15) << 4);
        for (int l = 0; l < 32; l++) {
            uint8_t v = 0;
            for (int t = 0; t < 4; t++) v |= (uint8_t)((u[128 * h + 32 * t + l] >> 4) << (2 * t));
            o[128 + 32 * h + l] = v;
        }
    }
    o[208] = p[108];
    o[209] = p[109];
}

typedef struct {
    const uint8_t *src;
    int64_t nsb;
    uint8_t *dst;
} RecodeJob;

static void recode_job(void *ctx, int tid, int nth) {
    const RecodeJob *j = (const RecodeJob *)ctx;
    const int64_t s0 = j->nsb * tid / nth, s1 = j->nsb * (tid + 1) / nth;
    for (int64_t s = s0; s < s1; s++) q3k_as_q6k_sb(j->src + 110 * s, j->dst + 210 * s);
}

/* nsb Q3_K super-blocks at src as Q6_K super-blocks at dst (nsb * 210 bytes), split over the
 * team of nthreads. */
void rlm_q3k_as_q6k(const uint8_t *src, int64_t nsb, uint8_t *dst, int32_t nthreads) {
    RecodeJob j = {src, nsb, dst};
    run_parallel(recode_job, &j, nthreads < 1 ? 1 : nthreads);
}

/* IQ4_NL / IQ4_XS: a nibble indexes ggml's non-linear grid kvalues_iq4nl (rlm.h's IQ4_GRID). */

typedef struct {
    const uint8_t *src;
    int64_t nblocks;
    int32_t block_bytes, qs_at, groups;
    int8_t *dst;
} Iq4Job;

/* A group of 16 bytes as 32 values: byte j's low nibble is element j, its high one 16 + j. */
static void iq4_group(const uint8_t *qs, int8_t *out) {
#ifdef RLM_AVX2
    const __m128i grid = _mm_loadu_si128((const __m128i *)IQ4_GRID);
    const __m128i x = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(15);
    _mm_storeu_si128((__m128i *)out, _mm_shuffle_epi8(grid, _mm_and_si128(x, m)));
    _mm_storeu_si128((__m128i *)(out + 16),
                     _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(x, 4), m)));
#else
    for (int j = 0; j < 16; j++) {
        out[j] = IQ4_GRID[qs[j] & 15];
        out[16 + j] = IQ4_GRID[qs[j] >> 4];
    }
#endif
}

static void iq4_job(void *ctx, int tid, int nth) {
    const Iq4Job *j = (const Iq4Job *)ctx;
    const int64_t b0 = j->nblocks * tid / nth, b1 = j->nblocks * (tid + 1) / nth;
    for (int64_t b = b0; b < b1; b++)
        for (int g = 0; g < j->groups; g++)
            iq4_group(j->src + b * j->block_bytes + j->qs_at + 16 * g,
                      j->dst + (b * j->groups + g) * 32);
}

/* The values of nblocks blocks of block_bytes at src, each holding groups x 16 bytes of
 * nibbles from byte qs_at (IQ4_NL: 18, 2, 1; IQ4_XS: 136, 8, 8), as int8 rows of 32 at dst
 * (nblocks * groups * 32 bytes), split over the team of nthreads. */
void rlm_iq4_values(const uint8_t *src, int64_t nblocks, int32_t block_bytes, int32_t qs_at,
                    int32_t groups, int8_t *dst, int32_t nthreads) {
    Iq4Job j = {src, nblocks, block_bytes, qs_at, groups, dst};
    run_parallel(iq4_job, &j, nthreads < 1 ? 1 : nthreads);
}

typedef struct {
    const uint8_t *src;
    int64_t nsb;
    float *scales;
} Iq4xsJob;

static void iq4xs_job(void *ctx, int tid, int nth) {
    const Iq4xsJob *j = (const Iq4xsJob *)ctx;
    const int64_t s0 = j->nsb * tid / nth, s1 = j->nsb * (tid + 1) / nth;
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *p = j->src + 136 * s;
        const float d = H((f16)(p[0] | p[1] << 8));
        const unsigned high = (unsigned)(p[2] | p[3] << 8);
        for (int b = 0; b < 8; b++) {
            const int ls = ((p[4 + b / 2] >> (4 * (b % 2))) & 15) | (((high >> (2 * b)) & 3) << 4);
            j->scales[8 * s + b] = d * (float)(ls - 32); /* (exact in fp32) */
        }
    }
}

/* Each block of 32's scale d (ls - 32) in fp32 (scales: nsb x 8) of the nsb IQ4_XS
 * super-blocks at src, over the team of nthreads. */
void rlm_iq4xs_scales(const uint8_t *src, int64_t nsb, float *scales, int32_t nthreads) {
    Iq4xsJob j = {src, nsb, scales};
    run_parallel(iq4xs_job, &j, nthreads < 1 ? 1 : nthreads);
}

/* Q5_0: a block of 22 bytes is d (fp16), qh (element j's fifth bit: bit j), and 16 bytes of
 * nibbles (byte j: element j low, element 16 + j high); value = (nibble | bit << 4) - 16. */

typedef struct {
    const uint8_t *src;
    int64_t nblocks;
    int8_t *q;
    uint16_t *d;
} Q50Job;

static void q50_job(void *ctx, int tid, int nth) {
    const Q50Job *j = (const Q50Job *)ctx;
    const int64_t b0 = j->nblocks * tid / nth, b1 = j->nblocks * (tid + 1) / nth;
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *p = j->src + 22 * b;
        int8_t *out = j->q + 32 * b;
        uint32_t qh;
        memcpy(&j->d[b], p, 2);
        memcpy(&qh, p + 2, 4);
        for (int i = 0; i < 16; i++) {
            out[i] = (int8_t)(((p[6 + i] & 15) | ((qh >> i) & 1) << 4) - 16);
            out[16 + i] = (int8_t)(((p[6 + i] >> 4) | ((qh >> (16 + i)) & 1) << 4) - 16);
        }
    }
}

/* nblocks Q5_0 blocks at src as Q8_0's int8 values q (nblocks * 32) and fp16 scales d
 * (nblocks: the file's), split over the team of nthreads. */
void rlm_q5_0_values(const uint8_t *src, int64_t nblocks, int8_t *q, uint16_t *d,
                     int32_t nthreads) {
    Q50Job j = {src, nblocks, q, d};
    run_parallel(q50_job, &j, nthreads < 1 ? 1 : nthreads);
}
