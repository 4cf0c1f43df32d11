/* bf16 activations x Q4/Q8 blocks on AMX tiles (ACT_BF16 steps of RLM_AMX_MIN_ROWS+ tokens
 * where Linux grants the tile state).
 *
 * C[16 rows of W x 16 tokens] += A[16 rows x 32 columns of W, bf16] . B[32 columns x 16
 * tokens, bf16 pairs]. Weights stay row-major (A needs no transpose: 4 rows dequantized to
 * bf16 as in the AVX-512 path, 16 at a time); the activations are packed once per matmul
 * as B tiles: tile (g, jb) holds tokens 16g.. and columns 32jb.., row i = the pairs
 * (x[t][32jb + 2i], x[t][32jb + 2i + 1]) of its 16 tokens. Linux grants the tile state on
 * request (arch_prctl); where it does not, ACT_BF16 runs the AVX-512 BF16 path. */
#include "rlm.h"

#ifdef RLM_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int amx_state = -1; /* -1 unknown, 0 refused, 1 granted */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_request(void) {
    amx_state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
static int amx_ok(void) {
    pthread_once(&amx_once, amx_request);
    return amx_state == 1;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Tiles 0-3: C for up to 4 token groups; 4: A (weights); 5-7: B (activations). */
static void amx_configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    _tile_loadconfig(&c);
}

/* Row t of x (k bf16 values) into its place in the packed B tiles of nkb column blocks. */
static void pack_token(const uint16_t *row, int t, int nkb, uint32_t *packed) {
    const uint32_t *pairs = (const uint32_t *)row;
    uint32_t *g = packed + (int64_t)(t / 16) * nkb * 256 + (t % 16);
    for (int jb = 0; jb < nkb; jb++)
        for (int i = 0; i < 16; i++) g[(int64_t)jb * 256 + i * 16] = pairs[jb * 16 + i];
}

/* A 16 x 16 transpose of 32-bit lanes in registers: four stages that each swap one bit of
 * the row index with the same bit of the column index. */
static inline __attribute__((always_inline)) void transpose16(__m512 *v) {
    for (int b = 8; b >= 1; b /= 2) {
        int32_t lo[16] __attribute__((aligned(64))), hi[16] __attribute__((aligned(64)));
        for (int col = 0; col < 16; col++) {
            int chunk = col / (2 * b) * (2 * b), off = col % (2 * b);
            lo[col] = off < b ? chunk + off : 16 + chunk + off - b;
            hi[col] = off < b ? chunk + off + b : 16 + chunk + off;
        }
        __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
        for (int j = 0; j < 16; j++) {
            if (j & b) continue;
            __m512 a = v[j], p = v[j + b];
            v[j] = _mm512_permutex2var_ps(a, ilo, p);
            v[j + b] = _mm512_permutex2var_ps(a, ihi, p);
        }
    }
}

/* c [16 rows of W x 16 tokens] (row-major) into y[token i][row r] (row stride ldy) for
 * i < nt, r < rows, transposed in registers. */
static void store_transposed(const float *c, int nt, int rows, float *y, int64_t ldy) {
    __m512 v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_load_ps(c + i * 16);
    transpose16(v);
    const __mmask16 m = (__mmask16)((1u << rows) - 1);
    for (int i = 0; i < nt; i++) _mm512_mask_storeu_ps(y + (int64_t)i * ldy, m, v[i]);
}

/* Rows of k bf16 values dequantized at a time: ~256 KB (L2), a multiple of `unit` rows
 * from `unit` to 128. */
static inline int block_rows(int k, int unit) {
    int block = (int)((256 * 1024) / ((int64_t)k * 2)) / unit * unit;
    return block < unit ? unit : (block > 128 ? 128 : block);
}

/* Rows [nblk, nblk + brows) of w dequantized to bf16 into wb (row stride k), and zero rows
 * up to bpad. */
