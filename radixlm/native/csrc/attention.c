/* Attention of a step's tokens over their requests' positions, read in place through
 * req_to_token from the fp32, bf16 or int8 K/V pool. An int8 pool (KV_INT8) is read
 * dequantized in registers: each row's int8 values are widened to fp32 and its bf16 scale
 * folded into the score (q . k_j * ks_j) and into the softmax weight (p_j vs_j). */
#include "rlm.h"

/* The row scales of position j (1 where the pool has none). */
static inline float kv_scale(const uint16_t *scales, const int32_t *slots, int64_t j, int Hkv,
                             int g) {
    return scales ? bf16_to_f32(scales[(int64_t)slots[j] * Hkv + g]) : 1.f;
}

static inline float kv_at(const void *c, int64_t i, int32_t dtype) {
    if (dtype == KV_F32) return ((const float *)c)[i];
    if (dtype == KV_INT8) return (float)((const int8_t *)c)[i];
    return bf16_to_f32(((const uint16_t *)c)[i]);
}

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
    for (int i = 0; i < D; i++) acc += q[i] * kv_at(kc, off + i, dtype);
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
    for (int i = 0; i < D; i++) out[i] += w * kv_at(vc, off + i, dtype);
}

/* One query head over positions 0 .. p of its request (through req_to_token). */
static void attend_head(const float *q, const int32_t *slots, int64_t p, int g, int Hkv, int D,
                        float scale, const KVLayer *kv, float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        float s = dot_kv(q, kv->k, ((int64_t)slots[j] * Hkv + g) * D, D, kv->dtype) * scale;
        if (kv->ks) s *= kv_scale(kv->ks, slots, j, Hkv, g);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = 1.f / exp_sum(scores, p + 1, mx);
    for (int i = 0; i < D; i++) out[i] = 0.f;
    for (int64_t j = 0; j <= p; j++)
        axpy_kv(out, scores[j] * inv * kv_scale(kv->vs, slots, j, Hkv, g), kv->v,
                ((int64_t)slots[j] * Hkv + g) * D, D, kv->dtype);
}

#if defined(RLM_AVX2) && defined(__AVX512F__)
static inline __m512 load16_kv(const void *base, int64_t off, int32_t dtype) {
    if (dtype == KV_F32) return _mm512_loadu_ps((const float *)base + off);
    if (dtype == KV_INT8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)((const int8_t *)base + off))));
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#define AV_LOAD_KV load16_kv /* AV_W K/V values as fp32 */
#elif defined(RLM_AVX2)
#define AV_LOAD_KV load8_kv
#endif

#ifdef AV_W
#if AV_W == 16
/* r[j] = the sum of a[j]'s 16 lanes, for 16 vectors at once, each in _mm512_reduce_add_ps's
 * tree (t_i = v_i + v_i+8, u_i = t_i + t_i+4, (u_0 + u_2) + (u_1 + u_3)): 15 additions and
 * 31 shuffles for 16 sums, and every sum the same bits as one reduced alone. */
static inline __m512 sum16_lanes(const __m512 *a) {
    __m512 u[8], v[4], w[2];
    for (int m = 0; m < 8; m++) /* [t(a_2m) | t(a_2m+1)] */
        u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xEE));
    for (int m = 0; m < 4; m++) /* 128-bit block b: u of a_4m+b */
        v[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0xDD));
    for (int m = 0; m < 2; m++) /* block b: w_0, w_1 of a_8m+b, then of a_8m+4+b */
        w[m] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * m], v[2 * m + 1], 0x44),
                             _mm512_shuffle_ps(v[2 * m], v[2 * m + 1], 0xEE));
    /* lane 4 b + c: the sum of a_b+4c */
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88),
                                   _mm512_shuffle_ps(w[0], w[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7,
                                                   11, 15), z);
}

