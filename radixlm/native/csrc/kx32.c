/* 32-element block rows (Q8_0, Q4_0 / Q4_1, IQ4, Q5_0) repacked 16 side by side (QMat.qx, qs NULL)
 * for the 512-bit VNNI int8 kernel, and that kernel. Group g (rows 16 g ..) takes nb
 * kx32_bytes() from qx + g nb kx32_bytes():
 *   Q8 (544 bytes a block): block b at 544 b: d[16] fp16 (row r's scale of block b), then 8
 *     vectors of 64 bytes, vector v's byte 4 r + e = element 4 v + e of row r's block plus
 *     128, unsigned.
 *   Q4 (320 bytes a block), by chunks of 16 blocks (the last may hold fewer, nc): chunk c at
 *     320 c holds the minimums m[nc][16] fp16 first (read together, before the chunk's
 *     products), then per block d[16] fp16 and 4 vectors of 64 bytes, vector v's byte 4 r +
 *     e = element 4 v + e of row r's block in its low nibble, 16 + 4 v + e in its high.
 *   IQ4 (288 bytes a block): block b at 288 b: d[16] fp16, then Q4's 4 vectors of nibbles,
 *     each an index into IQ4_GRID: the Q8 block of those values at 18 bytes a row's block
 *     against 34, computed as Q8's (the same bits as its Q8 rewrite: the grid's value plus
 *     128, unsigned, from one byte shuffle, then Q8's sums, lanes and scales).
 *   Q5 (352 bytes a block, the file's size): block b at 352 b: d[16] fp16, then Q4's 4
 *     vectors of nibbles, then 8 masks of 64 bits: mask s's bit 4 r + e is the fifth bit of
 *     element 4 s + e of row r (the vector of nibbles s % 4, low for s < 4, high after):
 *     computed as Q8's, the value + 128 being nibble + 112, + 16 where the bit is set.
 * The plain layout's size (IQ4: about the file's). One u8 x s8 dot instruction of a vector
 * against 4 activations
 * broadcast adds 4 products of each of the 16 rows, a row a lane: a block's 16 integer sums
 * after 8 of them (Q8: of (w + 128) a, less 128 sum a, the token's, made once per call: the
 * exact sum of w a). Each row's sums are scaled and added into the lane its block has in
 * matmul_i8.c's qdot_group (a full chunk's block c + j in lane 4 (j % 4) + j / 4, a partial
 * chunk's in lane j; Q4's m terms m_b (dx_b sum a) in lane j, before the chunk's products)
 * and the lanes summed in sum4_rows' tree (kx_lanes_tree): the same operations in the same
 * order, so the same bits (tests/test_native.py). Q4 reads the activations where
 * interleave_act put them.
 * No per-call transposition of the rows: a one-token step streams them at the memory's
 * pace. Matrices of whole groups only (n % 16 == 0): arena.Arena keeps others plain. */
#include "rlm.h"

static inline int64_t kx32_bytes(int fmt) {
    return fmt == FMT_Q8 ? 544 : fmt == FMT_IQ4 ? 288 : fmt == FMT_Q5 ? 352 : 320;
}

/* Where block b's record (d, then the quants) lies in a group of nb blocks. */
static inline int64_t kx32_at(int fmt, int nb, int b) {
    if (fmt == FMT_Q8) return 544 * (int64_t)b;
    if (fmt == FMT_IQ4 || fmt == FMT_Q5) return kx32_bytes(fmt) * (int64_t)b;
    const int j = b % 16, c = b - j, nc = nb - c < 16 ? nb - c : 16;
    return 320 * (int64_t)c + 32 * nc + 288 * j;
}

/* Where block b's minimums (Q4) lie: among its chunk's, first. */
static inline int64_t kx32_min_at(int b) { return 320 * (int64_t)(b - b % 16) + 32 * (b % 16); }

