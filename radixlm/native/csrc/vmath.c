/* exp, softmax sums, SiLU. Vectorized exp (the scalar expf per position and per MLP value
 * dominated attention and the activation). */
#include "rlm.h"

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* exp(x) for 16 lanes (x <= 0 here: scores minus their max): 2^n * p(r) with
 * r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6 polynomial, ~2 ulp; -inf and very
 * negative x give 0. The scalar expf per position was half the attention time. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 pl = _mm512_set1_ps(1.3981999507e-3f);
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(8.3334519073e-3f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(4.1665795894e-2f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.6666665459e-1f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(5.0000001201e-1f));
    pl = _mm512_fmadd_ps(pl, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(pl, n);
}

/* sc[0 .. count) = exp(sc - mx); returns their sum. */
static inline float exp_sum(float *sc, int64_t count, float mx) {
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= count; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sc + j), m));
        _mm512_storeu_ps(sc + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < count) {
        __mmask16 k = (__mmask16)((1u << (count - j)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + j), m));
        _mm512_mask_storeu_ps(sc + j, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(acc);
}

/* out = silu(g) * u = g / (1 + exp(-g)) * u over n values. */
static void silu_mul(const float *g, const float *u, int n, float *out) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        /* exp512 wants x <= 0 for range: exp(-|g|), then silu from the sign */
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
        __m512 one = _mm512_set1_ps(1.f);
        __mmask16 pos = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ);
        /* sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0 */
        __m512 num = _mm512_mask_blend_ps(pos, e, one);
        __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

#elif defined(RLM_AVX2)
/* exp(x) for 8 lanes: the same reduction and polynomial as exp512 (AVX2 has no scalef:
 * 2^n is built in the exponent bits). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 pl = _mm256_set1_ps(1.3981999507e-3f);
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(8.3334519073e-3f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(4.1665795894e-2f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.6666665459e-1f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(5.0000001201e-1f));
    pl = _mm256_fmadd_ps(pl, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    /* 2^n for n in [-126, 127] as exponent bits; x >= -87.3 keeps n >= -126 */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(pl, _mm256_castsi256_ps(e));
}

static inline float exp_sum(float *sc, int64_t count, float mx) {
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), m));
        _mm256_storeu_ps(sc + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum256(acc);
    for (; j < count; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

static void silu_mul(const float *g, const float *u, int n, float *out) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_or_ps(_mm256_andnot_ps(sign, gv), sign)); /* exp(-|g|) */
        __m256 pos = _mm256_cmp_ps(gv, zero, _CMP_GE_OQ);
        __m256 num = _mm256_blendv_ps(e, one, pos);
        __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}
#else
static inline float exp_sum(float *sc, int64_t count, float mx) {
    float sum = 0.f;
    for (int64_t j = 0; j < count; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

static void silu_mul(const float *g, const float *u, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}
#endif