/* Scores of nh (<= HB) query heads (q, D apart) over positions j0 .. j0 + 15 (nk <= 16 of
 * them) whose K rows kb holds in fp32 (D apart), times sj[0..nk): each score q . k_j as
 * NV lane-wise multiply-adds reduced in sum16_lanes' tree, whatever the block it is in. */
static inline __attribute__((always_inline)) void score_block(
    const int NV, const int HB, const float *q, int nh, const float *kb, int nk,
    const float *sj, float *scores, int64_t ss, int64_t j0, __m512 *mx) {
    const __mmask16 live = (__mmask16)((1u << nk) - 1);
    const __m512 sv = _mm512_maskz_loadu_ps(live, sj);
    for (int h = 0; h < HB; h++) {
        if (h >= nh) break;
        __m512 qv[NV], acc[16];
        for (int i = 0; i < NV; i++) qv[i] = _mm512_loadu_ps(q + h * 16 * NV + 16 * i);
        for (int jj = 0; jj < 16; jj++) {
            if (jj >= nk) {
                acc[jj] = _mm512_setzero_ps();
                continue;
            }
            const float *k = kb + jj * 16 * NV;
            acc[jj] = _mm512_mul_ps(qv[0], _mm512_load_ps(k));
            for (int i = 1; i < NV; i++) acc[jj] = _mm512_fmadd_ps(qv[i], _mm512_load_ps(k + 16 * i), acc[jj]);
        }
        const __m512 sc = _mm512_mul_ps(sum16_lanes(acc), sv);
        _mm512_mask_storeu_ps(scores + h * ss + j0, live, sc);
        mx[h] = _mm512_mask_max_ps(mx[h], live, mx[h], sc);
    }
}
#endif

/* nh (<= HB) query heads that share KV head g, D = AV_W NV: each K and V row is loaded once
 * for the group, and the outputs stay in registers across positions. Same numbers as
 * attend_head up to the order of the sums (512-bit: scores 16 positions at a time,
 * score_block). scores: nh rows of stride ss. */
static inline __attribute__((always_inline)) void attend_group(
    const int NV, const int HB, const float *q, int nh, const int32_t *slots, int64_t p, int g,
    int Hkv, float scale, const KVLayer *kv, float *scores, int64_t ss, float *out) {
    const int D = AV_W * NV;
    const int32_t dtype = kv->dtype;
    float mx[HB], inv[HB];
#if AV_W == 16
    float kb[16 * D] __attribute__((aligned(64))), sj[16];
    __m512 mxv[HB];
    for (int h = 0; h < HB; h++) mxv[h] = _mm512_set1_ps(-INFINITY);
    for (int64_t j0 = 0; j0 <= p; j0 += 16) {
        const int nk = p + 1 - j0 < 16 ? (int)(p + 1 - j0) : 16;
        for (int jj = 0; jj < nk; jj++) {
            const int64_t off = ((int64_t)slots[j0 + jj] * Hkv + g) * D;
            for (int i = 0; i < NV; i++) _mm512_store_ps(kb + jj * D + 16 * i, load16_kv(kv->k, off + 16 * i, dtype));
            sj[jj] = kv->ks ? scale * kv_scale(kv->ks, slots, j0 + jj, Hkv, g) : scale;
        }
        score_block(NV, HB, q, nh, kb, nk, sj, scores, ss, j0, mxv);
    }
    for (int h = 0; h < HB; h++) mx[h] = _mm512_reduce_max_ps(mxv[h]);
#else
    for (int h = 0; h < HB; h++) mx[h] = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        const float sj = kv->ks ? scale * kv_scale(kv->ks, slots, j, Hkv, g) : scale;
        avec kr[NV];
        for (int i = 0; i < NV; i++) kr[i] = AV_LOAD_KV(kv->k, off + AV_W * i, dtype);
        for (int h = 0; h < HB; h++) {
            if (h >= nh) break;
            avec acc = AV_MUL(AV_LOADU(q + h * D), kr[0]);
            for (int i = 1; i < NV; i++)
                acc = AV_FMA(AV_LOADU(q + h * D + AV_W * i), kr[i], acc);
            float sc = AV_SUM(acc) * sj;
            scores[h * ss + j] = sc;
            mx[h] = sc > mx[h] ? sc : mx[h];
        }
    }