/* Rows 0 .. 15 of a block matrix (qs: block b of row r at qs + r qrow + b qblk, 32 bytes for
 * Q8, 16 for Q4, IQ4 and Q5; its fp16 scale at d + r drow + b dblk, Q4's minimum (fp16) or
 * Q5's fifth bits (32, little-endian) likewise at m; strides in bytes) as one repacked
 * group. */
static void kx32_repack_group(int fmt, const uint8_t *qs, int64_t qrow, int64_t qblk,
                              const uint8_t *d, int64_t drow, int64_t dblk, const uint8_t *m,
                              int64_t mrow, int64_t mblk, int nb, uint8_t *dst) {
    const int q8 = fmt == FMT_Q8;
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + kx32_at(fmt, nb, b), *v = o + 32;
        if (fmt == FMT_Q5) { /* the masks: row r's fifth bits 4 s .. 4 s + 3 at 4 r */
            uint64_t mask[8] = {0};
            for (int r = 0; r < 16; r++) {
                uint32_t qh;
                memcpy(&qh, m + r * mrow + b * mblk, 4);
                for (int s = 0; s < 8; s++) mask[s] |= (uint64_t)((qh >> (4 * s)) & 15) << (4 * r);
            }
            memcpy(o + 288, mask, sizeof mask);
        }
        for (int r = 0; r < 16; r++) {
            memcpy(o + 2 * r, d + r * drow + b * dblk, 2);
            if (fmt == FMT_Q4) memcpy(dst + kx32_min_at(b) + 2 * r, m + r * mrow + b * mblk, 2);
            const uint8_t *q = qs + r * qrow + b * qblk;
            for (int s = 0; s < (q8 ? 8 : 4); s++) {
                uint32_t e4; /* (Q4: the plain block's byte j holds elements j, 16 + j) */
                memcpy(&e4, q + 4 * s, 4);
                if (q8) e4 ^= 0x80808080u;
                memcpy(v + 64 * s + 4 * r, &e4, 4);
            }
        }
    }
}

/* Row n of a repacked matrix in the plain layout: qs [nb, 32 | 16] bytes, d (and Q4's m)
 * [nb] fp16; IQ4's as Q8's (its values from the grid). */
static void kx32_unpack_row(const QMat *w, int64_t n, uint8_t *qs, f16 *d, f16 *m) {
    const int nb = w->k / 32, r = (int)(n % 16), q8 = w->fmt == FMT_Q8;
    if (w->fmt == FMT_Q5) { /* as its Q8 rewrite: (nibble | bit << 4) - 16 */
        const uint8_t *g = w->qx + n / 16 * nb * kx32_bytes(FMT_Q5);
        for (int b = 0; b < nb; b++) {
            const uint8_t *o = g + kx32_at(FMT_Q5, nb, b), *v = o + 32;
            uint64_t mask[8];
            memcpy(d + b, o + 2 * r, 2);
            memcpy(mask, o + 288, sizeof mask);
            for (int s = 0; s < 8; s++)
                for (int e = 0; e < 4; e++) {
                    const uint8_t x = v[64 * (s % 4) + 4 * r + e];
                    const int nib = s < 4 ? x & 15 : x >> 4, bit = (int)(mask[s] >> (4 * r + e)) & 1;
                    qs[32 * b + 4 * s + e] = (uint8_t)(int8_t)((nib | bit << 4) - 16);
                }
        }
        return;
    }
    const uint8_t *g = w->qx + n / 16 * nb * kx32_bytes(w->fmt);
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = g + kx32_at(w->fmt, nb, b), *v = o + 32;
        memcpy(d + b, o + 2 * r, 2);
        if (w->fmt == FMT_Q4) memcpy(m + b, g + kx32_min_at(b) + 2 * r, 2);
        for (int s = 0; s < (q8 ? 8 : 4); s++) {
            uint32_t e4;
            memcpy(&e4, v + 64 * s + 4 * r, 4);
            if (q8) e4 ^= 0x80808080u;
            if (w->fmt == FMT_IQ4) { /* element 4 s + e low, 16 + 4 s + e high */
                for (int e = 0; e < 4; e++) {
                    const uint8_t x = (uint8_t)(e4 >> (8 * e));
                    qs[32 * b + 4 * s + e] = (uint8_t)IQ4_GRID[x & 15];
                    qs[32 * b + 16 + 4 * s + e] = (uint8_t)IQ4_GRID[x >> 4];
                }
                continue;
            }
            memcpy(qs + (q8 ? 32 : 16) * b + 4 * s, &e4, 4);
        }
    }
}

