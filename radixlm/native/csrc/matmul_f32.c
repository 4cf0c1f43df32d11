/* fp32 activations x Q4/Q8 blocks (and dense rows, see dense.c): the weights are dequantized on the fly, the products
 * are exact fp32 (what the reference torch path computes, up to summation order). Steps
 * under 4 tokens: rows at a time against each token (AVX-512: 4 rows x 1-3 tokens;
 * AVX2: 4 Q4 rows); from 4 tokens: rows dequantized once, then tiles of rows x 4
 * tokens; AVX2 steps of PANEL_MIN_T+ tokens: the panel GEMM. */
#include "rlm.h"

/* sum_j W[n, j] x[j] for one row, fp32 x; xs: per-block sums of x (for Q4's m term) */
static inline float qdot_f32(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                             const float *x, const float *xs, int nb) {
#if defined(RLM_AVX2) && defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float msum = 0.f;
    int b = 0;
    if (w->fmt == FMT_Q4) {
        const __m128i mask = _mm_set1_epi8(0x0f);
        for (; b + 2 <= nb; b += 2) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wq + b * 16));
            __m128i v0 = _mm256_castsi256_si128(v), v1 = _mm256_extracti128_si256(v, 1);
            __m512 l0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v0, mask)));
            __m512 h0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_and_si128(_mm_srli_epi16(v0, 4), mask)));
            __m512 l1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v1, mask)));
            __m512 h1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_and_si128(_mm_srli_epi16(v1, 4), mask)));
            __m512 t0 = _mm512_mul_ps(l0, _mm512_loadu_ps(x + b * 32));
            __m512 t1 = _mm512_mul_ps(l1, _mm512_loadu_ps(x + b * 32 + 32));
            t0 = _mm512_fmadd_ps(h0, _mm512_loadu_ps(x + b * 32 + 16), t0);
            t1 = _mm512_fmadd_ps(h1, _mm512_loadu_ps(x + b * 32 + 48), t1);
            acc0 = _mm512_fmadd_ps(t0, _mm512_set1_ps(H(wd[b])), acc0);
            acc1 = _mm512_fmadd_ps(t1, _mm512_set1_ps(H(wd[b + 1])), acc1);
        }
        for (int i = 0; i < nb; i++) msum += H(wm[i]) * xs[i];
    }
    for (; b < nb; b++) { /* Q8 rows, and an odd last Q4 block (its m term is in msum) */
        __m512 lo, hi;
        block_f32(w, wq, b, &lo, &hi);
        __m512 t = _mm512_mul_ps(lo, _mm512_loadu_ps(x + b * 32));
        t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + b * 32 + 16), t);
        if (b & 1) acc1 = _mm512_fmadd_ps(t, _mm512_set1_ps(H(wd[b])), acc1);
        else acc0 = _mm512_fmadd_ps(t, _mm512_set1_ps(H(wd[b])), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + msum;
#elif defined(RLM_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float msum = 0.f;
    for (int b = 0; b < nb; b++) {
        __m256 f[4];
        if (w->fmt == FMT_Q4) {
            __m128i v = _mm_loadu_si128((const __m128i *)(wq + b * 16));
            for (int p = 0; p < 4; p++) f[p] = q4_f8(v, p);
            msum += H(wm[b]) * xs[b];
        } else {
            for (int p = 0; p < 4; p++)
                f[p] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(wq + b * 32 + p * 8))));
        }
        __m256 t = _mm256_mul_ps(f[0], _mm256_loadu_ps(x + b * 32));
        t = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(x + b * 32 + 8), t);
        t = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(x + b * 32 + 16), t);
        t = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(x + b * 32 + 24), t);
        if (b & 1) acc1 = _mm256_fmadd_ps(t, _mm256_set1_ps(H(wd[b])), acc1);
        else acc0 = _mm256_fmadd_ps(t, _mm256_set1_ps(H(wd[b])), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1)) + msum;
#else
    float acc = 0.f;
    for (int b = 0; b < nb; b++) {
        float s = 0.f;
        if (w->fmt == FMT_Q4) {
            for (int j = 0; j < 16; j++)
                s += (float)(wq[b * 16 + j] & 0x0f) * x[b * 32 + j]
                   + (float)(wq[b * 16 + j] >> 4) * x[b * 32 + j + 16];
            acc += H(wd[b]) * s + H(wm[b]) * xs[b];
        } else {
            for (int j = 0; j < 32; j++) s += (float)(int8_t)wq[b * 32 + j] * x[b * 32 + j];
            acc += H(wd[b]) * s;
        }
    }
    return acc;
