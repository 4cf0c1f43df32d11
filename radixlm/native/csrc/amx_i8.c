/* int8 activation blocks x Q8, Q4 and K-quant rows on AMX int8 tiles: ACT_INT8 steps of
 * RLM_AMX_I8_MIN_ROWS tokens or more where Linux grants the tile state, with the same bits
 * as the 512-bit paths (matmul_i8.c, kx.c), so a token rounds alike in a step of any size
 * on any path.
 *
 * C[16 rows of W x 16 tokens] (int32) = A[16 rows x one block of W: Q8's 32 bytes as they
 * are, Q4 / K-quant rows unpacked to bytes (Q6_K's q - 32, its blocks of 16)] . B[that block
 * of 16 tokens, 4 bytes a lane: the activations packed once per matmul, pack_token_i8]. One
 * tile product per block gives every (row, token) the block's exact integer sum. Q4 / Q8:
 * the scales are applied as the 512-bit paths do: block b into lane b % 16 of the pair's
 * accumulator (acc += isum * (d_b dx_b), in order), then the lanes summed in the same tree
 * (lane_tree; sum4_rows). Here a lane is one register per row (16 tokens side by side), so
 * one lane's blocks run back to back with the accumulators in registers. K-quants: the
 * integers times the rows' sub-block scales summed per super-block, then kq_dot's two float
 * operations (kquants.c). Rows past the last full 16 of a range run the 512-bit path. */
#include "rlm.h"

#if defined(RLM_AMX) && defined(__AMX_INT8__) && defined(RLM_I8_ZMM)
#define RLM_AMX_I8 1

/* Two sets of tiles, so one block's product runs while the last one's integers are scaled:
 * 0 / 3: C (16 x 16 int32); 1 / 4: A (16 rows x `width` bytes); 2 / 5: B (width / 4 rows of
 * 16 tokens x 4 bytes). */
static void amx_configure_i8(int width) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int set = 0; set < 6; set += 3) {
        c.colsb[set] = 64;
        c.rows[set] = 16;
        c.colsb[set + 1] = (uint16_t)width;
        c.rows[set + 1] = 16;
        c.colsb[set + 2] = 64;
        c.rows[set + 2] = (uint8_t)(width / 4);
    }
    _tile_loadconfig(&c);
}

/* Token t's int8 blocks (xa: nb blocks of 32), scales (xd) and scaled sums (xs) into the B
 * tiles and the scales by token: tile (g, b) at xq + (g nb + b) 512 bytes for g = t / 16,
 * its row r lane t % 16 holding bytes 4r .. 4r + 3 of block b; xdt / xst[(g nb + b) 16 + t
 * % 16] = dx_b / xs_b. xa NULL: a padding token (zeros). */
static void pack_token_i8(const int8_t *xa, const float *xd, const float *xs, int t, int nb,
                          int8_t *xq, float *xdt, float *xst) {
    const int64_t g = t / 16, i = t % 16;
    int32_t *dst = (int32_t *)xq + g * nb * 128 + i;
    float *ds = xdt + g * nb * 16 + i, *ss = xst + g * nb * 16 + i;
    for (int b = 0; b < nb; b++) {
        for (int r = 0; r < 8; r++)
            dst[b * 128 + r * 16] = xa ? ((const int32_t *)xa)[b * 8 + r] : 0;
        ds[b * 16] = xa ? xd[b] : 0.f;
        ss[b * 16] = xa ? xs[b] : 0.f;
    }
}

/* 16 rows' lane accumulators (lane l of row r at acc[l * 16 + r], 16 tokens each) summed
 * as sum4_rows sums a row's lanes: S_j = (a_4j + a_4j+2) + (a_4j+1 + a_4j+3), then (S_0 +
 * S_2) + (S_1 + S_3). out[r] = row r's 16 tokens. */
static inline void lane_tree(const __m512 *acc, __m512 *out) {
    for (int r = 0; r < 16; r++) {
        __m512 s[4];
        for (int j = 0; j < 4; j++)
            s[j] = _mm512_add_ps(_mm512_add_ps(acc[(4 * j) * 16 + r], acc[(4 * j + 2) * 16 + r]),
                                 _mm512_add_ps(acc[(4 * j + 1) * 16 + r], acc[(4 * j + 3) * 16 + r]));
        out[r] = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
    }
}