#ifdef RLM_KX32
/* A row's 16 lane accumulators c[0..15] (a row a lane of each) summed in sum4_rows' tree:
 * (c0 + c2) + (c1 + c3) by fours, then the fours the same way. */
static inline __m512 kx_lanes_tree(const __m512 *c) {
    __m512 q[4];
    for (int j = 0; j < 4; j++)
        q[j] = _mm512_add_ps(_mm512_add_ps(c[4 * j], c[4 * j + 2]),
                             _mm512_add_ps(c[4 * j + 1], c[4 * j + 3]));
    return _mm512_add_ps(_mm512_add_ps(q[0], q[2]), _mm512_add_ps(q[1], q[3]));
}

/* G tokens (from token t) against repacked group qx (16 rows from row n, format fmt): per
 * block b the 16 rows' exact integer sums, then acc[i][L] += sums (H(d_b) dx_b) with L the
 * block's lane in qdot_group (and Q4's m terms first, chunk by chunk); sum4_rows' tree, a
 * row a lane; 16 rows stored at y + n (row stride ldy). */
static inline __attribute__((always_inline)) void kx32_group(
    const int fmt, const uint8_t *qx, int nb, const Act *a, int t, const int G, int k,
    const int32_t *c128, float *y, int64_t ldy, int n, const int ahead) {
    const int q8 = fmt == FMT_Q8 || fmt == FMT_IQ4 || fmt == FMT_Q5; /* (IQ4, Q5: Q8's
                                                                       operations from st on) */
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i grid = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)IQ4_GRID), _mm_set1_epi8((char)0x80)));
    __m512 acc[G][16];
    for (int i = 0; i < G; i++)
        for (int l = 0; l < 16; l++) acc[i][l] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = qx + kx32_at(fmt, nb, b);
        /* a group's first pass of a token tile streams it: the group's bytes 16 blocks
         * ahead asked for (as kx.c's kx_ask_ahead). G weights x tokens / s, DRAM-sized,
         * Zen 5, against 8 blocks ahead: Q4_1 one thread 1 / 4 tokens 44.5 -> 51.4,
         * 147 -> 168, two threads 4 tokens 277 -> 325; Q8_0 4 tokens 115 -> 134, 161 -> 206 (one token the same;
         * 24 and 32 ahead no better). A prefetch changes no result. */
        if (ahead) prefetch_bytes(o + 16 * kx32_bytes(fmt), kx32_bytes(fmt));
        const int j = b % 16, c = b - j, full = c + 16 <= nb, L = full ? 4 * (j % 4) + j / 4 : j;
        /* Q4's m terms: the chunk's at its start, block c + l in lane l, or in a pass of 8
         * tokens block c + L's just before this block's product in lane L, with one load
         * and store of the lane's accumulator, not two: each lane's operations in the same
         * order either way (its m term, then the chunk's product in it; c + L < nb: a
         * partial chunk's L is j). Two threads, 1536 x 576 and 576 x 1536 Q4_1 matrices,
         * Zen 5, alternating processes: 64 tokens 371-397 -> 403-438 G MAC/s; fused at
         * every G > 4 the code of the small passes came out 3-5% slower (1 and 4 tokens),
         * fused at G == 8 alone it is as it was. */
        const int fused = !q8 && G == 8;
        if (!q8 && !fused && j == 0)
            for (int l = 0; l < 16 && c + l < nb; l++) {
                const __m512 ml = _mm512_cvtph_ps(
                    _mm256_loadu_si256((const __m256i *)(qx + kx32_min_at(c + l))));
                for (int i = 0; i < G; i++)
                    acc[i][l] = _mm512_fmadd_ps(ml, _mm512_set1_ps(a->xs[(t + i) * (int64_t)nb + c + l]),
                                                acc[i][l]);
            }
        const __m512 mv = fused ? _mm512_cvtph_ps(_mm256_loadu_si256(
            (const __m256i *)(qx + kx32_min_at(c + L)))) : _mm512_setzero_ps();
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        __m512i st[8];
        if (fmt == FMT_Q8) {
            for (int v = 0; v < 8; v++) st[v] = _mm512_loadu_si512((const void *)(o + 32 + 64 * v));
        } else if (fmt == FMT_Q5) { /* nibble + 112, + 16 more where the fifth bit is set */
            const __m512i base = _mm512_set1_epi8(112), high = _mm512_set1_epi8((char)128);
            for (int v = 0; v < 4; v++) {
                const __m512i x = _mm512_loadu_si512((const void *)(o + 32 + 64 * v));
                uint64_t k0, k1;
                memcpy(&k0, o + 288 + 8 * v, 8);
                memcpy(&k1, o + 288 + 8 * (v + 4), 8);
                st[v] = _mm512_add_epi8(_mm512_and_si512(x, m4),
                                        _mm512_mask_blend_epi8(_cvtu64_mask64(k0), base, high));
                st[v + 4] = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), m4),
                                            _mm512_mask_blend_epi8(_cvtu64_mask64(k1), base, high));
            }
        } else if (fmt == FMT_IQ4) { /* the grid's value + 128 at each nibble */
            for (int v = 0; v < 4; v++) {
                const __m512i x = _mm512_loadu_si512((const void *)(o + 32 + 64 * v));
                st[v] = _mm512_shuffle_epi8(grid, _mm512_and_si512(x, m4));
                st[v + 4] = _mm512_shuffle_epi8(grid, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
            }
        } else {
            for (int v = 0; v < 4; v++) {
                const __m512i x = _mm512_loadu_si512((const void *)(o + 32 + 64 * v));
                st[v] = _mm512_and_si512(x, m4);
                st[v + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
            }
        }
        /* where step v's 4 activations of block b lie: Q4's full chunks interleaved */
        const int64_t at = !q8 && full ? 32 * c + 4 * L : 32 * b, stride = !q8 && full ? 64 : 4;
        for (int i = 0; i < G; i++) {
            const int64_t ti = t + i;
            const int8_t *x = a->xa + ti * k + at;
            __m512i p0 = dot_u8s8_512(st[0], kx_bcast4(x));
            __m512i p1 = dot_u8s8_512(st[4], kx_bcast4(x + 4 * stride));
            for (int v = 1; v < 4; v++) {
                p0 = dot_acc_512(p0, st[v], kx_bcast4(x + v * stride));
                p1 = dot_acc_512(p1, st[v + 4], kx_bcast4(x + (4 + v) * stride));
            }
            __m512i s = _mm512_add_epi32(p0, p1);
            if (q8) s = _mm512_sub_epi32(s, _mm512_set1_epi32(c128[(int64_t)i * nb + b]));
            const float dx = a->xd[ti * nb + (!q8 && full ? c + L : b)];
            __m512 lane = acc[i][L];
            if (fused)
                lane = _mm512_fmadd_ps(mv, _mm512_set1_ps(a->xs[ti * (int64_t)nb + c + L]), lane);
            acc[i][L] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, _mm512_set1_ps(dx)),
                                        lane);
        }
    }
    for (int i = 0; i < G; i++)
        _mm512_storeu_ps(y + (int64_t)(t + i) * ldy + n, kx_lanes_tree(acc[i]));
}

