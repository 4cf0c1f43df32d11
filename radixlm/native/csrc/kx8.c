/* Q8_0 rows repacked 16 side by side (QMat.qx with qs NULL) for the 512-bit VNNI int8
 * kernel, and that kernel. Group g's block b is KX8_BYTES bytes at qx + (g nb + b) KX8_BYTES:
 *   d[16] fp16 (row r's scale of block b), then 8 vectors of 64 bytes, vector v's byte 4 r + e
 *   = element 4 v + e of row r's block b plus 128, as an unsigned byte.
 * The file's own size (34 bytes a row and block). One u8 x s8 dot instruction of a vector
 * against 4 activations broadcast adds 4 products of each of the 16 rows, a row a lane; 8
 * of them leave each row's sum of (w + 128) a over the block, and 128 sum a (the token's,
 * made once per call) taken off leaves the exact sum of w a that matmul_i8.c's Q8 path
 * computes. Each row's integer sums are scaled and added into the lane its block has in
 * qdot_group (a full chunk's block c + j in lane 4 (j % 4) + j / 4, a partial chunk's in
 * lane j) and the lanes summed in sum4_rows' tree: the same operations in the same order,
 * so the same bits (tests/test_native.py). No per-call transposition of the rows: a
 * one-token step streams the rows at the memory's pace. Matrices of whole groups only
 * (n % 16 == 0): ops.Arena keeps the others in the plain layout. */
#include "rlm.h"

#define KX8_BYTES 544

/* Rows r0 .. r0 + 15 of a Q8 matrix (qs: element j of block b of row r at qs + r qrow + b
 * qblk + j; d: its fp16 scale at d + r drow + b dblk, in bytes) as one repacked group. */
static void kx8_repack_group(const int8_t *qs, int64_t qrow, int64_t qblk, const uint8_t *d,
                             int64_t drow, int64_t dblk, int nb, uint8_t *dst) {
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (int64_t)b * KX8_BYTES;
        for (int r = 0; r < 16; r++) {
            memcpy(o + 2 * r, d + r * drow + b * dblk, 2);
            const int8_t *q = qs + r * qrow + b * qblk;
            for (int v = 0; v < 8; v++) {
                uint32_t w;
                memcpy(&w, q + 4 * v, 4);
                w ^= 0x80808080u;
                memcpy(o + 32 + 64 * v + 4 * r, &w, 4);
            }
        }
    }
}

/* Row n of a repacked Q8 matrix in the plain layout: q [k] int8, d [k / 32] fp16. */
static void kx8_unpack_row(const QMat *w, int64_t n, int8_t *q, f16 *d) {
    const int nb = w->k / 32, r = (int)(n % 16);
    const uint8_t *g = w->qx + n / 16 * nb * (int64_t)KX8_BYTES;
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = g + (int64_t)b * KX8_BYTES;
        memcpy(d + b, o + 2 * r, 2);
        for (int v = 0; v < 8; v++)
            for (int e = 0; e < 4; e++)
                q[32 * b + 4 * v + e] = (int8_t)(o[32 + 64 * v + 4 * r + e] ^ 0x80);
    }
}

#ifdef RLM_KX8
/* G tokens (from token t) against repacked group qx (16 rows from row n): per block b the
 * 16 rows' exact sums of w a, then acc[i][L] += sums (H(d) dx_b), L the block's lane in
 * qdot_group; sum4_rows' tree, a row a lane; 16 rows stored at y + n (row stride ldy). */