/* 16 rows' results for token group g (out[r]: row r's 16 tokens) into y[t, n + r] for the
 * group's tokens below T. */
static inline void store_group(const __m512 *out, int g, int T, float *y, int64_t ldy, int n) {
    float cbuf[256] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++) _mm512_store_ps(cbuf + r * 16, out[r]);
    const int t0 = g * 16, nt = T - t0 < 16 ? T - t0 : 16;
    store_transposed(cbuf, nt, 16, y + (int64_t)t0 * ldy + n, ldy);
}

/* Block b's tile product (16 rows from wa, lda bytes apart; the token group's B tiles at
 * bq) on tile set `set` (a tile's number is part of the instruction). width 16: half b % 2
 * of 32-block b / 2's B tile. */
static inline __attribute__((always_inline)) void tile_block(int set, const int8_t *wa,
                                                             int64_t lda, const int8_t *bq,
                                                             int b, const int width) {
    const int8_t *bt = width == 32 ? bq + (int64_t)b * 512 : bq + (int64_t)(b >> 1) * 512 + (b & 1) * 256;
    if (set) {
        _tile_loadd(4, wa + (int64_t)b * width, lda);
        _tile_loadd(5, bt, 64);
        _tile_zero(3);
        _tile_dpbssd(3, 4, 5);
    } else {
        _tile_loadd(1, wa + (int64_t)b * width, lda);
        _tile_loadd(2, bt, 64);
        _tile_zero(0);
        _tile_dpbssd(0, 1, 2);
    }
}

/* The block lane l takes from chunk i (blocks 16 i ..) of a row of nbk blocks, or -1: in a
 * full chunk 16 i + chunk_block(l) (the transposed chunks' lanes, see chunk_fma and
 * q8_full_fma), in the last partial one 16 i + l. */
static inline int lane_block(int nbk, int l, int i) {
    const int c = 16 * i;
    if (c + 16 <= nbk) return c + chunk_block(l);
    return c + l < nbk ? c + l : -1;
}

/* 16 Q8 / Q4 rows (wa, lda; wdt: their scales by block, 16 a block; Q4: wmt their m by
 * block) against one token group (bq: its B tiles, xdt / xst: its scales and scaled sums by
 * block) over nbk blocks of 32: lane by lane, the lane's blocks chunk after chunk
 * (lane_block), their integers scaled into the rows' registers (Q4: the chunk's m term
 * m_{16 i + l} xs first, as qdot_group adds it), each lane stored at acc[l * 16 ..]. The
 * blocks run as one sequence, the next one's tile product issued before the last one's
 * integers are read back. */
static inline __attribute__((always_inline)) void rows_group_i8(
    const int8_t *wa, int64_t lda, int nbk, const int q4, const int8_t *bq,
    const float *xdt, const float *xst, const float *wdt, const float *wmt, __m512 *acc) {
    const int lanes = nbk < 16 ? nbk : 16, chunks = (nbk + 15) / 16;
    int32_t c[2][256] __attribute__((aligned(64)));
    __m512 a[16];
    for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
    int l = 0, i = 0, j = 0, b = lane_block(nbk, 0, 0); /* lane-major */
    tile_block(0, wa, lda, bq, b, 32);
    for (;;) {
        const int pb = b, pl = l, pi = i, set = j & 1;
        do { /* the next block */
            if (++i >= chunks) {
                i = 0;
                l++;
            }
        } while (l < lanes && (b = lane_block(nbk, l, i)) < 0);
        if (l < lanes) tile_block(!set, wa, lda, bq, b, 32);
        if (set) _tile_stored(3, c[1], 64);
        else _tile_stored(0, c[0], 64);
        if (q4) {
            const int mb = 16 * pi + pl;
            const __m512 sv = _mm512_loadu_ps(xst + (int64_t)mb * 16);
            for (int r = 0; r < 16; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(wmt[mb * 16 + r]), sv, a[r]);
        }
        const __m512 xv = _mm512_loadu_ps(xdt + (int64_t)pb * 16);
        for (int r = 0; r < 16; r++)
            a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[set] + r * 16)),
                                   _mm512_mul_ps(_mm512_set1_ps(wdt[pb * 16 + r]), xv), a[r]);
        if (l != pl) { /* lane pl done */
            for (int r = 0; r < 16; r++) {
                acc[pl * 16 + r] = a[r];
                a[r] = _mm512_setzero_ps();
            }
            if (l >= lanes) break;
        }
        j++;
    }
}