#endif
}

/* y[t] = dot(wf, x[t]) for 4 tokens at once (wf: a dequantized row). */
static inline void dot4_f32(const float *wf, const float *x, int64_t ldx, int k, float *out) {
#ifdef AV_W
    avec a0 = AV_ZERO(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < k; j += AV_W) {
        avec wv = AV_LOADU(wf + j);
        a0 = AV_FMA(wv, AV_LOADU(x + j), a0);
        a1 = AV_FMA(wv, AV_LOADU(x + ldx + j), a1);
        a2 = AV_FMA(wv, AV_LOADU(x + 2 * ldx + j), a2);
        a3 = AV_FMA(wv, AV_LOADU(x + 3 * ldx + j), a3);
    }
    out[0] = AV_SUM(a0);
    out[1] = AV_SUM(a1);
    out[2] = AV_SUM(a2);
    out[3] = AV_SUM(a3);
#else
    for (int i = 0; i < 4; i++) {
        float s = 0.f;
        for (int j = 0; j < k; j++) s += wf[j] * x[i * ldx + j];
        out[i] = s;
    }
#endif
}

/* RT dequantized rows (row stride ldw) x 4 tokens (row stride ldx): out[r * 4 + i]. Rows of
 * weights and tokens both reused from registers: FMA-bound instead of load-bound. RT: 4
 * rows on AVX-512, 2 on AVX2 (accumulators, x and w vectors within the 32 zmm or 16 ymm
 * registers). */
#ifdef AV_W
#define RT (AV_W == 16 ? 4 : 2)
static inline void dot_rt4_f32(const float *wf, int64_t ldw, const float *x, int64_t ldx,
                               int k, float *out) {
    avec acc[RT][4];
    for (int r = 0; r < RT; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = AV_ZERO();
    for (int j = 0; j < k; j += AV_W) {
        avec xv[4];
        for (int i = 0; i < 4; i++) xv[i] = AV_LOADU(x + i * ldx + j);
        for (int r = 0; r < RT; r++) {
            avec wv = AV_LOAD(wf + r * ldw + j);
            for (int i = 0; i < 4; i++) acc[r][i] = AV_FMA(wv, xv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RT; r++)
        for (int i = 0; i < 4; i++) out[r * 4 + i] = AV_SUM(acc[r][i]);
}
#else
#define RT 1
static inline void dot_rt4_f32(const float *wf, int64_t ldw, const float *x, int64_t ldx,
                               int k, float *out) {
    (void)ldw;
    dot4_f32(wf, x, ldx, k, out);
}
#endif

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* Four rows at once against NT (1-3) fp32 activation rows: x loads shared by the rows and
 * one horizontal reduction for each (rows of ~576 columns are short: per-row reductions
 * were a third of the time); the tokens share each row's unpacked block, so a batch of 2
 * or 3 costs little more than one token (the step streams the same weights). Q4 (W =
 * d q + m, xs: the tokens' block sums for the m term) or Q8 (W = d q) and NT are constants
 * where it is inlined. out[i * 4 + r]: row r, token i. */
static inline __attribute__((always_inline)) void qdot_f32_x4(
    const int Q4, const int NT, const uint8_t *wq, const f16 *wd, const f16 *wm, int64_t rb,
    int nb, const float *x, int64_t ldx, const float *xs, float *out) {
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m512 acc[4][3];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NT; i++) acc[r][i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 x0[3], x1[3];
        for (int i = 0; i < NT; i++) {
            x0[i] = _mm512_loadu_ps(x + i * ldx + b * 32);
            x1[i] = _mm512_loadu_ps(x + i * ldx + b * 32 + 16);
        }
        for (int r = 0; r < 4; r++) {
            __m512 lo, hi;
            if (Q4) {
                __m128i v = _mm_loadu_si128((const __m128i *)(wq + r * rb * 16 + b * 16));
                lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
                hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                    _mm_and_si128(_mm_srli_epi16(v, 4), mask)));
            } else {
                const uint8_t *q = wq + r * rb * 32 + b * 32;
                lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
                hi = _mm512_cvtepi32_ps(
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
            }
            __m512 d = _mm512_set1_ps(H(wd[r * rb + b]));
            for (int i = 0; i < NT; i++)
                acc[r][i] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, x1[i], _mm512_mul_ps(lo, x0[i])),
                                            d, acc[r][i]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NT; i++) {
            if (!Q4) {
                out[i * 4 + r] = _mm512_reduce_add_ps(acc[r][i]);
                continue;
            }
            float m = 0.f;
            for (int b = 0; b < nb; b++) m += H(wm[r * rb + b]) * xs[i * nb + b];
            out[i * 4 + r] = _mm512_reduce_add_ps(acc[r][i]) + m;
        }
}
#endif

#if defined(RLM_AVX2) && !defined(__AVX512F__)
/* AVX2: four Q4 rows against one fp32 token, 8 columns at a time: each x vector loaded
 * once for the four rows, one horizontal sum per row. out[r] = row r. */
static void qdot_f32_q4x4_avx2(const uint8_t *wq, const f16 *wd, const f16 *wm, int64_t rb,
                               int nb, const float *x, const float *xs, float *out) {
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        __m128i lo[4], hi[4];
        for (int r = 0; r < 4; r++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(wq + r * rb * 16 + b * 16));
            lo[r] = _mm_and_si128(v, mask);
            hi[r] = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        }
        __m256 t[4];
        for (int p = 0; p < 4; p++) {
            __m256 xv = _mm256_loadu_ps(x + b * 32 + p * 8);
            for (int r = 0; r < 4; r++) {
                __m128i nib = p < 2 ? lo[r] : hi[r];
                if (p & 1) nib = _mm_srli_si128(nib, 8);
                __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib));
                t[r] = p ? _mm256_fmadd_ps(f, xv, t[r]) : _mm256_mul_ps(f, xv);
            }
        }
        for (int r = 0; r < 4; r++)
            acc[r] = _mm256_fmadd_ps(t[r], _mm256_set1_ps(H(wd[r * rb + b])), acc[r]);
    }
    for (int r = 0; r < 4; r++) {
        float m = 0.f;
        for (int b = 0; b < nb; b++) m += H(wm[r * rb + b]) * xs[b];
        out[r] = hsum256(acc[r]) + m;
    }
}
#endif

