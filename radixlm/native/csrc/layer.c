/* A step's layers and its head, each one parallel job: the workspace, the activations
 * prepared for each matmul, the layer's stages between barriers; and the library's
 * entry points. */
#include "rlm.h"

/* ------------------------------------------------------------------ small fp32 ops */
static void rmsnorm_row(const float *x, const float *w, float eps, int n, float *out) {
    float ss = 0.f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* Rotary on one head: pair i is (i, i + half), or (2i, 2i + 1) with `pairs`. */
static void rope_head(float *x, const float *c, const float *s, int half, int pairs) {
    const int step = pairs ? 2 : 1, other = pairs ? 1 : half;
    for (int i = 0; i < half; i++) {
        float *a = x + i * step, *b = a + other;
        float x1 = *a, x2 = *b;
        *a = x1 * c[i] - x2 * s[i];
        *b = x2 * c[i] + x1 * s[i];
    }
}

/* The first position a token at `pos` attends to under a window of W positions (0: all). */
static inline int64_t first_pos(int64_t pos, int64_t W) { return W && pos >= W ? pos - W + 1 : 0; }

/* ------------------------------------------------------------------ workspace */
/* Attention work is split in units of one token and up to this many query heads of one
 * KV group (K/V rows loaded once per unit). */
#define RLM_HEADS_PER_UNIT 8

typedef struct {
    float *x, *qkv, *attn, *tmp, *gu, *act, *xd, *xs, *scores;
    int8_t *xa;
    uint16_t *xb;
    float *xt;
    float *attbuf; /* attend_tokens' K / V rows and outputs, per thread */
    int8_t *ka; /* K-quant activations (quantize_row_k) */
    float *kd;
    int16_t *kb;
} Work;

static int64_t max_k(const Layer *L) {
    int64_t k = L->hidden > L->inter ? L->hidden : L->inter;
    int64_t q = (int64_t)L->n_heads * L->head_dim;
    return k > q ? k : q;
}

/* Score rows an attention unit keeps (layer_body: a token's heads, up to
 * RLM_HEADS_PER_UNIT; or all heads of a KV group for RLM_ATT_TOKENS tokens), and the floats
 * of a thread's attend_tokens buffer. */
static int64_t score_rows(const Layer *L) {
#ifdef RLM_ATT_TOKENS
    const int64_t rows = (int64_t)RLM_ATT_TOKENS * (L->n_heads / L->n_kv_heads);
    return rows > RLM_HEADS_PER_UNIT ? rows : RLM_HEADS_PER_UNIT;
#else
    (void)L;
    return RLM_HEADS_PER_UNIT;
#endif
}

static int64_t att_buf_floats(const Layer *L) {
#ifdef RLM_ATT_TOKENS
    const int64_t n = (int64_t)L->head_dim * (ATT_KC + RLM_ATT_TOKENS * (L->n_heads / L->n_kv_heads));
    return (n + 15) / 16 * 16;
#else
    (void)L;
    return 0;
#endif
}

static int64_t work_layout(const Layer *L, int T, int max_ctx, int nth, float *base, Work *w) {
    int64_t H = L->hidden, q = (int64_t)L->n_heads * L->head_dim;
    int64_t qkv = q + 2 * (int64_t)L->n_kv_heads * L->head_dim, K = max_k(L);
    int64_t off = 0;
#define RLM_TAKE(field, count)                              \
    {                                                       \
        if (w) w->field = (void *)(base + off);             \
        off += (((int64_t)(count) + 15) / 16) * 16;         \
    }
    RLM_TAKE(x, T * H)
    RLM_TAKE(qkv, T * qkv)
    RLM_TAKE(attn, T * q)
    RLM_TAKE(tmp, T * H)
    RLM_TAKE(gu, T * 2 * (int64_t)L->inter)
    RLM_TAKE(act, T * (int64_t)L->inter)
    RLM_TAKE(xd, T * K / 32)
    RLM_TAKE(xs, T * K / 32)
    RLM_TAKE(scores, (int64_t)nth * score_rows(L) * (max_ctx + 16))
    RLM_TAKE(attbuf, (int64_t)nth * att_buf_floats(L) + 16) /* (+16: 64-byte alignment) */
    RLM_TAKE(xa, T * K / 4 + 16)          /* int8: 4 per float */
#ifdef RLM_BF16
    RLM_TAKE(xb, (T + 15) / 16 * 16 * K / 2 + 16) /* bf16: 2 per float, padded tokens */
#endif
#ifdef RLM_PANEL
    RLM_TAKE(xt, (T + 31) / 32 * 32 * K)          /* fp32 transposed, padded tokens */
#endif
    RLM_TAKE(ka, T * K / 4 + 16)
    RLM_TAKE(kd, T * K / 256)
    RLM_TAKE(kb, T * K / 32)              /* int16: 2 per float */
#undef RLM_TAKE
    return off;
}

int64_t rlm_workspace_floats(const Layer *L, int32_t T, int32_t max_ctx, int32_t nthreads) {
    return work_layout(L, T, max_ctx, nthreads, NULL, NULL);
}

/* ------------------------------------------------------------------ the layer */
static inline void row_range(int T, int tid, int nth, int *lo, int *hi) {
    *lo = (int)((int64_t)T * tid / nth);
    *hi = (int)((int64_t)T * (tid + 1) / nth);
}

/* Which int8 activation blocks a matrix reads: NEED_B32 (Q4 / Q8: blocks of 32), NEED_K
 * (K-quants: blocks of 256, quantize_row_k); a concatenation's parts, all they need. */
enum { NEED_B32 = 1, NEED_K = 2 };
static inline int act_needs(const QMat *m) {
    return is_kquant(m) ? NEED_K : is_dense(m) ? 0 : NEED_B32;
}
static inline int cat_needs(const QCat *c) {
    int need = 0;
    for (int i = 0; i < c->count; i++) need |= act_needs(&c->part[i]);
    return need;
}

/* Prepare rows [lo, hi) of x [T, k] for a matmul of weights in format fmt (the first
 * part's) reading `need`: int8 blocks (for Q4 weights on SIMD builds laid out as
 * interleave_act; K-quants' blocks of 256 beside them), bf16 rows (ACT_BF16 on a bf16
 * build; packed as AMX tiles for steps of RLM_AMX_MIN_ROWS tokens or more where the tiles
 * are granted), or fp32 block sums. */
static Act prep_rows(const float *x, int T, int k, const Work *w, int mode, int fmt, int need,
                     int tid, int nth) {
    int lo, hi, nb = k / 32;
    const int b32 = mode != ACT_INT8 || need != NEED_K, kq = mode == ACT_INT8 && (need & NEED_K);
#ifdef RLM_BF16
    const int bf16 = mode == ACT_BF16;
#else
    const int bf16 = 0;
#endif
#ifdef RLM_PANEL
    const int panel = !bf16 && mode != ACT_INT8 && T >= PANEL_MIN_T;
#else
    const int panel = 0;
#endif
#ifdef RLM_AMX
    const int amx = bf16 && T >= RLM_AMX_MIN_ROWS && amx_ok()
                        ? (T >= RLM_AMX_LARGE_T ? 2 : 1) : 0;
    uint16_t row[amx ? k : 1] __attribute__((aligned(64)));
#else
    const int amx = 0;
#endif
#ifdef RLM_AMX_I8 /* B tiles in the bf16 rows' space (T k bytes + T nb scales fit): the
                     blocks of 32, or the K-quants' where those are all the step reads */
    const int amx_i8 = mode == ACT_INT8 && (need == NEED_B32 || (need == NEED_K && amx_kq_ok())) &&
                       T >= RLM_AMX_I8_MIN_ROWS && amx_ok();
    int8_t *xq = amx_i8 ? (int8_t *)w->xb : NULL;
    float *xdt = amx_i8 ? (float *)(xq + (int64_t)(T + 15) / 16 * 16 * k) : NULL;
    float *xst = amx_i8 ? xdt + (int64_t)(T + 15) / 16 * 16 * nb : NULL;
#else
    int8_t *xq = NULL;
    float *xdt = NULL, *xst = NULL;
#endif
    row_range(T, tid, nth, &lo, &hi);
    for (int t = lo; t < hi; t++) {
        const float *xr = x + (int64_t)t * k;
        if (bf16) {
#ifdef RLM_AMX
            if (amx == 1) {
                to_bf16(xr, k, row);
                pack_token(row, t, nb, (uint32_t *)w->xb);
                continue;
            }
#endif
#ifdef RLM_BF16
            to_bf16(xr, k, w->xb + (int64_t)t * k);
#endif
        } else if (mode != ACT_INT8) {
#ifdef RLM_PANEL
            if (panel) {
                transpose_token(xr, t, k, w->xt);
                continue;
            }
#endif
            for (int b = 0; b < nb; b++) {
                float s = 0.f;
                for (int j = 0; j < 32; j++) s += xr[b * 32 + j];
                w->xs[(int64_t)t * nb + b] = s;
            }
        } else {
            if (kq) {
                int8_t *ka = w->ka + (int64_t)t * k;
                float *kd = w->kd + (int64_t)t * (k / 256);
                int16_t *kb = w->kb + (int64_t)t * (k / 16);
                quantize_row_k(xr, k, ka, kd, kb);
#ifdef RLM_AMX_I8
                if (xq && need == NEED_K) { /* the tiles' scales by 32-block: kd, sum a */
                    float d32[nb], s32[nb];
                    for (int b = 0; b < nb; b++) {
                        d32[b] = kd[b / 8];
                        s32[b] = (float)(kb[2 * b] + kb[2 * b + 1]);
                    }
                    pack_token_i8(ka, d32, s32, t, nb, xq, xdt, xst);
                }
#endif
            }
            if (!b32) continue;
            quantize_row(xr, k, w->xa + (int64_t)t * k, w->xd + (int64_t)t * nb,
                         w->xs + (int64_t)t * nb);
#ifdef RLM_AMX_I8
            if (xq && need == NEED_B32)
                pack_token_i8(w->xa + (int64_t)t * k, w->xd + (int64_t)t * nb,
                              w->xs + (int64_t)t * nb, t, nb, xq, xdt, xst);
#endif
#ifdef RLM_CHUNK
            if (fmt == FMT_Q4) interleave_act(w->xa + (int64_t)t * k, w->xd + (int64_t)t * nb, nb);
#else
            (void)fmt;
#endif
        }
    }
#ifdef RLM_AMX
    if (amx && tid == nth - 1 && T % 16) { /* padding tokens of the last group: zeros */
        uint16_t zero[k];
        memset(zero, 0, sizeof zero);
        for (int t = T; t < (T + 15) / 16 * 16; t++) {
            if (amx == 1) pack_token(zero, t, nb, (uint32_t *)w->xb);
            else memcpy(w->xb + (int64_t)t * k, zero, sizeof zero);
        }
    }
#endif
#ifdef RLM_AMX_I8
    if (xq && tid == nth - 1)
        for (int t = T; t < (T + 15) / 16 * 16; t++)
            pack_token_i8(NULL, NULL, NULL, t, nb, xq, xdt, xst);
#endif
    Act a = {mode != ACT_INT8, x, w->xd, w->xs, w->xa, bf16 ? w->xb : NULL, amx,
             panel ? w->xt : NULL, xq, xdt, xst, kq ? w->ka : NULL, kq ? w->kd : NULL,
             kq ? w->kb : NULL, xq != NULL && need == NEED_K};
    return a;
}

#ifdef RLM_PROFILE
/* Seconds per stage, summed over calls (thread 0's view; a profiling build only). */
static double rlm_prof[16], rlm_t0;
#define PROF(i)                                                    \
    if (tid == 0) {                                                \
        double now_ = now_seconds();                             \
        rlm_prof[i] += now_ - rlm_t0;                              \
        rlm_t0 = now_;                                             \
    }
#define PROF_START() if (tid == 0) rlm_t0 = now_seconds();
#else
#define PROF(i)
#define PROF_START()
#endif

/* Stages: 0 norm, 1 qkv, 2 rope + K/V store, 3 attention, 4 o, 5 residual + norm,
 * 6 gate/up, 7 SiLU, 8 down + residual, 9 head. Returns 1 in a profiling build. */
int32_t rlm_profile(double *out, int32_t reset) {
#ifdef RLM_PROFILE
    for (int i = 0; i < 16; i++) {
        if (out) out[i] = rlm_prof[i];
        if (reset) rlm_prof[i] = 0;
    }
    return 1;
#else
    (void)out;
    (void)reset;
    return 0;
#endif
}

/* y [T, m->n] = m x for the team: each thread prepares its rows of x [T, k] as `mode` reads
 * them (see prep_rows), all meet, each computes its rows of m, all meet. Profile stage
 * `stage` ends between the two. */
static inline __attribute__((always_inline)) void matmul_stage(
    const QMat *m, const float *x, int T, int k, float *y, int mode, const Work *w, int stage,
    int tid, int nth) {
    Act a = prep_rows(x, T, k, w, mode, m->fmt, act_needs(m), tid, nth);
    barrier(nth);
    PROF(stage)
    gemv(m, T, &a, y, tid, nth);
    barrier(nth);
    (void)stage;
}

/* matmul_stage for a concatenation of matrices (their parts read one activation layout). */
static inline __attribute__((always_inline)) void matmul_cat_stage(
    const QCat *c, const float *x, int T, int k, float *y, int mode, const Work *w, int stage,
    int tid, int nth) {
    Act a = prep_rows(x, T, k, w, mode, c->part[0].fmt, cat_needs(c), tid, nth);
    barrier(nth);
    PROF(stage)
    gemv_cat(c, T, &a, y, tid, nth);
    barrier(nth);
    (void)stage;
}

/* One layer, run by every thread of the team (tid of nth). res [T, hidden] is the
 * residual stream: res += attn(norm(res)); res += mlp(norm(res)). kvl: this layer's
 * [capacity, n_kv_heads, head_dim] pool buffers (and int8 row scales); the step's K/V are
 * stored at out_loc in the pool's format before any token attends. */
static void layer_body(const Layer *L, const Step *S, const KVLayer *kvl, float *res,
                       const Work *wp, int tid, int nth) {
    const int T = S->T, H = L->hidden, D = L->head_dim, Hq = L->n_heads, Hkv = L->n_kv_heads;
    const int q = Hq * D, kv = Hkv * D, qkvn = q + 2 * kv, I = L->inter, rh = L->rot_half;
    const int64_t W = L->window;
    Work w = *wp;
    int lo, hi;
    row_range(T, tid, nth, &lo, &hi);
    PROF_START()
    for (int t = lo; t < hi; t++) rmsnorm_row(res + (int64_t)t * H, L->in_norm, L->eps, H,
                                              w.x + (int64_t)t * H);
    matmul_cat_stage(&L->qkv, w.x, T, H, w.qkv, S->act_mode, &w, 0, tid, nth);
    PROF(1)
    for (int t = lo; t < hi; t++) {
        float *r = w.qkv + (int64_t)t * qkvn;
        if (L->qkv_bias)
            for (int i = 0; i < qkvn; i++) r[i] += L->qkv_bias[i];
        if (L->q_norm)
            for (int h = 0; h < Hq; h++) rmsnorm_row(r + h * D, L->q_norm, L->eps, D, r + h * D);
        if (L->k_norm)
            for (int h = Hq; h < Hq + Hkv; h++)
                rmsnorm_row(r + h * D, L->k_norm, L->eps, D, r + h * D);
        const float *c = (L->rope_table ? S->cos_b : S->cos) + (int64_t)t * rh;
        const float *s = (L->rope_table ? S->sin_b : S->sin) + (int64_t)t * rh;
        for (int h = 0; h < Hq + Hkv; h++) rope_head(r + h * D, c, s, rh, L->rope_pairs);
        store_kv_token(kvl->k, kvl->ks, kvl->dtype, S->out_loc[t], r + q, Hkv, D);
        store_kv_token(kvl->v, kvl->vs, kvl->dtype, S->out_loc[t], r + q + kv, Hkv, D);
    }
    barrier(nth);
    PROF(2)
    float *scores = w.scores + (int64_t)tid * score_rows(L) * (S->max_ctx + 16);
    const int rep = Hq / Hkv;
#ifdef RLM_ATT_TOKENS
    if (ATT_TOKENS_D(D)) { /* units: RLM_ATT_TOKENS tokens of a request x a KV group */
        float *buf = (float *)(((uintptr_t)w.attbuf + 63) & ~(uintptr_t)63) + tid * att_buf_floats(L);
        const int64_t blocks = (T + RLM_ATT_TOKENS - 1) / RLM_ATT_TOKENS;
        for (int64_t u = tid; u < blocks * Hkv; u += nth) {
            const int g = (int)(u % Hkv), t1 = (int)((u / Hkv + 1) * RLM_ATT_TOKENS);
            for (int t = (int)(u / Hkv) * RLM_ATT_TOKENS, e; t < T && t < t1; t = e) {
                const int32_t *slots = S->req_to_token + S->rows[t] * S->r2t_stride;
                const int64_t p0 = first_pos(S->pos[t], W);
                if (p0) { /* a window past the request's start: this token alone */
                    const int64_t p = S->pos[t] - p0;
                    attend_tokens(w.qkv + (int64_t)t * qkvn + g * rep * D, qkvn, 1, &p,
                                  slots + p0, g, Hkv, rep, D, L->attn_scale, kvl, scores, buf,
                                  w.attn + (int64_t)t * q + g * rep * D, q);
                    e = t + 1;
                    continue;
                }
                for (e = t + 1; e < T && e < t1 && S->rows[e] == S->rows[t]
                                && !first_pos(S->pos[e], W);) e++; /* a request's run */
                attend_tokens(w.qkv + (int64_t)t * qkvn + g * rep * D, qkvn, e - t, S->pos + t,
                              slots, g, Hkv, rep, D, L->attn_scale, kvl, scores, buf,
                              w.attn + (int64_t)t * q + g * rep * D, q);
            }
        }
    } else
#endif
    {
        const int per = rep < RLM_HEADS_PER_UNIT ? rep : RLM_HEADS_PER_UNIT;
        const int chunks = (rep + per - 1) / per;
        for (int64_t u = tid; u < (int64_t)T * Hkv * chunks; u += nth) {
            int t = (int)(u / (Hkv * chunks)), g = (int)(u / chunks % Hkv);
            int h0 = g * rep + (int)(u % chunks) * per, nh = g * rep + rep - h0 < per
                                                               ? g * rep + rep - h0 : per;
            const int64_t p0 = first_pos(S->pos[t], W);
            const int32_t *slots = S->req_to_token + S->rows[t] * S->r2t_stride + p0;
            attend_heads(w.qkv + (int64_t)t * qkvn + h0 * D, nh, slots, S->pos[t] - p0, g, Hkv,
                         D, L->attn_scale, kvl, scores, w.attn + (int64_t)t * q + h0 * D);
        }
    }
    barrier(nth);
    matmul_stage(&L->o, w.attn, T, q, w.tmp, S->act_mode, &w, 3, tid, nth);
    PROF(4)
    for (int t = lo; t < hi; t++) {
        float *r = res + (int64_t)t * H, *o = w.tmp + (int64_t)t * H;
        if (L->attn_out_norm) rmsnorm_row(o, L->attn_out_norm, L->eps, H, o);
        for (int i = 0; i < H; i++) r[i] += o[i];
        rmsnorm_row(r, L->post_norm, L->eps, H, w.x + (int64_t)t * H);
    }
    matmul_cat_stage(&L->gate_up, w.x, T, H, w.gu, S->act_mode, &w, 5, tid, nth);
    PROF(6)
    for (int t = lo; t < hi; t++) {
        const float *g = w.gu + (int64_t)t * 2 * I, *u = g + I;
        float *ac = w.act + (int64_t)t * I;
        act_mul(g, u, I, ac, L->act == ACT_GELU_TANH);
    }
    matmul_stage(&L->down, w.act, T, I, w.tmp, S->act_mode, &w, 7, tid, nth);
    for (int t = lo; t < hi; t++) {
        float *r = res + (int64_t)t * H, *o = w.tmp + (int64_t)t * H;
        if (L->mlp_out_norm) rmsnorm_row(o, L->mlp_out_norm, L->eps, H, o);
        for (int i = 0; i < H; i++) r[i] += o[i];
    }
    PROF(8)
}

typedef struct {
    const Layer *layers;
    int32_t n_layers;
    void *const *k_caches, *const *v_caches;
    const Step *S;
    float *res;
    const Work *w;
} LayersJob;

static void layers_job(void *ctx, int tid, int nth) {
    const LayersJob *j = (const LayersJob *)ctx;
    const Step *S = j->S;
    for (int i = 0; i < j->n_layers; i++) {
        KVLayer kvl = {j->k_caches[i], j->v_caches[i], S->k_scales ? S->k_scales[i] : NULL,
                       S->v_scales ? S->v_scales[i] : NULL, S->kv_dtype, j->layers[i].softcap};
        layer_body(&j->layers[i], S, &kvl, j->res, j->w, tid, nth);
        barrier(nth);
    }
}

/* Every layer of the step in one parallel job (layers[i] with k_caches[i] / v_caches[i]). */
void rlm_layers(const Layer *layers, int32_t n_layers, void *const *k_caches,
                void *const *v_caches, const Step *S, float *res) {
    Work w;
    memset(&w, 0, sizeof w); /* (buffers a build does not use stay NULL) */
    work_layout(&layers[0], S->T, S->max_ctx, S->nthreads, S->ws, &w);
    LayersJob j = {layers, n_layers, k_caches, v_caches, S, res, &w};
    run_parallel(layers_job, &j, S->nthreads);
}

typedef struct {
    const QMat *head;
    const float *norm, *x;
    float eps, *logits;
    int32_t T, act_mode;
    Work *w;
} HeadJob;

static void head_job(void *ctx, int tid, int nth) {
    const HeadJob *j = (const HeadJob *)ctx;
    const int k = j->head->k;
    int lo, hi;
    row_range(j->T, tid, nth, &lo, &hi);
    for (int t = lo; t < hi; t++) {
        if (j->norm) rmsnorm_row(j->x + (int64_t)t * k, j->norm, j->eps, k, j->w->x + (int64_t)t * k);
        else memcpy(j->w->x + (int64_t)t * k, j->x + (int64_t)t * k, (size_t)k * 4);
    }
    PROF_START()
    Act a = prep_rows(j->w->x, j->T, k, j->w, j->act_mode, j->head->fmt, act_needs(j->head),
                      tid, nth);
    barrier(nth);
    gemv(j->head, j->T, &a, j->logits, tid, nth);
    barrier(nth);
    PROF(9)
}

/* logits [T, head->n] = head(norm(x)) for x [T, k] (norm NULL: no norm).
 * ws: rlm_matmul_workspace_floats() floats. */
void rlm_norm_head(const QMat *head, const float *norm, float eps, int32_t T, const float *x,
                   float *logits, float *ws, int32_t act_mode, int32_t nthreads) {
    const int k = head->k, nb = k / 32;
    Work w;
    memset(&w, 0, sizeof w);
    w.x = ws;
    w.xd = ws + (int64_t)T * k;
    w.xs = w.xd + (int64_t)T * nb;
    w.xa = (int8_t *)(w.xs + (int64_t)T * nb);
    w.xb = (uint16_t *)(w.xs + (int64_t)T * nb + ((int64_t)T * k + 64) / 4);
    w.xt = (float *)(w.xb + (int64_t)(T + 15) / 16 * 16 * k + 64);
    w.kd = w.xt + (int64_t)(T + 31) / 32 * 32 * k + 16;
    w.kb = (int16_t *)(w.kd + (int64_t)T * (k / 256) + 16);
    w.ka = (int8_t *)(w.kb + (int64_t)T * (k / 16) + 32);
    HeadJob j = {head, norm, x, eps, logits, T, act_mode, &w};
    run_parallel(head_job, &j, nthreads);
}

int64_t rlm_matmul_workspace_floats(int32_t T, int32_t k, int32_t nthreads) {
    (void)nthreads;
    return (int64_t)T * k + 2 * (int64_t)T * (k / 32) + ((int64_t)T * k + 64) / 4
           + ((int64_t)(T + 15) / 16 * 16 * k) / 2 + 32 + (int64_t)(T + 31) / 32 * 32 * k + 64
           + 16 + (int64_t)T * (k / 256) + 16 + (int64_t)T * (k / 32) + 16 + ((int64_t)T * k + 64) / 4;
}

/* out[i * k] = row rows[i] of w in fp32, any format (dequant_row): the embedding lookup of
 * a model whose token embedding is a block matrix, and the kernel tests' dequantization.
 * out is 64-byte aligned and k a multiple of 32 (whole-vector stores). */
void rlm_dequant_rows(const QMat *w, const int64_t *rows, int32_t count, float *out) {
    const int nb = w->k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    for (int i = 0; i < count; i++) {
        const int64_t n = rows[i];
        if (!w->qs && is_kquant(w)) { /* K-quant rows repacked only (Arena: rewritten rows) */
            uint8_t q[w->k] __attribute__((aligned(64)));
            float ds[w->k / 256 * 16 + 1], dm[w->k / 32 + 1];
            kx_unpack_row(w, n, q, ds, dm);
            kq_dequant_unpacked(w, q, ds, dm, out + (int64_t)i * w->k);
            continue;
        }
        if (!w->qs) { /* Q8 / Q4 / IQ4 / Q5 rows repacked only (kx32.c; IQ4's and Q5's
                         unpacked as Q8's) */
            uint8_t q[w->k] __attribute__((aligned(64)));
            f16 d[nb], m[nb];
            QMat plain = *w;
            plain.fmt = w->fmt == FMT_IQ4 || w->fmt == FMT_Q5 ? FMT_Q8 : w->fmt;
            kx32_unpack_row(w, n, q, d, m);
            dequant_row(&plain, q, d, w->fmt == FMT_Q4 ? m : NULL, nb, out + (int64_t)i * w->k);
            continue;
        }
        dequant_row(w, w->qs + n * row_bytes, wd_of(w, n, nb), wm_of(w, (int)n, nb), nb,
                    out + (int64_t)i * w->k);
    }
}

/* Whether this build's int8 kernel reads K-quant rows repacked (QMat.qx), and the
 * repacking: rows 0 .. n / 16 * 16 of such a matrix src (the file's rows) into dst
 * (rlm_kx_bytes), in groups of 16 rows over the team of nthreads. FMT_Q3_K: src holds the
 * file's Q3_K rows (110 bytes a super-block), n % 16 == 0, where rlm_kx3_rows (kx3.c). */
int32_t rlm_kx_rows(void) {
#ifdef RLM_AVX2
    return 1;
#else
    return 0;
#endif
}

int32_t rlm_kx3_rows(void) {
#ifdef RLM_KX3
    return 1;
#else
    return 0;
#endif
}

int64_t rlm_kx_bytes(int32_t fmt, int32_t n, int32_t k) {
    if (fmt == FMT_Q8 || fmt == FMT_Q4 || fmt == FMT_IQ4 || fmt == FMT_Q5)
        return (int64_t)(n / 16) * (k / 32) * kx32_bytes(fmt);
    return (int64_t)(n / 16) * (k / 256) * kx_sb_bytes(fmt);
}

typedef struct {
    const uint8_t *src;
    int32_t fmt, n, k;
    uint8_t *dst;
} RepackJob;

static void repack_job(void *ctx, int tid, int nth) {
    const RepackJob *j = (const RepackJob *)ctx;
    const int groups = j->n / 16, nsb = j->k / 256, six = j->fmt == FMT_Q6_K;
    const int five = j->fmt == FMT_Q5_K, three = j->fmt == FMT_Q3_K;
    const int64_t rb = (int64_t)nsb * kq_sb_bytes(j->fmt), sb = kx_sb_bytes(j->fmt);
    for (int g = tid; g < groups; g += nth) {
        const uint8_t *src = j->src + (int64_t)g * 16 * rb;
        uint8_t *dst = j->dst + (int64_t)g * nsb * sb;
        if (three) kx3_repack_group(src, rb, nsb, dst);
        else if (six) kx6_repack_group(src, rb, nsb, dst);
        else kx_repack_group(src, rb, nsb, dst, five);
    }
}

void rlm_repack_kx(const uint8_t *src, int32_t fmt, int32_t n, int32_t k, uint8_t *dst,
                   int32_t nthreads) {
    RepackJob j = {src, fmt, n, k, dst};
    run_parallel(repack_job, &j, nthreads < 1 ? 1 : nthreads);
}

/* Whether this build's int8 kernel reads Q8 / Q4 rows repacked (kx32.c: every row, the
 * plain rows not kept), and the repacking: such a matrix's rows (n % 16 == 0; block b of row r
 * at qs + r qrow + b qblk, its fp16 scale at d + r drow + b dblk, Q4's minimum at m + r mrow
 * + b mblk, in bytes: a GGUF's interleaved blocks or separate arrays alike) into dst
 * (rlm_kx_bytes), in groups of 16 rows over the team of nthreads. */
int32_t rlm_kx32_rows(void) {
#ifdef RLM_KX32
    return 1;
#else
    return 0;
#endif
}

typedef struct {
    int32_t fmt;
    const uint8_t *qs, *d, *m;
    int64_t qrow, qblk, drow, dblk, mrow, mblk;
    int32_t n, k;
    uint8_t *dst;
} Repack32Job;

static void repack32_job(void *ctx, int tid, int nth) {
    const Repack32Job *j = (const Repack32Job *)ctx;
    const int nb = j->k / 32;
    for (int g = tid; g < j->n / 16; g += nth)
        kx32_repack_group(j->fmt, j->qs + (int64_t)g * 16 * j->qrow, j->qrow, j->qblk,
                          j->d + (int64_t)g * 16 * j->drow, j->drow, j->dblk,
                          j->m ? j->m + (int64_t)g * 16 * j->mrow : NULL, j->mrow, j->mblk,
                          nb, j->dst + (int64_t)g * nb * kx32_bytes(j->fmt));
}

void rlm_repack_kx32(int32_t fmt, const uint8_t *qs, int64_t qrow, int64_t qblk,
                     const uint8_t *d, int64_t drow, int64_t dblk, const uint8_t *m,
                     int64_t mrow, int64_t mblk, int32_t n, int32_t k, uint8_t *dst,
                     int32_t nthreads) {
    Repack32Job j = {fmt, qs, d, m, qrow, qblk, drow, dblk, mrow, mblk, n, k, dst};
    run_parallel(repack32_job, &j, nthreads < 1 ? 1 : nthreads);
}

/* Many matrices repacked in one call, in order (a start places a GGUF's matrices on a thread
 * beside torch's import, which holds the GIL for long stretches: one call waits for it once,
 * not per matrix): K-quant rows as rlm_repack_kx, or (blocks32) Q8 / Q4 rows as
 * rlm_repack_kx32 with their strides. After job i's rows are repacked, the whole pages of
 * [drop, drop + drop_len) are given back (MADV_DONTNEED: its rows in a file map, which fault
 * back in from the file if read; drop_len 0: none). */
typedef struct {
    const uint8_t *src, *d, *m;
    int32_t fmt, n, k, blocks32;
    int64_t qrow, qblk, drow, dblk, mrow, mblk;
    uint8_t *dst;
    uint8_t *drop;
    int64_t drop_len;
} RlmRepackMany;

void rlm_repack_many(const RlmRepackMany *jobs, int32_t count, int32_t nthreads) {
    for (int32_t i = 0; i < count; i++) {
        const RlmRepackMany *j = &jobs[i];
        if (j->blocks32)
            rlm_repack_kx32(j->fmt, j->src, j->qrow, j->qblk, j->d, j->drow, j->dblk, j->m,
                            j->mrow, j->mblk, j->n, j->k, j->dst, nthreads);
        else
            rlm_repack_kx(j->src, j->fmt, j->n, j->k, j->dst, nthreads);
#ifdef __linux__
        if (j->drop_len > 0) madvise(j->drop, (size_t)j->drop_len, MADV_DONTNEED);
#endif
    }
}

/* Row n of a K-quant matrix unpacked (kq_unpack_row: bytes q [k], scales ds, dm), from the
 * file's rows (repacked = 0) or from QMat.qx (1): the two must agree. */
void rlm_kq_unpack_row(const QMat *w, int64_t n, int32_t repacked, uint8_t *q, float *ds,
                       float *dm) {
    if (repacked) kx_unpack_row(w, n, q, ds, dm);
    else kq_unpack_row(w, w->qs + n * row_bytes_of(w), q, ds, dm);
}

/* Kernel-test entry points: one op each, the same code the layer runs. */
void rlm_quantize_rows(const float *x, int32_t T, int32_t k, int8_t *a, float *dx, float *sx) {
    for (int t = 0; t < T; t++)
        quantize_row(x + (int64_t)t * k, k, a + (int64_t)t * k, dx + (int64_t)t * (k / 32),
                     sx + (int64_t)t * (k / 32));
}

/* The K-quant activations of x [T, k] (quantize_row_k): a [T, k], kd [T, k/256], kb [T, k/16]. */
void rlm_quantize_rows_k(const float *x, int32_t T, int32_t k, int8_t *a, float *kd, int16_t *kb) {
    for (int t = 0; t < T; t++)
        quantize_row_k(x + (int64_t)t * k, k, a + (int64_t)t * k, kd + (int64_t)t * (k / 256),
                       kb + (int64_t)t * (k / 16));
}

void rlm_attention(const float *q, int32_t T, int32_t Hq, int32_t Hkv, int32_t D, float scale,
                   const int64_t *rows, const int64_t *pos, const int32_t *req_to_token,
                   int64_t r2t_stride, const void *k_cache, const void *v_cache,
                   int32_t kv_dtype, int32_t max_ctx, float *out, const uint16_t *k_scale,
                   const uint16_t *v_scale, float softcap) {
    const int rep = Hq / Hkv;
    const KVLayer kv = {(void *)k_cache, (void *)v_cache, (uint16_t *)k_scale,
                        (uint16_t *)v_scale, kv_dtype, softcap};
    float *scores = (float *)malloc(sizeof(float) * (size_t)rep * (max_ctx + 16));
    for (int t = 0; t < T; t++)
        for (int g = 0; g < Hkv; g++)
            attend_heads(q + ((int64_t)t * Hq + g * rep) * D, rep,
                         req_to_token + rows[t] * r2t_stride, pos[t], g, Hkv, D, scale, &kv,
                         scores, out + ((int64_t)t * Hq + g * rep) * D);
    free(scores);
}

/* x [T, Hkv, D] into pool slots `slots` [T] of one cache, as the layer stores K or V. */
void rlm_store_kv(const float *x, int32_t T, int32_t Hkv, int32_t D, const int64_t *slots,
                  void *cache, uint16_t *scales, int32_t kv_dtype) {
    for (int t = 0; t < T; t++)
        store_kv_token(cache, scales, kv_dtype, slots[t], x + (int64_t)t * Hkv * D, Hkv, D);
}

/* ------------------------------------------------------------------ what this build runs */
/* Which SIMD path this build took (for logs and benchmarks). */
const char *rlm_isa(void) {
#if defined(RLM_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx512-vnni";
#elif defined(RLM_AVX2) && defined(__AVXVNNI__)
    return "avx-vnni";
#elif defined(RLM_AVX2)
    return "avx2";
#else
    return "generic";
#endif
}

/* 1 when ACT_BF16 runs bf16 dot products (an AVX512-BF16 build), 0 when it runs as ACT_F32. */
int32_t rlm_bf16(void) {
#ifdef RLM_BF16
    return 1;
#else
    return 0;
#endif
}

/* 1 when steps of RLM_AMX_MIN_ROWS tokens or more run ACT_BF16 on AMX tiles (an AMX build
 * on a kernel that grants the tile state), else 0. */
int32_t rlm_amx(void) {
#ifdef RLM_AMX
    return amx_ok();
#else
    return 0;
#endif
}

/* 1 when ACT_INT8 steps of RLM_AMX_I8_MIN_ROWS tokens or more run Q8 rows on AMX int8
 * tiles (amx_i8.c: the 512-bit path's bits), else 0. */
int32_t rlm_amx_i8(void) {
#ifdef RLM_AMX_I8
    return amx_ok();
#else
    return 0;
#endif
}

/* 1 when K-quant rows run on the AMX int8 tiles too (amx_kq_ok: the tiles agreed with the
 * 512-bit kernels bit for bit once this process), else 0. */
int32_t rlm_amx_kq(void) {
#ifdef RLM_AMX_I8
    return amx_kq_ok();
#else
    return 0;
#endif
}

/* Kernel-test entry: out[i] = act(g[i]) * u[i], the layer's MLP activation (ACT_SILU |
 * ACT_GELU_TANH). */
void rlm_act_mul(const float *g, const float *u, int32_t n, float *out, int32_t act) {
    act_mul(g, u, n, out, act == ACT_GELU_TANH);
}

/* The smallest steps bf16 beats fp32 at: RLM_AMX_MIN_ROWS on AMX tiles where rlm_amx()
 * says so; else, on an AVX512-BF16 build, RLM_BF16_MIN_ROWS (a 2-token step 6.8 ms bf16 vs
 * 10.7 fp32, 4 tokens 8.6 vs 13.5, 16 tokens 22.4 vs 41.2 on a 2-core Zen 4); 0 on a build
 * without bf16 dot products (none runs bf16). The engine's default runs bf16 from here, or
 * from 8 tokens where int8 blocks run the small steps (native/decoder.py). */
int32_t rlm_bf16_min_rows(void) {
#ifdef RLM_AMX
    if (amx_ok()) return RLM_AMX_MIN_ROWS;
#endif
#ifdef RLM_BF16
    return RLM_BF16_MIN_ROWS;
#else
    return 0;
#endif
}
