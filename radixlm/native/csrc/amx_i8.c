/* int8 activation blocks x Q8 and K-quant rows on AMX int8 tiles: ACT_INT8 steps of
 * RLM_AMX_I8_MIN_ROWS tokens or more where Linux grants the tile state, with the same bits
 * as the 512-bit paths (matmul_i8.c, kquants.c), so a token rounds alike in a step of any
 * size on any path.
 *
 * C[16 rows of W x 16 tokens] (int32) = A[16 rows x one block of W: Q8's 32 bytes as they
 * are, K-quant rows unpacked to bytes (Q6_K's q - 32, its blocks of 16)] . B[that block of
 * 16 tokens, 4 bytes a lane: the activations packed once per matmul, pack_token_i8]. One
 * tile product per block gives every (row, token) the block's exact integer sum, and the
 * scales are applied as the 512-bit paths do: block b into lane b % 16 of the pair's
 * accumulator (acc += isum * (d_b dx_b), in order), a K-quant's m terms (dmin m_j) (dx_j
 * sum a) into lane j % 8 of another, then the lanes summed in the same trees (lane_tree,
 * m_tree; kq_lanes_sum). Here a lane is one register per row (16 tokens side by side), so
 * one lane's blocks run back to back with the accumulators in registers. Rows past the
 * last full 16 of a range run the 512-bit path. */
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
 * as sum4_rows and kq_lanes_sum sum a row's lanes: S_j = (a_4j + a_4j+2) + (a_4j+1 +
 * a_4j+3), then (S_0 + S_2) + (S_1 + S_3); minus, with m (8 lanes), ((m_0 + m_2) + (m_1 +
 * m_3)) + ((m_4 + m_6) + (m_5 + m_7)). out[r] = row r's 16 tokens. */