#ifdef RLM_PANEL
/* ------------------------------------------------------------------ fp32 panel GEMM
 * AVX2 builds, steps of PANEL_MIN_T+ tokens with fp32 activations: the activations are
 * transposed once per matmul (xt[j][t], tokens padded to a multiple of 2 PV), PMR rows of
 * W are dequantized row-major as usual, and the microkernel broadcasts one weight per row
 * and multiplies it into 2 PV tokens at a time: PMR x 2 accumulators in registers, no
 * horizontal sums, no weight transpose. On 256-bit vectors this reaches the FMA peak where
 * the rows x tokens dot-product tiles (dot_rt4_f32, 2 rows there) reached ~70% of it;
 * with AVX-512 those tiles (4 rows) are already at ~80-90% and this layout gained
 * nothing, so AVX-512 builds keep them. */
#define PV 8                       /* floats per vector */
#define PMR 6                      /* rows of W per microkernel */
typedef __m256 pvec;
#define PV_LOAD _mm256_loadu_ps
#define PV_SET1 _mm256_set1_ps
#define PV_FMA _mm256_fmadd_ps
#define PV_ZERO _mm256_setzero_ps
#define PV_STOREU _mm256_storeu_ps
#define PT (2 * PV)                /* tokens per microkernel */

static inline int64_t panel_tokens(int T) { return ((int64_t)T + PT - 1) / PT * PT; }

/* Token t of x (k values) into the transposed activations, stored in blocks of PT tokens:
 * xt[t / PT][j][t % PT] (a block is contiguous, so the kernel reads it in order). */
static void transpose_token(const float *xr, int t, int k, float *xt) {
    float *blk = xt + (int64_t)(t / PT) * k * PT + t % PT;
    for (int j = 0; j < k; j++) blk[(int64_t)j * PT] = xr[j];
}

/* PMR dequantized rows (wf, row stride k) x the PT tokens of block xb ([k][PT]), the
 * first of which is token t0: y[t][r] for t < T, r < rows. */
