/* int8 activation blocks x Q8 rows on AMX int8 tiles: ACT_INT8 steps of RLM_AMX_I8_MIN_ROWS
 * tokens or more where Linux grants the tile state, with the same bits as the 512-bit path
 * (matmul_i8.c), so a token rounds alike in a step of any size on any path.
 *
 * C[16 rows of W x 16 tokens] (int32) = A[16 rows x 32 bytes: block b of the Q8 rows as
 * they are] . B[block b of 16 tokens, 4 bytes a lane: the activations packed once per
 * matmul, pack_token_i8]. One tile product per block gives every (row, token) the block's
 * exact integer sum, and the scales are applied as q8_chunk_fma does: block b into lane
 * b % 16 of the pair's accumulator (acc += isum * (d_b dx_b), chunk after chunk), then the
 * 16 lanes summed in sum4_rows' tree. Here a lane is one register per row (16 tokens
 * side by side), so the chunks of one lane run back to back with the accumulators in
 * registers. Rows past the last full 16 of a range run the 512-bit path. */
#include "rlm.h"

#if defined(RLM_AMX) && defined(__AMX_INT8__) && defined(RLM_I8_ZMM)
#define RLM_AMX_I8 1

/* Two sets of tiles, so one block's product runs while the last one's integers are scaled:
 * 0 / 3: C (16 x 16 int32); 1 / 4: A (16 rows x 32 bytes); 2 / 5: B (8 rows x 16 tokens x
 * 4 bytes). */
static void amx_configure_i8(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int set = 0; set < 6; set += 3) {
        c.colsb[set] = 64;
        c.rows[set] = 16;
        c.colsb[set + 1] = 32;
        c.rows[set + 1] = 16;
        c.colsb[set + 2] = 64;
        c.rows[set + 2] = 8;
    }
    _tile_loadconfig(&c);
}

/* Token t's int8 blocks (xa: nb blocks of 32) and scales (xd) into the B tiles and the
 * scales by token: tile (g, b) at xq + (g nb + b) 512 bytes for g = t / 16, its row r lane
 * t % 16 holding bytes 4r .. 4r + 3 of block b; xdt[(g nb + b) 16 + t % 16] = dx_b. xa /
 * xd NULL: a padding token (zeros). */
static void pack_token_i8(const int8_t *xa, const float *xd, int t, int nb, int8_t *xq,
                          float *xdt) {
    const int64_t g = t / 16, i = t % 16;
    int32_t *dst = (int32_t *)xq + g * nb * 128 + i;
    float *ds = xdt + g * nb * 16 + i;
    for (int b = 0; b < nb; b++) {
        for (int r = 0; r < 8; r++)
            dst[b * 128 + r * 16] = xa ? ((const int32_t *)xa)[b * 8 + r] : 0;
        ds[b * 16] = xd ? xd[b] : 0.f;
    }
}

/* 16 rows' lane accumulators (lane l of row r at acc[l * 16 + r], 16 tokens each) summed
 * as sum4_rows sums a row's lanes: S_j = (a_4j + a_4j+2) + (a_4j+1 + a_4j+3), then
 * (S_0 + S_2) + (S_1 + S_3); out[r] = row r's 16 tokens. */
static inline void lane_tree(const __m512 *acc, __m512 *out) {
    for (int r = 0; r < 16; r++) {
        __m512 s[4];
        for (int j = 0; j < 4; j++)
            s[j] = _mm512_add_ps(_mm512_add_ps(acc[(4 * j) * 16 + r], acc[(4 * j + 2) * 16 + r]),
                                 _mm512_add_ps(acc[(4 * j + 1) * 16 + r], acc[(4 * j + 3) * 16 + r]));
        out[r] = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
    }
}

/* Block b's tile product (16 rows at wq, the token group's B tiles at bq) on tile set
 * `set` (a tile's number is part of the instruction). */
static inline __attribute__((always_inline)) void tile_block(int set, const uint8_t *wq, int k,
                                                             const int8_t *bq, int b) {
    if (set) {
        _tile_loadd(4, wq + b * 32, k);
        _tile_loadd(5, bq + (int64_t)b * 512, 64);
        _tile_zero(3);
        _tile_dpbssd(3, 4, 5);
    } else {
        _tile_loadd(1, wq + b * 32, k);
        _tile_loadd(2, bq + (int64_t)b * 512, 64);
        _tile_zero(0);
        _tile_dpbssd(0, 1, 2);
    }
}

/* 16 rows (row n of w; wdt: their scales by block, 16 a block) against one token group
 * (bq: its B tiles, xdt: its scales): lane by lane, the lane's blocks l, l + 16, ... in
 * order, their integers scaled into the rows' registers and each lane stored at acc[l *
 * 16 ..]. The blocks run as one sequence, the next one's tile product issued before the
 * last one's integers are read back. */
static void rows_group_i8(const QMat *w, int n, const int8_t *bq, const float *xdt,
                          const float *wdt, __m512 *acc) {
    const int k = w->k, nb = k / 32, lanes = nb < 16 ? nb : 16;
    const uint8_t *wq = w->qs + (int64_t)n * k;
    int32_t c[2][256] __attribute__((aligned(64)));
    __m512 a[16];
    for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
    /* block order: lane-major (b = l + 16 i); job j's block and the next one */
    int l = 0, b = 0, j = 0;
    tile_block(0, wq, k, bq, 0);
    for (;;) {
        const int pb = b, pl = l, set = j & 1;
        if ((b += 16) >= nb) b = ++l; /* the next block */
        if (l < lanes) tile_block(!set, wq, k, bq, b);
        if (set) _tile_stored(3, c[1], 64);
        else _tile_stored(0, c[0], 64);
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

/* y[t, n] for Q8 rows n in [n0, n1), all T tokens, from the packed tiles (a->xq, a->xdt). */
static void qgemm_amx_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                         int64_t ldy) {
    const int k = w->k, nb = k / 32, groups = (T + 15) / 16;
    const int full = n0 + (n1 - n0) / 16 * 16;
    float *wdt = (float *)aligned_alloc(64, (size_t)nb * 16 * 4);
    __m512 *acc = (__m512 *)aligned_alloc(64, 256 * sizeof(__m512));
    if (!wdt || !acc) abort(); /* no memory for a few KB: nothing sensible left to do */
    for (int i = 0; i < 256; i++) acc[i] = _mm512_setzero_ps(); /* lanes past nb stay 0 */
    amx_configure_i8();
    for (int n = n0; n < full; n += 16) {
        for (int r = 0; r < 16; r++)
            for (int b = 0; b < nb; b++) wdt[b * 16 + r] = H(w->d[(int64_t)(n + r) * nb + b]);
        for (int g = 0; g < groups; g++) {
            const int8_t *bq = a->xq + (int64_t)g * nb * 512;
            const float *xdt = a->xdt + (int64_t)g * nb * 16;
            rows_group_i8(w, n, bq, xdt, wdt, acc);
            __m512 out[16];
            float cbuf[256] __attribute__((aligned(64)));
            lane_tree(acc, out);
            for (int r = 0; r < 16; r++) _mm512_store_ps(cbuf + r * 16, out[r]);
            const int t0 = g * 16, nt = T - t0 < 16 ? T - t0 : 16;
            store_transposed(cbuf, nt, 16, y + (int64_t)t0 * ldy + n, ldy);
        }
    }
    _tile_release();
    free(acc);
    free(wdt);
    if (full < n1) qgemv_rows_i8zmm(w, full, n1, T, a, y, ldy);
}
#endif
