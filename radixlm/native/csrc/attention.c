/* Attention of a step's tokens over their requests' positions, read in place through
 * req_to_token from the fp32 or bf16 K/V pool. */
#include "rlm.h"

static inline float dot_kv(const float *q, const void *kc, int64_t off, int D, int32_t dtype) {
#ifdef RLM_AVX2
    if ((D & 7) == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < D; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8_kv(kc, off + i, dtype), acc);
        return hsum256(acc);
    }
#endif
    float acc = 0.f;
    for (int i = 0; i < D; i++)
        acc += q[i] * (dtype == KV_F32 ? ((const float *)kc)[off + i]
                                       : bf16_to_f32(((const uint16_t *)kc)[off + i]));
    return acc;
}

static inline void axpy_kv(float *out, float w, const void *vc, int64_t off, int D,
                           int32_t dtype) {
#ifdef RLM_AVX2
    if ((D & 7) == 0) {
        __m256 wv = _mm256_set1_ps(w);
        for (int i = 0; i < D; i += 8)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, load8_kv(vc, off + i, dtype),
                                                      _mm256_loadu_ps(out + i)));
        return;
    }
#endif
    for (int i = 0; i < D; i++)
        out[i] += w * (dtype == KV_F32 ? ((const float *)vc)[off + i]
                                       : bf16_to_f32(((const uint16_t *)vc)[off + i]));
}

/* One query head over positions 0 .. p of its request (through req_to_token). */
static void attend_head(const float *q, const int32_t *slots, int64_t p, int g, int Hkv, int D,
                        float scale, const void *kc, const void *vc, int32_t dtype,
                        float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        float s = dot_kv(q, kc, ((int64_t)slots[j] * Hkv + g) * D, D, dtype) * scale;
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = 1.f / exp_sum(scores, p + 1, mx);
    for (int i = 0; i < D; i++) out[i] = 0.f;
    for (int64_t j = 0; j <= p; j++)
        axpy_kv(out, scores[j] * inv, vc, ((int64_t)slots[j] * Hkv + g) * D, D, dtype);
}

#if defined(RLM_AVX2) && defined(__AVX512F__)
static inline __m512 load16_kv(const void *base, int64_t off, int32_t dtype) {
    if (dtype == KV_F32) return _mm512_loadu_ps((const float *)base + off);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#define AV_LOAD_KV load16_kv /* AV_W K/V values as fp32 */
#elif defined(RLM_AVX2)
#define AV_LOAD_KV load8_kv
#endif

#ifdef AV_W
/* nh (<= HB) query heads that share KV head g, D = AV_W NV: each K and V row is loaded once
 * for the group, and the outputs stay in registers across positions. Same numbers as
 * attend_head up to the order of the sums. scores: nh rows of stride ss. */
static inline __attribute__((always_inline)) void attend_group(
    const int NV, const int HB, const float *q, int nh, const int32_t *slots, int64_t p, int g,
    int Hkv, float scale, const void *kc, const void *vc, int32_t dtype, float *scores,
    int64_t ss, float *out) {
    const int D = AV_W * NV;
    float mx[HB], inv[HB];
    for (int h = 0; h < HB; h++) mx[h] = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        avec kv[NV];
        for (int i = 0; i < NV; i++) kv[i] = AV_LOAD_KV(kc, off + AV_W * i, dtype);
        for (int h = 0; h < HB; h++) {
            if (h >= nh) break;
            avec acc = AV_MUL(AV_LOADU(q + h * D), kv[0]);
            for (int i = 1; i < NV; i++)
                acc = AV_FMA(AV_LOADU(q + h * D + AV_W * i), kv[i], acc);
            float sc = AV_SUM(acc) * scale;
            scores[h * ss + j] = sc;
            mx[h] = sc > mx[h] ? sc : mx[h];
        }
    }
    for (int h = 0; h < nh; h++) inv[h] = 1.f / exp_sum(scores + h * ss, p + 1, mx[h]);
    avec o[HB][NV];
    for (int h = 0; h < HB; h++)
        for (int i = 0; i < NV; i++) o[h][i] = AV_ZERO();
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        for (int i = 0; i < NV; i++) {
            avec vv = AV_LOAD_KV(vc, off + AV_W * i, dtype);
            for (int h = 0; h < HB; h++)
                if (h < nh) o[h][i] = AV_FMA(AV_SET1(scores[h * ss + j]), vv,
                                                      o[h][i]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < NV; i++)
            AV_STOREU(out + h * D + AV_W * i, AV_MUL(o[h][i], AV_SET1(inv[h])));
}
#endif


/* Query heads h0 .. h0 + nh - 1 of one token (q and out: those heads, D apart), all in KV
 * group g. scores: nh * (p + 16) floats. */
static void attend_heads(const float *q, int nh, const int32_t *slots, int64_t p, int g,
                         int Hkv, int D, float scale, const void *kc, const void *vc,
                         int32_t dtype, float *scores, float *out) {
    const int64_t ss = p + 16;
#if defined(RLM_AVX2) && defined(__AVX512F__)
    if (D == 64) {
        for (int h = 0; h < nh; h += 4)
            attend_group(4, 4, q + h * D, nh - h < 4 ? nh - h : 4, slots, p, g, Hkv, scale,
                             kc, vc, dtype, scores, ss, out + h * D);
        return;
    }
    if (D == 128) {
        for (int h = 0; h < nh; h += 2)
            attend_group(8, 2, q + h * D, nh - h < 2 ? nh - h : 2, slots, p, g, Hkv, scale,
                             kc, vc, dtype, scores, ss, out + h * D);
        return;
    }
#elif defined(RLM_AVX2)
    if (D == 64) { /* 8 vectors of K or V per row, one head at a time: 16 registers */
        for (int h = 0; h < nh; h++)
            attend_group(8, 1, q + h * D, 1, slots, p, g, Hkv, scale, kc, vc, dtype,
                             scores, ss, out + h * D);
        return;
    }
#endif
    (void)ss;
    for (int h = 0; h < nh; h++)
        attend_head(q + h * D, slots, p, g, Hkv, D, scale, kc, vc, dtype, scores, out + h * D);
}
