/* Attention of a step's tokens over their requests' positions, read in place through
 * req_to_token from the fp32, bf16 or int8 K/V pool. An int8 pool (KV_INT8) is read
 * dequantized in registers: each row's int8 values are widened to fp32 and its bf16 scale
 * folded into the score (q . k_j * ks_j) and into the softmax weight (p_j vs_j). */
#include "rlm.h"

/* Gemma 2's soft-cap of a score: cap tanh(s / cap). */
static inline float capped(float s, float cap) { return cap * tanhf(s / cap); }

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
        if (kv->softcap) s = capped(s, kv->softcap);
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

#if defined(AV_W) && AV_W == 16
/* ------------------------------------------------------------------ 512-bit: blocks
 * Every step (one token or a prompt's slice) runs attend_tokens: a KV group's K and then V
 * rows widened to fp32 ATT_KC positions at a time, once for the tokens and heads that read
 * them; scores 16 positions at a time reduced in one transposed tree; the outputs a
 * position at a time in registers. A score, a maximum, an exponential and an output are the
 * same operations in the same order whatever the tokens, heads and positions a call takes,
 * so a token's bits do not depend on its step. */
#define ATT_KC 64 /* positions widened at a time (a multiple of 16) */

/* r[j] = the sum of a[j]'s 16 lanes, for 16 vectors at once, each in _mm512_reduce_add_ps's
 * tree (t_i = v_i + v_i+8, u_i = t_i + t_i+4, (u_0 + u_2) + (u_1 + u_3)): 15 additions and
 * 31 shuffles for 16 sums, every sum the same bits as one reduced alone. */
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

/* capped for 16 scores: cap tanh(s / cap), tanh from vexp(-2 |x|) with x's sign. */
static inline __m512 capped16(__m512 s, float cap) {
    const __m512 x = _mm512_div_ps(s, _mm512_set1_ps(cap)), one = _mm512_set1_ps(1.f);
    const __m512 e = vexp(_mm512_mul_ps(_mm512_set1_ps(-2.f), _mm512_abs_ps(x)));
    const __m512 th = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    const __m512 signed_th = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(th), sign));
    return _mm512_mul_ps(signed_th, _mm512_set1_ps(cap));
}

/* One head's scores (q: D = 16 NV values) over nk <= 16 positions whose fp32 K rows kb
 * holds (D apart), times sj[0..nk): q . k as NV lane-wise multiply-adds, reduced in
 * sum16_lanes' tree; stored at sc, and the running maximum *mx. */
static inline __attribute__((always_inline)) void score_block(
    const int NV, const float *q, const float *kb, int nk, const float *sj, float cap,
    float *sc, __m512 *mx) {
    const __mmask16 live = (__mmask16)((1u << nk) - 1);
    __m512 qv[16], acc[16]; /* (fixed sizes: registers once NV is a constant; a VLA stays in memory) */
    for (int i = 0; i < NV; i++) qv[i] = _mm512_loadu_ps(q + 16 * i);
    for (int jj = 0; jj < 16; jj++) {
        if (jj >= nk) {
            acc[jj] = _mm512_setzero_ps();
            continue;
        }
        const float *k = kb + jj * 16 * NV;
        acc[jj] = _mm512_mul_ps(qv[0], _mm512_load_ps(k));
        for (int i = 1; i < NV; i++) acc[jj] = _mm512_fmadd_ps(qv[i], _mm512_load_ps(k + 16 * i), acc[jj]);
    }
    __m512 s = _mm512_mul_ps(sum16_lanes(acc), _mm512_maskz_loadu_ps(live, sj));
    if (cap) s = capped16(s, cap);
    _mm512_mask_storeu_ps(sc, live, s);
    *mx = _mm512_mask_max_ps(*mx, live, *mx, s);
}

/* HB heads' outputs (ot, D = 16 NV apart, fp32) += w_h,j v_j over positions j < n in
 * order: w_h,j = sc[h ss + j] (times vj[j] where vj is given), v_j the fp32 rows vb (D
 * apart). The HB x NV sums stay in registers across the positions. */
static inline __attribute__((always_inline)) void pv_heads(
    const int NV, const int HB, const float *vb, const float *vj, const float *sc, int64_t ss,
    int n, float *ot) {
    const int D = 16 * NV;
    __m512 acc[4][16]; /* (fixed sizes, see score_block) */
    for (int h = 0; h < HB; h++)
        for (int i = 0; i < NV; i++) acc[h][i] = _mm512_load_ps(ot + h * D + 16 * i);
    for (int jj = 0; jj < n; jj++) {
        __m512 w[4];
        for (int h = 0; h < HB; h++)
            w[h] = _mm512_set1_ps(vj ? sc[h * ss + jj] * vj[jj] : sc[h * ss + jj]);
        for (int i = 0; i < NV; i++) {
            const __m512 vv = _mm512_load_ps(vb + jj * D + 16 * i);
            for (int h = 0; h < HB; h++) acc[h][i] = _mm512_fmadd_ps(w[h], vv, acc[h][i]);
        }
    }
    for (int h = 0; h < HB; h++)
        for (int i = 0; i < NV; i++) _mm512_store_ps(ot + h * D + 16 * i, acc[h][i]);
}

