/* exp, softmax sums, the MLP's gate activations (SiLU, gelu-tanh). Vectorized exp (the
 * scalar expf per position and per MLP value dominated attention and the activation). */
#include "rlm.h"

#ifdef AV_W
/* The steps of exp where the two widths differ: rounding to the nearest integer, and
 * p 2^n (AVX-512 has scalef; AVX2 builds 2^n in the exponent bits, for n in [-126, 127],
 * so there x is also capped at 88.3; x >= -87.3 keeps n >= -126). */
#if AV_W == 16
static inline __m512 round_nearest(__m512 x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline __m512 cap_exp_arg(__m512 x) { return x; }
static inline __m512 times_exp2(__m512 p, __m512 n) { return _mm512_scalef_ps(p, n); }
#else
static inline __m256 round_nearest(__m256 x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline __m256 cap_exp_arg(__m256 x) { return _mm256_min_ps(x, _mm256_set1_ps(88.3f)); }
static inline __m256 times_exp2(__m256 p, __m256 n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* exp(x) for AV_W lanes (x <= 0 here: scores minus their max): 2^n * p(r) with
 * r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6 polynomial, ~2 ulp; -inf and very
 * negative x give 0. The scalar expf per position was half the attention time. */
static inline avec vexp(avec x) {
    x = cap_exp_arg(AV_MAX(x, AV_SET1(-87.3f)));
    avec n = round_nearest(AV_MUL(x, AV_SET1(1.44269504089f)));
    avec r = AV_FNMADD(n, AV_SET1(0.693359375f), x);
    r = AV_FNMADD(n, AV_SET1(-2.12194440e-4f), r);
    avec pl = AV_SET1(1.3981999507e-3f);
    pl = AV_FMA(pl, r, AV_SET1(8.3334519073e-3f));
    pl = AV_FMA(pl, r, AV_SET1(4.1665795894e-2f));
    pl = AV_FMA(pl, r, AV_SET1(1.6666665459e-1f));
    pl = AV_FMA(pl, r, AV_SET1(5.0000001201e-1f));
    pl = AV_FMA(pl, AV_MUL(r, r), AV_ADD(r, AV_SET1(1.f)));
    return times_exp2(pl, n);
}

/* sc[0 .. count) = exp(sc - mx); returns their sum. */
static inline float exp_sum(float *sc, int64_t count, float mx) {
    avec m = AV_SET1(mx), acc = AV_ZERO();
    int64_t j = 0;
    for (; j + AV_W <= count; j += AV_W) {
        avec e = vexp(AV_SUB(AV_LOADU(sc + j), m));
        AV_STOREU(sc + j, e);
        acc = AV_ADD(acc, e);
    }
#if AV_W == 16 /* the tail as one masked vector */
    if (j < count) {
        __mmask16 k = (__mmask16)((1u << (count - j)) - 1);
        __m512 e = vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + j), m));
        _mm512_mask_storeu_ps(sc + j, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(acc);
#else /* the tail in scalars */
    float sum = hsum256(acc);
    for (; j < count; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
#endif
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
#endif

/* The gate activations as x sigmoid(a): SiLU a = x; gelu-tanh 0.5 x (1 + tanh(z)) =
 * x sigmoid(2 z), z = sqrt(2 / pi) (x + 0.044715 x^3) (PyTorch's "tanh" approximation). */
#define GELU_C1 1.5957691216057308f /* 2 sqrt(2 / pi) */
#define GELU_C2 0.044715f
static inline float act_one(float g, int gelu) {
    const float a = gelu ? GELU_C1 * (g + GELU_C2 * g * g * g) : g;
    return g / (1.f + expf(-a));
}

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* out = act(g) * u = g sigmoid(a) u over n values (act_one). */
static void act_mul(const float *g, const float *u, int n, float *out, int gelu) {
    int i = 0;
    const __m512 c1 = _mm512_set1_ps(GELU_C1), c2 = _mm512_set1_ps(GELU_C2);
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 av = gelu ? _mm512_mul_ps(c1, _mm512_fmadd_ps(_mm512_mul_ps(c2, gv),
                                                             _mm512_mul_ps(gv, gv), gv))
                         : gv;
        /* vexp wants x <= 0 for range: exp(-|a|), then the sigmoid from the sign */
        __m512 e = vexp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(av)));
        __m512 one = _mm512_set1_ps(1.f);
        __mmask16 pos = _mm512_cmp_ps_mask(av, _mm512_setzero_ps(), _CMP_GE_OQ);
        /* sigmoid(a) = 1 / (1 + e) for a >= 0, e / (1 + e) for a < 0 */
        __m512 num = _mm512_mask_blend_ps(pos, e, one);
        __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = act_one(g[i], gelu) * u[i];
}

#elif defined(RLM_AVX2)
static void act_mul(const float *g, const float *u, int n, float *out, int gelu) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256 c1 = _mm256_set1_ps(GELU_C1), c2 = _mm256_set1_ps(GELU_C2);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 av = gelu ? _mm256_mul_ps(c1, _mm256_fmadd_ps(_mm256_mul_ps(c2, gv),
                                                             _mm256_mul_ps(gv, gv), gv))
                         : gv;
        __m256 e = vexp(_mm256_or_ps(_mm256_andnot_ps(sign, av), sign)); /* exp(-|a|) */
        __m256 pos = _mm256_cmp_ps(av, zero, _CMP_GE_OQ);
        __m256 num = _mm256_blendv_ps(e, one, pos);
        __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = act_one(g[i], gelu) * u[i];
}
#else
static void act_mul(const float *g, const float *u, int n, float *out, int gelu) {
    for (int i = 0; i < n; i++) out[i] = act_one(g[i], gelu) * u[i];
}
#endif