#endif
    for (int h = 0; h < nh; h++) inv[h] = 1.f / exp_sum(scores + h * ss, p + 1, mx[h]);
    avec o[HB][NV];
    for (int h = 0; h < HB; h++)
        for (int i = 0; i < NV; i++) o[h][i] = AV_ZERO();
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        const float vj = kv_scale(kv->vs, slots, j, Hkv, g);
        avec w[HB];
        for (int h = 0; h < HB; h++)
            if (h < nh) w[h] = AV_SET1(kv->vs ? scores[h * ss + j] * vj : scores[h * ss + j]);
        for (int i = 0; i < NV; i++) {
            avec vv = AV_LOAD_KV(kv->v, off + AV_W * i, dtype);
            for (int h = 0; h < HB; h++)
                if (h < nh) o[h][i] = AV_FMA(w[h], vv, o[h][i]);
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
                         int Hkv, int D, float scale, const KVLayer *kv, float *scores,
                         float *out) {
    const int64_t ss = p + 16;
#if defined(RLM_AVX2) && defined(__AVX512F__)
    if (D == 64) {
        for (int h = 0; h < nh; h += 4)
            attend_group(4, 4, q + h * D, nh - h < 4 ? nh - h : 4, slots, p, g, Hkv, scale,
                         kv, scores, ss, out + h * D);
        return;
    }
    if (D == 128) {
        for (int h = 0; h < nh; h += 2)
            attend_group(8, 2, q + h * D, nh - h < 2 ? nh - h : 2, slots, p, g, Hkv, scale,
                         kv, scores, ss, out + h * D);
        return;
    }
#elif defined(RLM_AVX2)
    if (D == 64) { /* 8 vectors of K or V per row, one head at a time: 16 registers */
        for (int h = 0; h < nh; h++)
            attend_group(8, 1, q + h * D, 1, slots, p, g, Hkv, scale, kv, scores, ss,
                         out + h * D);
        return;
    }
#endif
    (void)ss;
    for (int h = 0; h < nh; h++)
        attend_head(q + h * D, slots, p, g, Hkv, D, scale, kv, scores, out + h * D);
}

/* Quantize one head's row x [D] of K or V into the int8 pool: q = rne(x / s) clamped to
 * +-127 with s = bf16(max|x| / 127), the same bytes as radixlm.kernels.ref.quantize_kv. */
static void quantize_kv_row(const float *x, int D, int8_t *q, uint16_t *scale) {
    float amax = 0.f;
    for (int i = 0; i < D; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    const uint16_t sb = f32_to_bf16(amax / 127.f);
    const float s = bf16_to_f32(sb), inv = s > 0.f ? 1.f / s : 0.f;
    for (int i = 0; i < D; i++) {
        float r = nearbyintf(x[i] * inv);
        q[i] = (int8_t)(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
    }
    *scale = sb;
}

/* Store one token's K or V (x: Hkv heads of D) at pool slot `slot` of `cache` (with its
 * row scales for KV_INT8) in the pool's format. */
static void store_kv_token(void *cache, uint16_t *scales, int32_t dtype, int64_t slot,
                           const float *x, int Hkv, int D) {
    const int64_t off = slot * Hkv * D;
    if (dtype == KV_F32) {
        memcpy((float *)cache + off, x, (size_t)Hkv * D * 4);
    } else if (dtype == KV_INT8) {
        for (int h = 0; h < Hkv; h++)
            quantize_kv_row(x + h * D, D, (int8_t *)cache + off + h * D,
                            scales + slot * Hkv + h);
    } else {
        uint16_t *out = (uint16_t *)cache + off;
        for (int i = 0; i < Hkv * D; i++) out[i] = f32_to_bf16(x[i]);
    }
}