static inline __attribute__((always_inline)) void dequant_block_bf16(
    const QMat *w, int nblk, int brows, int bpad, uint16_t *wb) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = row_bytes_of(w);
    for (int r = 0; r < brows; r++)
        dequant_row_bf16(w, w->qs + (int64_t)(nblk + r) * row_bytes,
                         wd_of(w, nblk + r, nb), wm_of(w, nblk + r, nb), nb,
                         wb + (int64_t)r * k);
    if (bpad > brows) memset(wb + (int64_t)brows * k, 0, (size_t)(bpad - brows) * k * 2);
}

/* The 2 x 2 register blocking both AMX matmuls run: C tiles 0-3 = A_i . B_j at 2 i + j
 * over nkb blocks of 32 columns, where A tiles 4-5 are a0 and a1 (16 rows of lda bytes,
 * block jb at column 32 jb) and B tiles 6-7 are b0 and b1 (packed pairs, block jb 512
 * values on): each tile load feeds two dot products. two_a / two_b: a1 / b1 exist. */
static inline __attribute__((always_inline)) void amx_tiles_2x2(
    const uint16_t *a0, const uint16_t *a1, int lda, const uint16_t *b0, const uint16_t *b1,
    int nkb, int two_a, int two_b) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    if (two_a && two_b) {
        for (int jb = 0; jb < nkb; jb++) {
            _tile_loadd(4, a0 + jb * 32, lda);
            _tile_loadd(6, b0 + jb * 512, 64);
            _tile_loadd(7, b1 + jb * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a1 + jb * 32, lda);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    } else {
        for (int jb = 0; jb < nkb; jb++) {
            _tile_loadd(4, a0 + jb * 32, lda);
            _tile_loadd(6, b0 + jb * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (two_b) {
                _tile_loadd(7, b1 + jb * 512, 64);
                _tile_dpbf16ps(1, 4, 7);
            }
            if (two_a) {
                _tile_loadd(5, a1 + jb * 32, lda);
                _tile_dpbf16ps(2, 5, 6);
            }
        }
    }
}

/* C tile c (0-3) to out, rows stride bytes apart (a tile's number is part of the
 * instruction). */
static inline __attribute__((always_inline)) void amx_store(int c, float *out, int64_t stride) {
    switch (c) {
    case 0: _tile_stored(0, out, stride); break;
    case 1: _tile_stored(1, out, stride); break;
    case 2: _tile_stored(2, out, stride); break;
    default: _tile_stored(3, out, stride); break;
    }
}

/* Rows are dequantized a block at a time (up to 128 rows, ~256 KB of bf16: L2), and every
 * 64-token group of B tiles then serves all the block's 16-row groups: for prefill-sized
 * steps the B tiles would otherwise stream from memory once per 16 rows. */
static void qgemv_rows_amx(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                           int64_t ldy) {
    const int k = w->k, nkb = k / 32, groups = (T + 15) / 16;
    const int block = block_rows(k, 16);
    uint16_t *wb = (uint16_t *)aligned_alloc(64, (size_t)block * k * 2);
    float cbuf[16 * 16] __attribute__((aligned(64)));
    if (!wb) abort(); /* no memory for 256 KB: nothing sensible left to do */
    amx_configure();
    for (int nblk = n0; nblk < n1; nblk += block) {
        const int brows = n1 - nblk < block ? n1 - nblk : block;
        const int bpad = (brows + 15) / 16 * 16;
        dequant_block_bf16(w, nblk, brows, bpad, wb);
        /* A: two 16-row groups of weights; B: two 16-token groups of activations */
        for (int g = 0; g < groups; g += 2) {
            const int two_g = groups - g >= 2;
            const uint16_t *b0 = a->xb + (int64_t)g * nkb * 512;
            const uint16_t *b1 = b0 + (int64_t)nkb * 512;
            for (int rg = 0; rg < bpad; rg += 32) {
                const int two_r = bpad - rg >= 32;
                const uint16_t *w0 = wb + (int64_t)rg * k, *w1 = w0 + (int64_t)16 * k;
                amx_tiles_2x2(w0, w1, k * 2, b0, b1, nkb, two_r, two_g);
                for (int c = 0; c < 4; c++) {
                    const int ri = c / 2, gj = c % 2;
                    if ((ri && !two_r) || (gj && !two_g)) continue;
                    amx_store(c, cbuf, 64);
                    const int r0 = rg + 16 * ri, rows = brows - r0 < 16 ? brows - r0 : 16;
                    if (rows <= 0) continue;
                    const int t0 = (g + gj) * 16, nt = T - t0 < 16 ? T - t0 : 16;
                    store_transposed(cbuf, nt, rows, y + (int64_t)t0 * ldy + nblk + r0, ldy);
                }
            }
        }
    }
    _tile_release();
    free(wb);
}

/* T >= RLM_AMX_LARGE_T (prefill chunks): C[16 tokens x 16 rows of W] += A[16 tokens x 32
 * columns, the bf16 activation rows as they are] . B[32 columns x 16 rows of W, bf16
 * pairs]. The B tiles are made once per block of rows (a 16 x 16 transpose of 32-bit
 * pairs per tile) and serve every token, and C is stored straight into y: the per-tile
 * transposes of the output, which dominated at hundreds of tokens, are gone. */
static void transpose_pairs16(const uint16_t *src, int64_t src_stride, uint16_t *dst) {
    __m512 v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_castsi512_ps(_mm512_loadu_si512(src + i * src_stride));
    transpose16(v);
    for (int i = 0; i < 16; i++) _mm512_store_si512(dst + i * 32, _mm512_castps_si512(v[i]));
}

static void qgemm_amx_large(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                            int64_t ldy) {
    const int k = w->k, nkb = k / 32, groups = (T + 15) / 16;
    const int block = block_rows(k, 32);
    uint16_t *wb = (uint16_t *)aligned_alloc(64, (size_t)block * k * 2);
    uint16_t *bt = (uint16_t *)aligned_alloc(64, (size_t)block * k * 2); /* B tiles */
    float cbuf[16 * 16] __attribute__((aligned(64)));
    if (!wb || !bt) abort();
    amx_configure();
    for (int nblk = n0; nblk < n1; nblk += block) {
        const int brows = n1 - nblk < block ? n1 - nblk : block;
        const int bpad = (brows + 15) / 16 * 16, rgroups = bpad / 16;
        dequant_block_bf16(w, nblk, brows, bpad, wb);
        for (int rg = 0; rg < rgroups; rg++) /* B tile (rg, jb) at bt + (rg nkb + jb) 512 */
            for (int jb = 0; jb < nkb; jb++)
                transpose_pairs16(wb + (int64_t)rg * 16 * k + jb * 32, k,
                                  bt + ((int64_t)rg * nkb + jb) * 512);
        /* A: two 16-token groups of activations; B: two 16-row groups of weights */
        for (int g = 0; g < groups; g += 2) {
            const int two_g = groups - g >= 2;
            const uint16_t *a0 = a->xb + (int64_t)g * 16 * k, *a1 = a0 + (int64_t)16 * k;
            for (int rg = 0; rg < rgroups; rg += 2) {
                const int two_r = rgroups - rg >= 2;
                const uint16_t *b0 = bt + (int64_t)rg * nkb * 512, *b1 = b0 + (int64_t)nkb * 512;
                amx_tiles_2x2(a0, a1, k * 2, b0, b1, nkb, two_g, two_r);
                for (int c = 0; c < 4; c++) { /* C tile c = (token group c / 2, rows c % 2) */
                    const int ti = c / 2, rj = c % 2;
                    if ((ti && !two_g) || (rj && !two_r)) continue;
                    const int t0 = (g + ti) * 16, r0 = (rg + rj) * 16;
                    const int nt = T - t0 < 16 ? T - t0 : 16, rows = brows - r0 < 16 ? brows - r0 : 16;
                    float *dst = y + (int64_t)t0 * ldy + nblk + r0;
                    const int direct = nt == 16 && rows == 16;
                    float *out = direct ? dst : cbuf;
                    amx_store(c, out, direct ? ldy * 4 : 64);
                    if (!direct)
                        for (int i = 0; i < nt; i++)
                            memcpy(dst + (int64_t)i * ldy, cbuf + i * 16, (size_t)rows * 4);
                }
            }
        }
    }
    _tile_release();
    free(bt);
    free(wb);
}
#endif