/* 16 rows from row n of w (Q8 / Q4) as A tiles (*wa, *lda) with their scales by block
 * (wdt) and, for Q4, their minimums (wmt): Q8 rows as they are, Q4 nibbles unpacked into
 * wbuf. */
static void rows_tile_i8(const QMat *w, int n, int8_t *wbuf, float *wdt, float *wmt,
                         const int8_t **wa) {
    const int k = w->k, nb = k / 32;
    if (w->fmt == FMT_Q8) {
        *wa = (const int8_t *)w->qs + (int64_t)n * k;
        for (int r = 0; r < 16; r++)
            for (int b = 0; b < nb; b++) wdt[b * 16 + r] = H(w->d[(int64_t)(n + r) * nb + b]);
        return;
    }
    for (int r = 0; r < 16; r++) { /* Q4 nibbles to bytes: low nibble element j, high j + 16 */
        const uint8_t *wq = w->qs + (int64_t)(n + r) * (k / 2);
        for (int b = 0; b < nb; b++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(wq + b * 16));
            const __m128i m4 = _mm_set1_epi8(0x0f);
            _mm_store_si128((__m128i *)(wbuf + (int64_t)r * k + b * 32), _mm_and_si128(v, m4));
            _mm_store_si128((__m128i *)(wbuf + (int64_t)r * k + b * 32 + 16),
                            _mm_and_si128(_mm_srli_epi16(v, 4), m4));
            wdt[b * 16 + r] = H(w->d[(int64_t)(n + r) * nb + b]);
            wmt[b * 16 + r] = H(w->m[(int64_t)(n + r) * nb + b]);
        }
    }
    *wa = wbuf;
}

/* y[t, n] for K-quant rows n in [n0, n1), all T tokens, from the packed tiles of the
 * K-quant activations (a->xq with a->xq_k: xdt holds kd_s by 32-block, xst the 32-blocks'
 * sums of a): per 16 rows and 16 tokens, per super-block, each block's tile product times
 * the rows' scales into I_s (and Q4_K / Q5_K's m_j times the sums into M_s), then kq_dot's
 * float operations, a row's 16 tokens a vector. */