static inline __attribute__((always_inline)) void kx8_group(const uint8_t *qx, int nb,
                                                            const Act *a, int t, const int G,
                                                            int k, const int32_t *c128,
                                                            float *y, int64_t ldy, int n) {
    __m512 acc[G][16];
    for (int i = 0; i < G; i++)
        for (int l = 0; l < 16; l++) acc[i][l] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = qx + (int64_t)b * KX8_BYTES;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        __m512i st[8];
        for (int v = 0; v < 8; v++) st[v] = _mm512_loadu_si512((const void *)(o + 32 + 64 * v));
        const int j = b % 16, L = b - j + 16 <= nb ? 4 * (j % 4) + j / 4 : j;
        for (int i = 0; i < G; i++) {
            const int64_t ti = t + i;
            const int8_t *x = a->xa + ti * k + 32 * b;
            __m512i p0 = dot_u8s8_512(st[0], kx_bcast4(x));
            __m512i p1 = dot_u8s8_512(st[4], kx_bcast4(x + 16));
            for (int v = 1; v < 4; v++) {
                p0 = dot_acc_512(p0, st[v], kx_bcast4(x + 4 * v));
                p1 = dot_acc_512(p1, st[v + 4], kx_bcast4(x + 16 + 4 * v));
            }
            const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(p0, p1),
                                               _mm512_set1_epi32(c128[(int64_t)i * nb + b]));
            acc[i][L] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                        _mm512_mul_ps(dv, _mm512_set1_ps(a->xd[ti * nb + b])),
                                        acc[i][L]);
        }
    }
    for (int i = 0; i < G; i++) {
        const __m512 *c = acc[i];
        __m512 q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm512_add_ps(_mm512_add_ps(c[4 * j], c[4 * j + 2]),
                                 _mm512_add_ps(c[4 * j + 1], c[4 * j + 3]));
        _mm512_storeu_ps(y + (int64_t)(t + i) * ldy + n,
                         _mm512_add_ps(_mm512_add_ps(q[0], q[2]), _mm512_add_ps(q[1], q[3])));
    }
}

/* Repacked groups g0 .. g1 - 1, all T tokens, into y + 16 g0 - yoff (row stride ldy). */
static void kx8_groups(const QMat *w, int g0, int g1, int T, const Act *a, float *y,
                       int64_t ldy, int yoff) {
    const int k = w->k, nb = k / 32;
    int32_t c128[64 * 128]; /* a tile's 128 sum a per block: 64 tokens x k <= 4096 */
    int32_t *c = nb <= 128 ? c128 : (int32_t *)malloc(sizeof(int32_t) * 64 * (size_t)nb);
    if (!c) abort(); /* no memory for a tile's sums: nothing sensible left to do */
    for (int t0 = 0; t0 < T; t0 += 64) { /* a tile of tokens' activations stays in L2 */
        const int t1 = T - t0 < 64 ? T : t0 + 64;
        for (int t = t0; t < t1; t++)
            for (int b = 0; b < nb; b++) {
                const int8_t *x = a->xa + (int64_t)t * k + 32 * b;
                int sum = 0;
                for (int e = 0; e < 32; e++) sum += x[e];
                c[(int64_t)(t - t0) * nb + b] = 128 * sum;
            }
        for (int g = g0; g < g1; g++) {
            const uint8_t *qx = w->qx + (int64_t)g * nb * KX8_BYTES;
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 7) / 8, G = (left + groups - 1) / groups;
                const int32_t *ct = c + (int64_t)(t - t0) * nb;
                switch (G) {
#define RLM_G(G) case G: kx8_group(qx, nb, a, t, G, k, ct, y, ldy, 16 * g - yoff); break;
                RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4) RLM_G(5) RLM_G(6) RLM_G(7) RLM_G(8)
#undef RLM_G
                }
                t += G;
            }
        }
    }
    if (c != c128) free(c);
}

/* y[t, n] for rows n in [n0, n1) of a repacked Q8 matrix, all T tokens: whole groups in
 * place, a group the range cuts (a row concatenation's part at an odd offset) computed
 * whole aside (each row's sums are its own) and its rows in the range copied. */
static void kx8_rows(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                     int64_t ldy) {
    const int g0 = (n0 + 15) / 16, g1 = n1 / 16;
    if (g0 < g1) kx8_groups(w, g0, g1, T, a, y, ldy, 0);
    for (int g = n0 / 16; g <= (n1 - 1) / 16; g++) {
        if (g >= g0 && g < g1) continue;
        float *tmp = (float *)malloc(sizeof(float) * 16 * (size_t)T);
        if (!tmp) abort();
        kx8_groups(w, g, g + 1, T, a, tmp, 16, 16 * g);
        const int lo = 16 * g > n0 ? 16 * g : n0, hi = 16 * g + 16 < n1 ? 16 * g + 16 : n1;
        for (int t = 0; t < T; t++)
            memcpy(y + (int64_t)t * ldy + lo, tmp + (int64_t)t * 16 + (lo - 16 * g),
                   sizeof(float) * (size_t)(hi - lo));
        free(tmp);
    }
}
#endif