static inline void lane_tree(const __m512 *acc, const __m512 *m, __m512 *out) {
    for (int r = 0; r < 16; r++) {
        __m512 s[4];
        for (int j = 0; j < 4; j++)
            s[j] = _mm512_add_ps(_mm512_add_ps(acc[(4 * j) * 16 + r], acc[(4 * j + 2) * 16 + r]),
                                 _mm512_add_ps(acc[(4 * j + 1) * 16 + r], acc[(4 * j + 3) * 16 + r]));
        out[r] = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
        if (!m) continue;
        const __m512 lo = _mm512_add_ps(_mm512_add_ps(m[0 * 16 + r], m[2 * 16 + r]),
                                        _mm512_add_ps(m[1 * 16 + r], m[3 * 16 + r]));
        const __m512 hi = _mm512_add_ps(_mm512_add_ps(m[4 * 16 + r], m[6 * 16 + r]),
                                        _mm512_add_ps(m[5 * 16 + r], m[7 * 16 + r]));
        out[r] = _mm512_sub_ps(out[r], _mm512_add_ps(lo, hi));
    }
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

/* The block lane l takes from chunk i (blocks 16 i ..) of a row of nbk blocks, or -1: block
 * 16 i + l, or in a full chunk of Q4 / Q8 rows 16 i + chunk_block(l) (the transposed
 * chunks' lanes, see chunk_fma and q8_full_fma). */
static inline int lane_block(int chunked, int nbk, int l, int i) {
    const int c = 16 * i;
    if (chunked && c + 16 <= nbk) return c + chunk_block(l);
    return c + l < nbk ? c + l : -1;
}

/* 16 rows (wa, lda; wdt: their scales by block, 16 a block; Q4: wmt their m by block)
 * against one token group (bq: its B tiles, xdt / xst: its scales and scaled sums by
 * 32-block) over nbk blocks of `width`: lane by lane, the lane's blocks chunk after chunk
 * (lane_block), their integers scaled into the rows' registers (Q4: the chunk's m term
 * m_{16 i + l} xs first, as qdot_group adds it), each lane stored at acc[l * 16 ..]. The
 * blocks run as one sequence, the next one's tile product issued before the last one's
 * integers are read back. */
static inline __attribute__((always_inline)) void rows_group_i8(
    const int8_t *wa, int64_t lda, int nbk, const int width, const int chunked, const int q4,
    const int8_t *bq,
    const float *xdt, const float *xst, const float *wdt, const float *wmt, __m512 *acc) {
    const int lanes = nbk < 16 ? nbk : 16, chunks = (nbk + 15) / 16;
    int32_t c[2][256] __attribute__((aligned(64)));
    __m512 a[16];
    for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
    int l = 0, i = 0, j = 0, b = lane_block(chunked, nbk, 0, 0); /* lane-major */
    tile_block(0, wa, lda, bq, b, width);
    for (;;) {
        const int pb = b, pl = l, pi = i, set = j & 1;
        do { /* the next block */
            if (++i >= chunks) {
                i = 0;
                l++;
            }
        } while (l < lanes && (b = lane_block(chunked, nbk, l, i)) < 0);
        if (l < lanes) tile_block(!set, wa, lda, bq, b, width);
        if (set) _tile_stored(3, c[1], 64);
        else _tile_stored(0, c[0], 64);
        if (q4) {
            const int mb = 16 * pi + pl;
            const __m512 sv = _mm512_loadu_ps(xst + (int64_t)mb * 16);
            for (int r = 0; r < 16; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(wmt[mb * 16 + r]), sv, a[r]);
        }
        const __m512 xv = _mm512_loadu_ps(xdt + (int64_t)(width == 32 ? pb : pb >> 1) * 16);
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

/* The m terms of 16 K-quant rows (wmt: dmin m by 32-block, 16 a block) against one token
 * group (xst: its scaled sums): lane j gets blocks j, j + 8, ... (one a super-block), as
 * ksb_token's accm, stored at m[j * 16 ..]. */
static void mterm_group(int nb, const float *xst, const float *wmt, __m512 *m) {
    for (int j = 0; j < 8; j++) {
        __m512 a[16];
        for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
        for (int b = j; b < nb; b += 8) {
            const __m512 xv = _mm512_loadu_ps(xst + (int64_t)b * 16);
            for (int r = 0; r < 16; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(wmt[b * 16 + r]), xv, a[r]);
        }
        for (int r = 0; r < 16; r++) m[j * 16 + r] = a[r];
    }
}

/* 16 rows from row n of w as A tiles (*wa, *lda) with their scales by block (wdt) and, for
 * Q4_K / Q5_K, m-term scales (wmt): Q8 rows as they are; K-quant rows unpacked into wbuf
 * (Q6_K as q - 32), their scales as kq_unpack_row makes them (ksb_load's values). */
static void rows_tile_i8(const QMat *w, int n, int8_t *wbuf, float *sbuf, float *wdt,
                         float *wmt, const int8_t **wa) {
    const int k = w->k, nb = k / 32;
    if (w->fmt == FMT_Q8) {
        *wa = (const int8_t *)w->qs + (int64_t)n * k;
        for (int r = 0; r < 16; r++)
            for (int b = 0; b < nb; b++) wdt[b * 16 + r] = H(w->d[(int64_t)(n + r) * nb + b]);
        return;
    }
    if (w->fmt == FMT_Q4) { /* nibbles to bytes: low nibble element j, high j + 16 */
        for (int r = 0; r < 16; r++) {
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
        return;
    }
    const int ns = k / 256 * kq_scales_per_sb(w->fmt);
    const int64_t rb = row_bytes_of(w);
    float *ds = sbuf, *dm = sbuf + ns;
    for (int r = 0; r < 16; r++) {
        uint8_t *q = (uint8_t *)wbuf + (int64_t)r * k;
        if (w->qx && n + r < w->n / 16 * 16) kx_unpack_row(w, n + r, q, ds, dm);
        else kq_unpack_row(w, w->qs + (int64_t)(n + r) * rb, q, ds, dm);
        if (w->fmt == FMT_Q6_K)
            for (int e = 0; e < k; e += 64)
                _mm512_store_si512(q + e, _mm512_sub_epi8(_mm512_load_si512(q + e),
                                                          _mm512_set1_epi8(32)));
        for (int b = 0; b < ns; b++) wdt[b * 16 + r] = ds[b];
        for (int b = 0; w->fmt != FMT_Q6_K && b < nb; b++) wmt[b * 16 + r] = dm[b];
    }
    *wa = wbuf;
}

/* y[t, n] for Q8 or K-quant rows n in [n0, n1), all T tokens, from the packed tiles
 * (a->xq, a->xdt, a->xst). */
static void qgemm_amx_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                         int64_t ldy) {
    const int k = w->k, nb = k / 32, groups = (T + 15) / 16, kq = is_kquant(w);
    const int q4 = w->fmt == FMT_Q4;
    const int width = w->fmt == FMT_Q6_K ? 16 : 32, nbk = k / width;
    const int full = n0 + (n1 - n0) / 16 * 16;
    /* wdt [nbk x 16], wmt [nb x 16], sbuf (kq_unpack_row's scales, < 2 nb) */
    float *wdt = (float *)aligned_alloc(64, ((size_t)nbk * 16 + (size_t)nb * 18 + 16) * 4);
    __m512 *acc = (__m512 *)aligned_alloc(64, (256 + 128) * sizeof(__m512));
    int8_t *wbuf = kq || q4 ? (int8_t *)aligned_alloc(64, (size_t)16 * k) : NULL;
    if (!wdt || !acc || ((kq || q4) && !wbuf)) abort(); /* nothing sensible left to do */
    float *wmt = wdt + (int64_t)nbk * 16, *sbuf = wmt + (int64_t)nb * 16;
    __m512 *m = acc + 256;
    for (int i = 0; i < 384; i++) acc[i] = _mm512_setzero_ps(); /* lanes past nbk stay 0 */
    amx_configure_i8(width);
    for (int n = n0; n < full; n += 16) {
        const int8_t *wa;
        rows_tile_i8(w, n, wbuf, sbuf, wdt, wmt, &wa);
        for (int g = 0; g < groups; g++) {
            const int8_t *bq = a->xq + (int64_t)g * nb * 512;
            const float *xdt = a->xdt + (int64_t)g * nb * 16;
            const float *xst = a->xst + (int64_t)g * nb * 16;
            if (q4) rows_group_i8(wa, k, nbk, 32, 1, 1, bq, xdt, xst, wdt, wmt, acc);
            else if (!kq) rows_group_i8(wa, k, nbk, 32, 1, 0, bq, xdt, xst, wdt, wmt, acc);
            else if (width == 32) rows_group_i8(wa, k, nbk, 32, 0, 0, bq, xdt, xst, wdt, wmt, acc);
            else rows_group_i8(wa, k, nbk, 16, 0, 0, bq, xdt, xst, wdt, wmt, acc);
            if (kq && width == 32) mterm_group(nb, xst, wmt, m);
            __m512 out[16];
            float cbuf[256] __attribute__((aligned(64)));
            lane_tree(acc, kq ? m : NULL, out);
            for (int r = 0; r < 16; r++) _mm512_store_ps(cbuf + r * 16, out[r]);
            const int t0 = g * 16, nt = T - t0 < 16 ? T - t0 : 16;
            store_transposed(cbuf, nt, 16, y + (int64_t)t0 * ldy + n, ldy);
        }
    }
    _tile_release();
    free(wbuf);
    free(acc);
    free(wdt);
    if (full < n1) {
        if (kq) kq_rows_i8(w, full, n1, T, a, y, ldy);
        else qgemv_rows_i8zmm(w, full, n1, T, a, y, ldy);
    }
}
#endif