/* Positions c0 .. c0 + nc - 1 of KV group g (K or V: c, its row scales cs) widened into
 * kb (fp32, D apart), and their scales into sj (K: scale times the row's; V: the row's). */
static inline void widen_rows(const int NV, const void *c, const uint16_t *cs, int32_t dtype,
                              const int32_t *slots, int64_t c0, int nc, int g, int Hkv,
                              float scale, float *kb, float *sj) {
    const int D = 16 * NV;
    for (int jj = 0; jj < nc; jj++) {
        const int64_t off = ((int64_t)slots[c0 + jj] * Hkv + g) * D;
        for (int i = 0; i < NV; i++) _mm512_store_ps(kb + jj * D + 16 * i, load16_kv(c, off + 16 * i, dtype));
        sj[jj] = cs ? scale * kv_scale(cs, slots, c0 + jj, Hkv, g) : scale;
    }
}

/* Tokens t0 .. t0 + nt - 1 of one request (queries q + t qs, positions pos[t], outputs out
 * + t os), nh heads each, all in KV group g (q's and out's heads D apart). scores: nt nh
 * (max pos + 16) floats; buf: ATT_KC D + D nh nt floats, 64-byte aligned. */
static inline __attribute__((always_inline)) void attend_tokens_nv(
    const int NV, const float *q, int64_t qs, int nt, const int64_t *pos, const int32_t *slots,
    int g, int Hkv, int nh, float scale, const KVLayer *kv, float *scores, float *buf,
    float *out, int64_t os) {
    const int D = 16 * NV, HB = NV <= 4 ? 4 : NV <= 8 ? 2 : 1, nr = nt * nh;
    int64_t pmax = 0;
    for (int t = 0; t < nt; t++) pmax = pos[t] > pmax ? pos[t] : pmax;
    const int64_t ss = pmax + 16;
    float *kb = buf, *o = buf + ATT_KC * D, sj[ATT_KC] __attribute__((aligned(64)));
    __m512 mx[nr];
    float inv[nr];
    for (int r = 0; r < nr; r++) mx[r] = _mm512_set1_ps(-INFINITY);
    for (int64_t c0 = 0; c0 <= pmax; c0 += ATT_KC) {
        const int nc = pmax + 1 - c0 < ATT_KC ? (int)(pmax + 1 - c0) : ATT_KC;
        widen_rows(NV, kv->k, kv->ks, kv->dtype, slots, c0, nc, g, Hkv, scale, kb, sj);
        for (int t = 0; t < nt; t++)
            for (int j0 = 0; j0 < nc && c0 + j0 <= pos[t]; j0 += 16) {
                const int nk = pos[t] + 1 - (c0 + j0) < 16 ? (int)(pos[t] + 1 - (c0 + j0)) : 16;
                for (int h = 0; h < nh; h++)
                    score_block(NV, q + t * qs + h * D, kb + j0 * D, nk, sj + j0, kv->softcap,
                                scores + (int64_t)(t * nh + h) * ss + c0 + j0, mx + t * nh + h);
            }
    }
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < nh; h++) {
            const int r = t * nh + h;
            inv[r] = 1.f / exp_sum(scores + (int64_t)r * ss, pos[t] + 1, _mm512_reduce_max_ps(mx[r]));
        }
    for (int i = 0; i < nr * D; i += 16) _mm512_store_ps(o + i, _mm512_setzero_ps());
    for (int64_t c0 = 0; c0 <= pmax; c0 += ATT_KC) {
        const int nc = pmax + 1 - c0 < ATT_KC ? (int)(pmax + 1 - c0) : ATT_KC;
        widen_rows(NV, kv->v, kv->vs, kv->dtype, slots, c0, nc, g, Hkv, 1.f, kb, sj);
        for (int t = 0; t < nt; t++) {
            const int n = pos[t] + 1 - c0 < nc ? (int)(pos[t] + 1 - c0) : nc;
            for (int h = 0, c; h < nh; h += c) { /* HB heads at a time, then the rest */
                const float *sc = scores + (int64_t)(t * nh + h) * ss + c0, *vj = kv->vs ? sj : NULL;
                float *ot = o + (int64_t)(t * nh + h) * D;
                c = nh - h < HB ? nh - h : HB;
                if (c == 4) pv_heads(NV, 4, kb, vj, sc, ss, n, ot);
                else if (c == 3) pv_heads(NV, 3, kb, vj, sc, ss, n, ot);
                else if (c == 2) pv_heads(NV, 2, kb, vj, sc, ss, n, ot);
                else pv_heads(NV, 1, kb, vj, sc, ss, n, ot);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < NV; i++)
                _mm512_storeu_ps(out + t * os + h * D + 16 * i,
                                 _mm512_mul_ps(_mm512_load_ps(o + (int64_t)(t * nh + h) * D + 16 * i),
                                               _mm512_set1_ps(inv[t * nh + h])));
}

/* attend_tokens_nv for D = 64, 96 (Phi-3's), 128 or 256 (Gemma's); 0 for other head sizes (attend_heads' per-position
 * path then). */
static int attend_tokens(const float *q, int64_t qs, int nt, const int64_t *pos,
                         const int32_t *slots, int g, int Hkv, int nh, int D, float scale,
                         const KVLayer *kv, float *scores, float *buf, float *out, int64_t os) {
    if (D == 64) attend_tokens_nv(4, q, qs, nt, pos, slots, g, Hkv, nh, scale, kv, scores, buf, out, os);
    else if (D == 96) attend_tokens_nv(6, q, qs, nt, pos, slots, g, Hkv, nh, scale, kv, scores, buf, out, os);
    else if (D == 128) attend_tokens_nv(8, q, qs, nt, pos, slots, g, Hkv, nh, scale, kv, scores, buf, out, os);
    else if (D == 256) attend_tokens_nv(16, q, qs, nt, pos, slots, g, Hkv, nh, scale, kv, scores, buf, out, os);
    else return 0;
    return 1;
}
#define RLM_ATT_TOKENS 4 /* tokens of one request an attention unit takes (attend_tokens) */
#define ATT_TOKENS_D(D) ((D) == 64 || (D) == 96 || (D) == 128 || (D) == 256) /* its head sizes */
#elif defined(AV_W)
/* nh (<= HB) query heads that share KV head g, D = AV_W NV: each K and V row is loaded once
 * for the group, and the outputs stay in registers across positions. Same numbers as
 * attend_head up to the order of the sums. scores: nh rows of stride ss. */
static inline __attribute__((always_inline)) void attend_group(
    const int NV, const int HB, const float *q, int nh, const int32_t *slots, int64_t p, int g,
    int Hkv, float scale, const KVLayer *kv, float *scores, int64_t ss, float *out) {
    const int D = AV_W * NV;
    const int32_t dtype = kv->dtype;
    float mx[4], inv[4]; /* (fixed sizes: registers once HB, NV are constants; a VLA stays in memory) */
    for (int h = 0; h < HB; h++) mx[h] = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        const float sj = kv->ks ? scale * kv_scale(kv->ks, slots, j, Hkv, g) : scale;
        avec kr[8];
        for (int i = 0; i < NV; i++) kr[i] = AV_LOAD_KV(kv->k, off + AV_W * i, dtype);
        for (int h = 0; h < HB; h++) {
            if (h >= nh) break;
            avec acc = AV_MUL(AV_LOADU(q + h * D), kr[0]);
            for (int i = 1; i < NV; i++)
                acc = AV_FMA(AV_LOADU(q + h * D + AV_W * i), kr[i], acc);
            float sc = AV_SUM(acc) * sj;
            if (kv->softcap) sc = capped(sc, kv->softcap);
            scores[h * ss + j] = sc;
            mx[h] = sc > mx[h] ? sc : mx[h];
        }
    }
    for (int h = 0; h < nh; h++) inv[h] = 1.f / exp_sum(scores + h * ss, p + 1, mx[h]);
    avec o[4][8];
    for (int h = 0; h < HB; h++)
        for (int i = 0; i < NV; i++) o[h][i] = AV_ZERO();
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        const float vj = kv_scale(kv->vs, slots, j, Hkv, g);
        avec w[4];
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
#ifdef RLM_ATT_TOKENS
    if (ATT_TOKENS_D(D)) {
        float *buf = (float *)aligned_alloc(64, sizeof(float) * (size_t)(ATT_KC + nh) * D);
        if (!buf) abort(); /* nothing sensible left to do */
        attend_tokens(q, 0, 1, &p, slots, g, Hkv, nh, D, scale, kv, scores, buf, out, 0);
        free(buf);
        return;
    }
#elif defined(AV_W)
    const int64_t ss = p + 16;
    if (D == 64) { /* 8 vectors of K or V per row, one head at a time: 16 registers */
        for (int h = 0; h < nh; h++)
            attend_group(8, 1, q + h * D, 1, slots, p, g, Hkv, scale, kv, scores, ss,
                         out + h * D);
        return;
    }
#endif
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
