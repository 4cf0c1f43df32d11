/* Q4/Q8 block formats (K-quants: kquants.c): activations to int8 blocks, weight rows dequantized to fp32 or bf16,
 * weight rows prefetched ahead of use. */
#include "rlm.h"

/* ------------------------------------------------------------------ quantization */
/* Two block sizes, one rule: for each block of 32 (the Q4 / Q8 weights' activations) or of
 * 256 (the K-quants', llama.cpp's Q8_K), d = amax / 127 and a = x * (1 / d) rounded to
 * nearest even, clamped to +-127 (the same float operations in both versions, so the same
 * bytes on every build).
 * quantize_row: x [k] -> a [k] int8, dx [k/32], sx [k/32] (= dx * sum a).
 * quantize_row_k: x [k] -> a [k] int8, kd [k/256], kb [k/16] (int16 sums of a by 16; a
 * K-quant kernel's scales and m terms then apply in integers). */
#ifdef RLM_AVX2
/* 32 values x rounded with 1 / d = id into a [32]; the int32 sums of its two halves. */
static inline void quantize_32(const float *x, float id, int8_t *a, int *s0, int *s1) {
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo the packs' lanes */
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), idv)); /* nearest even */
        q[i] = _mm256_max_epi32(_mm256_min_epi32(q[i], lim), nlim);
    }
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                       _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)a, _mm256_permutevar8x32_epi32(bytes, order));
    int sums[2];
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        sums[h] = _mm_cvtsi128_si32(s4);
    }
    *s0 = sums[0];
    *s1 = sums[1];
}

static inline float amax_of(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#else
static inline void quantize_32(const float *x, float id, int8_t *a, int *s0, int *s1) {
    int sum[2] = {0, 0};
    for (int j = 0; j < 32; j++) {
        int v = (int)lrintf(x[j] * id);
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        a[j] = (int8_t)v;
        sum[j / 16] += v;
    }
    *s0 = sum[0];
    *s1 = sum[1];
}

static inline float amax_of(const float *x, int n) {
    float amax = 0.f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}
#endif

static void quantize_row(const float *x, int k, int8_t *a, float *dx, float *sx) {
    for (int b = 0; b < k / 32; b++) {
        const float d = amax_of(x + 32 * b, 32) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int s0, s1;
        quantize_32(x + 32 * b, id, a + 32 * b, &s0, &s1);
        dx[b] = d;
        sx[b] = d * (float)(s0 + s1);
    }
}

static void quantize_row_k(const float *x, int k, int8_t *a, float *kd, int16_t *kb) {
    for (int s = 0; s < k / 256; s++) {
        const float d = amax_of(x + 256 * s, 256) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int b = 8 * s; b < 8 * s + 8; b++) {
            int s0, s1;
            quantize_32(x + 32 * b, id, a + 32 * b, &s0, &s1);
            kb[2 * b] = (int16_t)s0;
            kb[2 * b + 1] = (int16_t)s1;
        }
        kd[s] = d;
    }
}

#ifdef RLM_CHUNK
/* The block a lane of the int8 kernel's chunk holds: lane l of a chunk of RLM_CHUNK blocks
 * is block (RLM_CHUNK / 4) (l % 4) + l / 4, the order in-lane 4 x 4 transposes of the
 * weights give (see chunk_steps in matmul_i8.c). */
static inline int chunk_block(int l) { return RLM_CHUNK / 4 * (l % 4) + l / 4; }

/* One token's int8 blocks a [nb * 32] and scales dx [nb] rearranged in place for the Q4
 * kernels: each full chunk of RLM_CHUNK blocks as 8 steps of RLM_CHUNK x 4 bytes, step s
 * holding elements 4s .. 4s + 3 of the chunk's blocks in lane order, and the chunk's scales
 * in lane order; a last partial chunk (and the block sums) as quantize_row wrote them. */
static void interleave_act(int8_t *a, float *dx, int nb) {
    for (int c = 0; c + RLM_CHUNK <= nb; c += RLM_CHUNK) {
        int32_t src[8 * RLM_CHUNK], dst[8 * RLM_CHUNK];
        float d[RLM_CHUNK];
        memcpy(src, a + c * 32, sizeof src);
        memcpy(d, dx + c, sizeof d);
        for (int l = 0; l < RLM_CHUNK; l++) {
            for (int s = 0; s < 8; s++) dst[s * RLM_CHUNK + l] = src[chunk_block(l) * 8 + s];
            dx[c + l] = d[chunk_block(l)];
        }
        memcpy(a + c * 32, dst, sizeof dst);
    }
}
#endif

/* ------------------------------------------------------------------ dequantization */
#ifdef RLM_AVX2
/* 8 floats of weights w[j0 .. j0+7] of a Q4 block (q in 0..15, unscaled) */
static inline __m256 q4_f8(__m128i nib, int part) {
    /* part 0: elements 0-7, 1: 8-15 (low nibbles), 2: 16-23, 3: 24-31 (high nibbles) */
    __m128i v = part < 2 ? _mm_and_si128(nib, _mm_set1_epi8(0x0f))
                         : _mm_and_si128(_mm_srli_epi16(nib, 4), _mm_set1_epi8(0x0f));
    if (part & 1) v = _mm_srli_si128(v, 8);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}
#endif

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* Block b of a Q4 (q in 0..15, unscaled) or Q8 row as fp32: elements 0-15 and 16-31. */
static inline void block_f32(const QMat *w, const uint8_t *wq, int b, __m512 *lo, __m512 *hi) {
    if (w->fmt == FMT_Q4) {
        const __m128i mask = _mm_set1_epi8(0x0f);
        __m128i v = _mm_loadu_si128((const __m128i *)(wq + b * 16));
        *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
        *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
    } else {
        *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(wq + b * 32))));
        *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(wq + b * 32 + 16))));
    }
}
#endif