/* Repacked groups g0 .. g1 - 1, all T tokens, into y + 16 g0 - yoff (row stride ldy). */
static void kx32_groups(const QMat *w, int g0, int g1, int T, const Act *a, float *y,
                        int64_t ldy, int yoff) {
    const int k = w->k, nb = k / 32, q8 = w->fmt != FMT_Q4;
    int32_t c128[64 * 128]; /* Q8: a tile's 128 sum a per block (64 tokens, k <= 4096) */
    int32_t *c = !q8 || nb <= 128 ? c128 : (int32_t *)malloc(sizeof(int32_t) * 64 * (size_t)nb);
    if (!c) abort(); /* no memory for a tile's sums: nothing sensible left to do */
    for (int t0 = 0; t0 < T; t0 += 64) { /* a tile of tokens' activations stays in L2 */
        const int t1 = T - t0 < 64 ? T : t0 + 64;
        for (int t = t0; q8 && t < t1; t++)
            for (int b = 0; b < nb; b++) {
                const int8_t *x = a->xa + (int64_t)t * k + 32 * b;
                int sum = 0;
                for (int e = 0; e < 32; e++) sum += x[e];
                c[(int64_t)(t - t0) * nb + b] = 128 * sum;
            }
        for (int g = g0; g < g1; g++) {
            const uint8_t *qx = w->qx + (int64_t)g * nb * kx32_bytes(w->fmt);
            for (int t = t0; t < t1;) {
                const int left = t1 - t, groups = (left + 7) / 8, G = (left + groups - 1) / groups;
                const int32_t *ct = c + (int64_t)(t - t0) * nb;
                const int ahead = t == t0; /* the pass that reads the group from memory */
                switch (G + 8 * (w->fmt == FMT_Q8) + 16 * (w->fmt == FMT_IQ4) + 24 * (w->fmt == FMT_Q5)) {
#define RLM_G(G) case G: kx32_group(FMT_Q4, qx, nb, a, t, G, k, ct, y, ldy, 16 * g - yoff, ahead); break; \
                 case G + 8: kx32_group(FMT_Q8, qx, nb, a, t, G, k, ct, y, ldy, 16 * g - yoff, ahead); break; \
                 case G + 16: kx32_group(FMT_IQ4, qx, nb, a, t, G, k, ct, y, ldy, 16 * g - yoff, ahead); break; \
                 case G + 24: kx32_group(FMT_Q5, qx, nb, a, t, G, k, ct, y, ldy, 16 * g - yoff, ahead); break;
                RLM_G(1) RLM_G(2) RLM_G(3) RLM_G(4) RLM_G(5) RLM_G(6) RLM_G(7) RLM_G(8)
#undef RLM_G
                }
                t += G;
            }
        }
    }
    if (c != c128) free(c);
}

/* y[t, n] for rows n in [n0, n1) of a repacked matrix, all T tokens: whole groups in place,
 * a group the range cuts (a row concatenation's part at an odd offset) computed whole aside
 * (each row's sums are its own) and its rows in the range copied. */
static void kx32_rows(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                      int64_t ldy) {
    const int g0 = (n0 + 15) / 16, g1 = n1 / 16;
    if (n0 >= n1) return;
    if (g0 < g1) kx32_groups(w, g0, g1, T, a, y, ldy, 0);
    for (int g = n0 / 16; g <= (n1 - 1) / 16; g++) {
        if (g >= g0 && g < g1) continue;
        float *tmp = (float *)malloc(sizeof(float) * 16 * (size_t)T);
        if (!tmp) abort();
        kx32_groups(w, g, g + 1, T, a, tmp, 16, 16 * g);
        const int lo = 16 * g > n0 ? 16 * g : n0, hi = 16 * g + 16 < n1 ? 16 * g + 16 : n1;
        for (int t = 0; t < T; t++)
            memcpy(y + (int64_t)t * ldy + lo, tmp + (int64_t)t * 16 + (lo - 16 * g),
                   sizeof(float) * (size_t)(hi - lo));
        free(tmp);
    }
}
#endif