static inline void panel_kernel(const float *wf, const float *xb, int k, int t0, int T,
                                int rows, float *y, int64_t ldy) {
    pvec acc[PMR][2];
    for (int r = 0; r < PMR; r++) acc[r][0] = acc[r][1] = PV_ZERO();
    for (int j = 0; j < k; j++) {
        pvec x0 = PV_LOAD(xb + (int64_t)j * PT), x1 = PV_LOAD(xb + (int64_t)j * PT + PV);
        for (int r = 0; r < PMR; r++) {
            pvec wb = PV_SET1(wf[(int64_t)r * k + j]);
            acc[r][0] = PV_FMA(wb, x0, acc[r][0]);
            acc[r][1] = PV_FMA(wb, x1, acc[r][1]);
        }
    }
    const int nt = T - t0 < PT ? T - t0 : PT;
    for (int r = 0; r < rows; r++) {
        float out[PT];
        PV_STOREU(out, acc[r][0]);
        PV_STOREU(out + PV, acc[r][1]);
        for (int i = 0; i < nt; i++) y[(int64_t)(t0 + i) * ldy + r] = out[i];
    }
}

/* Rows are dequantized a block at a time (~128 KB of fp32, a multiple of PMR rows), then
 * each block of PT tokens serves all the block's row groups from L1/L2: without it a
 * prefill chunk streamed all its transposed activations from memory once per PMR rows. */
static void qgemm_panel_f32(const QMat *w, int n0, int n1, int T, const float *xt, float *y,
                            int64_t ldy) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    int block = (int)((128 * 1024) / ((int64_t)k * 4)) / PMR * PMR;
    block = block < PMR ? PMR : (block > 16 * PMR ? 16 * PMR : block);
    float *wf = (float *)aligned_alloc(64, sizeof(float) * (size_t)block * k);
    if (!wf) abort(); /* no memory for ~128 KB: nothing sensible left to do */
    for (int nblk = n0; nblk < n1; nblk += block) {
        const int brows = n1 - nblk < block ? n1 - nblk : block;
        const int bpad = (brows + PMR - 1) / PMR * PMR;
        for (int r = 0; r < brows; r++)
            dequant_row(w, w->qs + (int64_t)(nblk + r) * row_bytes,
                        wd_of(w, nblk + r, nb), wm_of(w, nblk + r, nb), nb,
                        wf + (int64_t)r * k);
        if (bpad > brows) memset(wf + (int64_t)brows * k, 0, sizeof(float) * (bpad - brows) * k);
        for (int t0 = 0; t0 < T; t0 += PT)
            for (int rg = 0; rg < bpad; rg += PMR) {
                const int rows = brows - rg < PMR ? brows - rg : PMR;
                panel_kernel(wf + (int64_t)rg * k, xt + (int64_t)t0 * k, k, t0, T, rows,
                             y + nblk + rg, ldy);
            }
    }
    free(wf);
}
#endif

static void qgemv_rows_f32(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                           int64_t ldy) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
#ifdef RLM_PANEL
    if (a->xt) {
        qgemm_panel_f32(w, n0, n1, T, a->xt, y, ldy);
        return;
    }
#endif
    if (is_dense(w) && T < 4) {
        dense_rows_f32(w, n0, n1, T, a->xf, y, ldy);
        return;
    }
    float wf[RT * k] __attribute__((aligned(64)));
    int n = n0;
#if defined(RLM_AVX2) && !defined(__AVX512F__)
    if (w->fmt == FMT_Q4 && T < 4) {
        for (; n + 4 <= n1; n += 4) {
            prefetch_rows(w, n + 8, 4, n1);
            for (int t = 0; t < T; t++) {
                float out[4];
                qdot_f32_q4x4_avx2(w->qs + (int64_t)n * row_bytes, w->d + (int64_t)n * nb,
                                   w->m + (int64_t)n * nb, nb, nb, a->xf + (int64_t)t * k,
                                   a->xs + (int64_t)t * nb, out);
                for (int r = 0; r < 4; r++) y[(int64_t)t * ldy + n + r] = out[r];
            }
        }
    }