/* Row n dequantized to fp32 (W = d q + m; dense rows converted) into out[k]. */
static void dequant_row(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                        int nb, float *out) {
    if (is_dense(w)) {
        dense_row_f32(w, wq, nb * 32, out);
        return;
    }
    if (is_kquant(w)) {
        kq_dequant_row(w, wq, out);
        return;
    }
    for (int b = 0; b < nb; b++) {
        float d = H(wd[b]), m = wm ? H(wm[b]) : 0.f;
#if defined(RLM_AVX2) && defined(__AVX512F__)
        __m512 lo, hi;
        block_f32(w, wq, b, &lo, &hi);
        __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
        _mm512_store_ps(out + b * 32, _mm512_fmadd_ps(lo, dv, mv));
        _mm512_store_ps(out + b * 32 + 16, _mm512_fmadd_ps(hi, dv, mv));
#elif defined(RLM_AVX2)
        __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
        for (int p = 0; p < 4; p++) {
            __m256 f = w->fmt == FMT_Q4
                ? q4_f8(_mm_loadu_si128((const __m128i *)(wq + b * 16)), p)
                : _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                      _mm_loadl_epi64((const __m128i *)(wq + b * 32 + p * 8))));
            _mm256_store_ps(out + b * 32 + p * 8, _mm256_fmadd_ps(f, dv, mv));
        }
#else
        for (int j = 0; j < 16 && w->fmt == FMT_Q4; j++) {
            out[b * 32 + j] = d * (float)(wq[b * 16 + j] & 0x0f) + m;
            out[b * 32 + j + 16] = d * (float)(wq[b * 16 + j] >> 4) + m;
        }
        for (int j = 0; j < 32 && w->fmt == FMT_Q8; j++)
            out[b * 32 + j] = d * (float)(int8_t)wq[b * 32 + j];
#endif
    }
}

#ifdef RLM_BF16
/* fp32 [k] -> bf16 [k] (k % 32 == 0), round to nearest even as torch does. */
static inline void to_bf16(const float *x, int k, uint16_t *out) {
    for (int j = 0; j < k; j += 32)
        _mm512_storeu_si512(out + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16),
                                                                 _mm512_loadu_ps(x + j)));
}

/* Row n dequantized (W = d q + m) straight to bf16, nearest even (dense rows copied or
 * rounded). Q4 blocks by table: the
 * 16 values d q + m (q = 0..15) rounded once, then one word permute looks up all 32
 * nibbles (the same fused multiply-add and rounding per value as converting each weight,
 * in a third fewer 512-bit instructions). */
static void dequant_row_bf16(const QMat *w, const uint8_t *wq, const f16 *wd,
                             const f16 *wm, int nb, uint16_t *out) {
    if (w->fmt == FMT_BF16) {
        memcpy(out, wq, (size_t)nb * 64);
        return;
    }
    if (w->fmt == FMT_F32) {
        to_bf16((const float *)wq, nb * 32, out);
        return;
    }
    if (is_kquant(w)) { /* the fp32 values (as gguf-py's), rounded to bf16 */
        float f[nb * 32] __attribute__((aligned(64)));
        kq_dequant_row(w, wq, f);
        to_bf16(f, nb * 32, out);
        return;
    }
#ifdef __AVX512BW__
    if (w->fmt == FMT_Q4) {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m256i nib = _mm256_set1_epi16(0x0f);
        for (int b = 0; b < nb; b++) {
            __m512 vals = _mm512_fmadd_ps(iota, _mm512_set1_ps(H(wd[b])),
                                          _mm512_set1_ps(H(wm[b])));
            __m512i table = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(vals));
            __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(wq + b * 16)));
            __m512i idx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_and_si256(q, nib)), _mm256_srli_epi16(q, 4), 1);
            _mm512_store_si512(out + b * 32, _mm512_permutexvar_epi16(idx, table));
        }
        return;
    }
#endif
    for (int b = 0; b < nb; b++) {
        __m512 lo, hi, dv = _mm512_set1_ps(H(wd[b])), mv = _mm512_set1_ps(wm ? H(wm[b]) : 0.f);
        block_f32(w, wq, b, &lo, &hi);
        _mm512_store_si512(out + b * 32, (__m512i)_mm512_cvtne2ps_pbh(
            _mm512_fmadd_ps(hi, dv, mv), _mm512_fmadd_ps(lo, dv, mv)));
    }
}
#endif

/* Ask for rows [n, n + count) of w ahead of use: decode streams every weight from DRAM
 * once per step, and the hardware prefetcher alone left the kernels latency-bound. */
static inline __attribute__((always_inline)) void prefetch_rows(const QMat *w, int n, int count,
                                                             int n_end) {
#ifdef RLM_AVX2
    if (n >= n_end) return;
    if (n + count > n_end) count = n_end - n;
    const int nb = w->k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    prefetch_bytes(w->qs + (int64_t)n * row_bytes, row_bytes * count);
    if (is_dense(w) || is_kquant(w)) return; /* (K-quant scales are in the rows) */
    prefetch_bytes(w->d + (int64_t)n * nb, (int64_t)nb * count * 2);
    if (w->fmt == FMT_Q4) prefetch_bytes(w->m + (int64_t)n * nb, (int64_t)nb * count * 2);
#else
    (void)w, (void)n, (void)count, (void)n_end;
#endif
}

static inline const f16 *wm_of(const QMat *w, int n, int nb) {
    return w->fmt == FMT_Q4 ? w->m + (int64_t)n * nb : NULL;
}