static void kq_gemm_amx(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                        int64_t ldy) {
    const int k = w->k, nb = k / 32, nsb = k / 256, groups = (T + 15) / 16;
    const int six = kq_six(w->fmt), width = six ? 16 : 32, per = 256 / width;
    const int full = n0 + (n1 - n0) / 16 * 16;
    int8_t *wbuf = (int8_t *)aligned_alloc(64, (size_t)16 * k);
    int16_t *sc = (int16_t *)malloc(sizeof(int16_t) * 256 * (size_t)nsb);
    float *dd = (float *)malloc(sizeof(float) * 32 * (size_t)nsb);
    float *ds = (float *)malloc(sizeof(float) * ((size_t)nsb * 16 + (size_t)nb));
    if (!wbuf || !sc || !dd || !ds) abort(); /* nothing sensible left to do */
    amx_configure_i8(width);
    for (int n = n0; n < full; n += 16) {
        for (int r = 0; r < 16; r++) {
            uint8_t *q = (uint8_t *)wbuf + (int64_t)r * k;
            if (w->qx && n + r < w->n / 16 * 16) kx_unpack_row(w, n + r, q, ds, ds + nsb * 16);
            else kq_unpack_row(w, w->qs + (int64_t)(n + r) * row_bytes_of(w), q, ds, ds + nsb * 16);
            if (six)
                for (int e = 0; e < k; e += 64)
                    _mm512_store_si512(q + e, _mm512_sub_epi8(_mm512_load_si512(q + e),
                                                              _mm512_set1_epi8(32)));
            kq_row_scales(w, n + r, sc + (int64_t)r * 16 * nsb, dd + (int64_t)r * 2 * nsb);
        }
        for (int g = 0; g < groups; g++) {
            const int8_t *bq = a->xq + (int64_t)g * nb * 512;
            const float *xdt = a->xdt + (int64_t)g * nb * 16, *xst = a->xst + (int64_t)g * nb * 16;
            int32_t c[256] __attribute__((aligned(64)));
            __m512 acc[16];
            for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
            for (int s = 0; s < nsb; s++) {
                __m512i isum[16], msum[16];
                for (int r = 0; r < 16; r++) isum[r] = msum[r] = _mm512_setzero_si512();
                for (int j = 0; j < per; j++) {
                    tile_block(0, wbuf, k, bq, per * s + j, width);
                    _tile_stored(0, c, 64);
                    for (int r = 0; r < 16; r++)
                        isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(
                            _mm512_load_si512(c + 16 * r),
                            _mm512_set1_epi32(sc[(int64_t)r * 16 * nsb + 16 * s + j])));
                    if (six) continue;
                    const __m512i sa = _mm512_cvtps_epi32(_mm512_loadu_ps(xst + (int64_t)(8 * s + j) * 16));
                    for (int r = 0; r < 16; r++)
                        msum[r] = _mm512_add_epi32(msum[r], _mm512_mullo_epi32(
                            sa, _mm512_set1_epi32(sc[(int64_t)r * 16 * nsb + 16 * s + 8 + j])));
                }
                const __m512 kdv = _mm512_loadu_ps(xdt + (int64_t)(8 * s) * 16);
                for (int r = 0; r < 16; r++) {
                    const float *d = dd + (int64_t)r * 2 * nsb + 2 * s;
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(d[0]), kdv),
                                             _mm512_cvtepi32_ps(isum[r]), acc[r]);
                    if (!six)
                        acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_set1_ps(d[1]), kdv),
                                                  _mm512_cvtepi32_ps(msum[r]), acc[r]);
                }
            }
            store_group(acc, g, T, y, ldy, n);
        }
    }
    _tile_release();
    free(ds);
    free(dd);
    free(sc);
    free(wbuf);
    if (full < n1) kq_rows_i8(w, full, n1, T, a, y, ldy);
}

/* Whether K-quant rows run on the tiles: checked once a process, kq_gemm_amx against the
 * rows' 512-bit path (kq_rows_i8) on random Q4_K and Q6_K rows and activations, bit for bit.
 * A disagreement (a tile path this CPU's build was not tested on) keeps K-quants on the
 * 512-bit kernels, said once on stderr: slower prefill, never other numbers. */
static pthread_once_t amx_kq_once = PTHREAD_ONCE_INIT;
static int amx_kq_state;

static int amx_kq_agrees(int fmt) {
    const int n = 32, k = 512, T = 16, nb = k / 32, nsb = k / 256, sbb = fmt == FMT_Q6_K ? 210 : 144;
    uint8_t *qs = (uint8_t *)malloc((size_t)n * nsb * sbb);
    float *x = (float *)malloc(sizeof(float) * T * k), *y = (float *)malloc(sizeof(float) * 2 * T * n);
    int8_t *ka = (int8_t *)aligned_alloc(64, (size_t)T * k), *xq = (int8_t *)aligned_alloc(64, (size_t)T * k);
    float *kd = (float *)malloc(sizeof(float) * T * nsb), *xdt = (float *)malloc(sizeof(float) * 2 * T * nb);
    int16_t *kb = (int16_t *)malloc(sizeof(int16_t) * T * (k / 16));
    if (!qs || !x || !y || !ka || !xq || !kd || !xdt || !kb) abort(); /* nothing sensible left */
    uint32_t r = 2463534242u;
#define RLM_NEXT (r ^= r << 13, r ^= r >> 17, r ^= r << 5)
    for (int i = 0; i < n * nsb * sbb; i++) qs[i] = (uint8_t)RLM_NEXT;
    for (int i = 0; i < n * nsb; i++) { /* finite scales: fp16 1/1024 and 1/2048 */
        uint8_t *p = qs + (int64_t)i * sbb;
        if (fmt == FMT_Q6_K) p[208] = 0x00, p[209] = 0x14;
        else p[0] = 0x00, p[1] = 0x14, p[2] = 0x00, p[3] = 0x10;
    }
    for (int i = 0; i < T * k; i++) x[i] = (float)(int32_t)RLM_NEXT / 2147483648.f;
#undef RLM_NEXT
    for (int t = 0; t < T; t++) {
        float d32[nb], s32[nb];
        int16_t *b = kb + (int64_t)t * (k / 16);
        quantize_row_k(x + (int64_t)t * k, k, ka + (int64_t)t * k, kd + (int64_t)t * nsb, b);
        for (int i = 0; i < nb; i++) {
            d32[i] = kd[(int64_t)t * nsb + i / 8];
            s32[i] = (float)(b[2 * i] + b[2 * i + 1]);
        }
        pack_token_i8(ka + (int64_t)t * k, d32, s32, t, nb, xq, xdt, xdt + T * nb);
    }
    const QMat w = {fmt, n, k, qs, NULL, NULL, NULL};
    Act a;
    memset(&a, 0, sizeof a);
    a.ka = ka, a.kd = kd, a.kb = kb, a.xq = xq, a.xdt = xdt, a.xst = xdt + T * nb, a.xq_k = 1;
    kq_gemm_amx(&w, 0, n, T, &a, y, n);
    kq_rows_i8(&w, 0, n, T, &a, y + T * n, n);
    const int same = memcmp(y, y + T * n, sizeof(float) * T * n) == 0;
    free(qs), free(x), free(y), free(ka), free(xq), free(kd), free(xdt), free(kb);
    return same;
}