#endif
#if defined(RLM_AVX2) && defined(__AVX512F__)
    if (w->fmt == FMT_Q8 && T > 1 && T < 4) { /* (one token: qdot_f32 per row, faster) */
        for (; n + 4 <= n1; n += 4) {
            prefetch_rows(w, n + 8, 4, n1);
            float out[12];
            const uint8_t *wq = w->qs + (int64_t)n * row_bytes;
            const f16 *wd = w->d + (int64_t)n * nb;
            if (T == 1) qdot_f32_x4(0, 1, wq, wd, NULL, nb, nb, a->xf, k, NULL, out);
            else if (T == 2) qdot_f32_x4(0, 2, wq, wd, NULL, nb, nb, a->xf, k, NULL, out);
            else qdot_f32_x4(0, 3, wq, wd, NULL, nb, nb, a->xf, k, NULL, out);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < 4; r++) y[(int64_t)t * ldy + n + r] = out[t * 4 + r];
        }
    }
    if (w->fmt == FMT_Q4 && T < 4) {
        for (; n + 4 <= n1; n += 4) {
            prefetch_rows(w, n + 8, 4, n1);
            float out[12];
            const uint8_t *wq = w->qs + (int64_t)n * row_bytes;
            const f16 *wd = w->d + (int64_t)n * nb, *wm = w->m + (int64_t)n * nb;
            if (T == 1) qdot_f32_x4(1, 1, wq, wd, wm, nb, nb, a->xf, k, a->xs, out);
            else if (T == 2) qdot_f32_x4(1, 2, wq, wd, wm, nb, nb, a->xf, k, a->xs, out);
            else qdot_f32_x4(1, 3, wq, wd, wm, nb, nb, a->xf, k, a->xs, out);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < 4; r++) y[(int64_t)t * ldy + n + r] = out[t * 4 + r];
        }
    }
#endif
    /* K-quant rows: every step this way (one order per token whatever T is) */
    const int kq = is_kquant(w);
    /* the last T % 4 tokens as one more (zero-padded) group of 4: re-reading the
     * dequantized rows beats unpacking each row's blocks again per token */
    const int full = T / 4 * 4, rest = T - full;
    float xpad[rest && (T >= 4 || kq) ? 4 * k : 1] __attribute__((aligned(64)));
    if (rest && (T >= 4 || kq)) {
        memcpy(xpad, a->xf + (int64_t)full * k, sizeof(float) * (size_t)rest * k);
        memset(xpad + (int64_t)rest * k, 0, sizeof(float) * (size_t)(4 - rest) * k);
    }
    if (T >= 4 || kq) { /* RT rows dequantized at once, then 4 tokens at a time */
        for (; n + RT <= n1; n += RT) {
            for (int r = 0; r < RT; r++)
                dequant_row(w, w->qs + (int64_t)(n + r) * row_bytes, wd_of(w, n + r, nb),
                            wm_of(w, n + r, nb), nb, wf + (int64_t)r * k);
            for (int t = 0; t < T; t += 4) {
                float out[RT * 4];
                const int nt = T - t < 4 ? T - t : 4;
                dot_rt4_f32(wf, k, nt == 4 ? a->xf + (int64_t)t * k : xpad, k, k, out);
                for (int r = 0; r < RT; r++)
                    for (int i = 0; i < nt; i++) y[(int64_t)(t + i) * ldy + n + r] = out[r * 4 + i];
            }
        }
    }
    if (is_dense(w)) { /* leftover rows */
        dense_rows_f32(w, n, n1, T, a->xf, y, ldy);
        return;
    }
    for (; kq && n < n1; n++) { /* leftover K-quant rows: one dequantized row, 4 tokens */
        dequant_row(w, w->qs + (int64_t)n * row_bytes, NULL, NULL, nb, wf);
        for (int t = 0; t < T; t += 4) {
            float out[4];
            const int nt = T - t < 4 ? T - t : 4;
            dot4_f32(wf, nt == 4 ? a->xf + (int64_t)t * k : xpad, k, k, out);
            for (int i = 0; i < nt; i++) y[(int64_t)(t + i) * ldy + n] = out[i];
        }
    }
    for (; n < n1; n++) { /* leftover rows (and every row of a step under 4 tokens) */
        prefetch_rows(w, n + 2, 1, n1);
        const f16 *wd = w->d + (int64_t)n * nb;
        const f16 *wm = wm_of(w, n, nb);
        const uint8_t *wq = w->qs + (int64_t)n * row_bytes;
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ldy + n] = qdot_f32(w, wq, wd, wm, a->xf + (int64_t)t * k,
                                               a->xs + (int64_t)t * nb, nb);
    }
}