static void amx_kq_check(void) {
    amx_kq_state = amx_ok() && amx_kq_agrees(FMT_Q4_K) && amx_kq_agrees(FMT_Q6_K);
    if (amx_ok() && !amx_kq_state)
        fprintf(stderr, "radixlm: AMX int8 tiles disagree with the 512-bit kernels on K-quant "
                        "rows; K-quants stay on the 512-bit kernels\n");
}

static int amx_kq_ok(void) {
    pthread_once(&amx_kq_once, amx_kq_check);
    return amx_kq_state;
}

/* y[t, n] for Q8, Q4 or K-quant rows n in [n0, n1), all T tokens, from the packed tiles
 * (a->xq, a->xdt, a->xst). */
static void qgemm_amx_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                         int64_t ldy) {
    if (is_kquant(w)) {
        kq_gemm_amx(w, n0, n1, T, a, y, ldy);
        return;
    }
    const int k = w->k, nb = k / 32, groups = (T + 15) / 16, q4 = w->fmt == FMT_Q4;
    const int full = n0 + (n1 - n0) / 16 * 16;
    /* wdt [nb x 16], wmt [nb x 16] */
    float *wdt = (float *)aligned_alloc(64, ((size_t)nb * 32 + 16) * 4);
    __m512 *acc = (__m512 *)aligned_alloc(64, 256 * sizeof(__m512));
    int8_t *wbuf = q4 ? (int8_t *)aligned_alloc(64, (size_t)16 * k) : NULL;
    if (!wdt || !acc || (q4 && !wbuf)) abort(); /* nothing sensible left to do */
    float *wmt = wdt + (int64_t)nb * 16;
    for (int i = 0; i < 256; i++) acc[i] = _mm512_setzero_ps(); /* lanes past nb stay 0 */
    amx_configure_i8(32);
    for (int n = n0; n < full; n += 16) {
        const int8_t *wa;
        rows_tile_i8(w, n, wbuf, wdt, wmt, &wa);
        for (int g = 0; g < groups; g++) {
            const int8_t *bq = a->xq + (int64_t)g * nb * 512;
            const float *xdt = a->xdt + (int64_t)g * nb * 16;
            const float *xst = a->xst + (int64_t)g * nb * 16;
            if (q4) rows_group_i8(wa, k, nb, 1, bq, xdt, xst, wdt, wmt, acc);
            else rows_group_i8(wa, k, nb, 0, bq, xdt, xst, wdt, wmt, acc);
            __m512 out[16];
            lane_tree(acc, out);
            store_group(out, g, T, y, ldy, n);
        }
    }
    _tile_release();
    free(wbuf);
    free(acc);
    free(wdt);
    if (full < n1) qgemv_rows_i8zmm(w, full, n1, T, a, y, ldy);
}
#endif
