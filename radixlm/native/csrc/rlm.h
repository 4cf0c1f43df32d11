/* radixlm native CPU ops: the decode step of a Llama-family layer in one call.
 *
 * Weights are GGUF-style blocks of 32 along the input dimension (Q4_0/Q4_1 as 4-bit
 * unsigned q with W = d*q + m; Q8_0 as int8 with W = d*q). Activations are quantized
 * per block of 32 to int8 (x = dx*a) with their block sum, as llama.cpp does, so a block
 * dot product is one u8 x s8 instruction sequence:
 *   Q4: sum_j (d q_j + m)(dx a_j) = d dx sum_j q_j a_j + m (dx sum_j a_j)
 *   Q8: sum_j (d w_j)(dx a_j)     = d dx sum_j w_j a_j
 * A checkpoint that is not block-quantized runs on its own dense rows (bf16 or fp32): fp32
 * activations against them in fp32 arithmetic, or bf16 dot products / AMX tiles for bf16
 * activations. Everything else (RMSNorm, rotary, attention, SiLU) is fp32. K/V caches are
 * fp32 or bf16 (converted by bit shifts), or int8 with one bf16 scale per (token, KV head)
 * row, widened to fp32 in registers (attention.c).
 *
 * Built on the host that runs it with -march=native (radixlm/native/build.py), so the
 * #if branches pick AVX-512 VNNI, AVX-VNNI, AVX2 or plain C at compile time on the
 * machine's own features. Threads: a small pool of our own (pool.c), one parallel job per
 * step, spin barriers between its stages.
 *
 * This header is the one set of declarations the parts share. The parts, by area:
 *   pool.c         thread pool and barrier
 *   blocks.c       Q4/Q8 block formats: int8 activation blocks, rows dequantized to fp32
 *                  or bf16 (dense rows converted), weight prefetch
 *   dense.c        dense bf16 / fp32 rows against fp32 activations in small steps
 *   matmul_f32.c   fp32 activations x blocks (AVX-512 row tiles, the AVX2 panel GEMM)
 *   matmul_bf16.c  bf16 activations x blocks on AVX512-BF16 dot products
 *   amx.c          bf16 activations x blocks on AMX tiles
 *   amx_i8.c       int8 activation blocks x Q8 rows on AMX int8 tiles (the 512-bit path's bits)
 *   matmul_i8.c    int8 activation blocks x blocks (AVX2 block dots, the 512-bit path)
 *   kquants.c      K-quant super-blocks: unpacking, dequantization, int8 activations
 *   kx.c           K-quant rows repacked 16 side by side, and their int8 kernels
 *   kx3.c          Q3_K's numbers repacked 16 side by side at 3 bits, their int8 kernels
 *   kx32.c         Q8 / Q4 rows repacked 16 side by side, and their 512-bit VNNI kernel
 *   matmul.c       qgemv_rows (picks one of the above; the AVX2 and plain C int8 paths)
 *   vmath.c        vectorized exp, softmax sums, SiLU
 *   attention.c    attention through req_to_token
 *   layer.c        workspace, activation preparation, the layer and head jobs, the
 *                  library's entry points
 * They are compiled as one translation unit: cpu_ops.c includes them in this order, with
 * the flags build.py picks per ISA. So the functions shared between parts stay static
 * (declared below) and the compiler inlines across parts exactly as within one file: the
 * same code and the same fused multiply-adds (gcc contracts a * b + c after inlining), so
 * the same bits, which separately compiled units could not promise.
 */
#ifndef RLM_H
#define RLM_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>  /* madvise: rlm_repack_many gives a file map's pages back */
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RLM_AVX2 1
#endif

/* Weight formats: GGUF-style blocks (Q4, Q8), GGUF K-quant super-blocks as the file has
 * them (Q4_K, Q5_K, Q6_K; see kquants.c), or dense rows as the checkpoint has them (bf16,
 * fp32; see dense.c). FMT_Q3_K: a GGUF Q3_K matrix's numbers as Q6_K's (recode.c), held only
 * in kx3.c's repacked rows (qx; qs NULL): every path treats it as Q6_K but for the layout. */
enum { FMT_Q4 = 4, FMT_IQ4 = 5, FMT_Q5 = 6, FMT_Q8 = 8, FMT_Q3_K = 11, FMT_Q4_K = 12,
       FMT_Q5_K = 13, FMT_Q6_K = 14, FMT_BF16 = 16, FMT_F32 = 32 };
/* FMT_IQ4: a GGUF IQ4_NL / IQ4_XS matrix as Q8 blocks whose values are ggml's grid at Q4's
 * nibbles (IQ4_XS's block scales the fp16 nearest d (ls - 32)), held only in kx32.c's
 * repacked rows (qx; qs NULL): every path reads it as the Q8 blocks of those values. */
/* FMT_Q5: a GGUF Q5_0 matrix (the file's nibbles and fifth bits, its fp16 scales), held only
 * in kx32.c's repacked rows (qx; qs NULL): every path reads it as the Q8 blocks of its
 * values (nibble | bit << 4) - 16. */
static const int8_t IQ4_GRID[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};
enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2 };
/* How a matmul reads its activations. ACT_BF16 (batch steps on a CPU with native bf16 dot
 * products) rounds activations and dequantized weights to bf16 and accumulates in fp32, as
 * a torch bf16 linear does; a build without AVX512-BF16 runs ACT_BF16 as ACT_F32. */
enum { ACT_INT8 = 0, ACT_F32 = 1, ACT_BF16 = 2 };
#if defined(RLM_AVX2) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define RLM_BF16 1
#endif
#if defined(RLM_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define RLM_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif
/* int8 blocks against Q4 rows (matmul_i8.c): a row's full chunks of RLM_CHUNK blocks (a
 * vector's 32-bit lanes: 16 on 512-bit builds, 8 on AVX2) are read transposed, with the
 * activations laid out to match (interleave_act). */
#if defined(RLM_AVX2) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RLM_I8_ZMM 1
#define RLM_CHUNK 16
#elif defined(RLM_AVX2)
#define RLM_CHUNK 8
#endif
/* Q8 / Q4 rows repacked 16 side by side (kx32.c) for the 512-bit VNNI int8 kernel; not on
 * builds whose AMX int8 tiles read those rows in the plain layout. */
#if defined(RLM_I8_ZMM) && defined(__AVX512VNNI__) && !(defined(RLM_AMX) && defined(__AMX_INT8__))
#define RLM_KX32 1
#endif
/* Steps of at least this many tokens run ACT_BF16 matmuls on AMX tiles (where granted);
 * from RLM_AMX_LARGE_T tokens on with the roles of the operands swapped (see
 * qgemm_amx_large). Without AMX, bf16 dot products beat fp32 from RLM_BF16_MIN_ROWS tokens
 * (see rlm_bf16_min_rows). */
#define RLM_AMX_MIN_ROWS 8
/* ACT_INT8 steps of at least this many tokens run Q8 rows on AMX int8 tiles (amx_i8.c). */
#define RLM_AMX_I8_MIN_ROWS 8
#define RLM_BF16_MIN_ROWS 2
#define RLM_AMX_LARGE_T 256

typedef struct {
    int32_t fmt;          /* FMT_Q4 | FMT_IQ4 | FMT_Q5 | FMT_Q8 | FMT_Q3_K | FMT_Q4_K | FMT_Q5_K | FMT_Q6_K | FMT_BF16
                             | FMT_F32 */
    int32_t n, k;         /* output rows, input columns (k % 32 == 0; K-quants: k % 256 == 0) */
    const uint8_t *qs;    /* Q4: [n, k/32, 16] (low nibble = j, high = j + 16); Q8: [n, k/32, 32];
                             K-quants: the file's rows of super-blocks [n, k/256, 144 | 176 |
                             210]; BF16 / F32: the dense rows [n, k] */
    const uint16_t *d;    /* [n, k/32] fp16 block scales (GGUF's own); NULL for dense rows and
                             K-quants (their scales are in their super-blocks) */
    const uint16_t *m;    /* [n, k/32] fp16 block minimums (Q4 only) */
    const uint8_t *qx;    /* K-quants on AVX2 / 512-bit builds: rows 0 .. n / 16 * 16
                             repacked 16 side by side (kx.c) for the int8 kernels; the
                             other paths read qs. Q8 / Q4 on RLM_KX32 builds: all rows
                             repacked (kx32.c), qs, d and m NULL (int8 steps only). Q3_K:
                             all rows (n % 16 == 0) in kx3.c's layout, qs NULL (int8 steps
                             only). NULL: read qs only */
} QMat;

static inline int is_dense(const QMat *w) { return w->fmt == FMT_BF16 || w->fmt == FMT_F32; }
static inline int is_kquant(const QMat *w) {
    return w->fmt == FMT_Q3_K || w->fmt == FMT_Q4_K || w->fmt == FMT_Q5_K || w->fmt == FMT_Q6_K;
}
/* Whether a K-quant format's numbers are Q6_K's (scales a group of 16, q - 32, no minimum). */
static inline int kq_six(int fmt) { return fmt == FMT_Q6_K || fmt == FMT_Q3_K; }

/* Bytes of one row of w in memory. */
static inline int64_t row_bytes_of(const QMat *w) {
    switch (w->fmt) {
    case FMT_Q4: return (int64_t)w->k / 2;
    case FMT_Q8: return w->k;
    case FMT_Q4_K: return (int64_t)w->k / 256 * 144;
    case FMT_Q5_K: return (int64_t)w->k / 256 * 176;
    case FMT_Q6_K: return (int64_t)w->k / 256 * 210;
    case FMT_Q3_K: return 0; /* (repacked rows only) */
    case FMT_BF16: return (int64_t)w->k * 2;
    default: return (int64_t)w->k * 4;
    }
}

/* Row n's block scales (NULL for dense rows and K-quants). */
static inline const uint16_t *wd_of(const QMat *w, int64_t n, int nb) {
    return is_dense(w) || is_kquant(w) ? NULL : w->d + n * nb;
}

/* The row-concatenation of up to 3 matrices of the same k (q | k | v, gate | up), each in
 * its own format: a GGUF's tensors as the file has them (a Q4_K_M file mixes Q4_K and Q6_K
 * within a layer). Its parts must read the same activation layout: FMT_Q4 rows (interleaved
 * int8 blocks, see interleave_act) are not mixed with others. */
typedef struct {
    int32_t count;
    QMat part[3];
} QCat;

typedef struct {
    int32_t hidden, n_heads, n_kv_heads, head_dim, inter;
    float eps, attn_scale;
    const float *in_norm, *post_norm; /* [hidden] */
    const float *qkv_bias;            /* [q + 2 kv] or NULL */
    const float *q_norm, *k_norm;     /* [head_dim] or NULL: each q / k head RMS-normed
                                         (eps) before rotary, as Qwen3's layers do */
    int32_t rope_pairs;               /* 1: rotary on adjacent pairs (2i, 2i + 1), llama.cpp's
                                         q/k row order for its "llama" architecture; 0: on
                                         halves (i, i + D/2), Hugging Face's */
    QCat qkv;
    QMat o;
    QCat gate_up;
    QMat down;
    /* Family switches (Llama: NULL / 0). */
    const float *attn_out_norm;       /* [hidden] or NULL: the attention's output RMS-normed
                                         before the residual add (Gemma's sandwich norms) */
    const float *mlp_out_norm;        /* [hidden] or NULL: the MLP's output likewise */
    int32_t act;                      /* MLP gate activation: ACT_SILU | ACT_GELU_TANH */
    int32_t window;                   /* > 0: a token attends to its last `window` positions
                                         (itself included; sliding layers); 0: all */
    int32_t rope_table;               /* 0: the step's cos / sin; 1: cos_b / sin_b (Gemma 3's
                                         local layers) */
    int32_t rot_half;                 /* rotated pairs of a head (the table's row length);
                                         < head_dim / 2 for partial rotary (Phi-3.5 / 4) */
    float softcap;                    /* > 0: scores soft-capped, cap tanh(s / cap) (Gemma 2) */
} Layer;

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

static inline int64_t cat_rows(const QCat *c) {
    int64_t n = 0;
    for (int i = 0; i < c->count; i++) n += c->part[i].n;
    return n;
}

/* One layer's K/V pool as attention reads and the layer writes it, and how it scores. */
typedef struct {
    void *k, *v;                /* [capacity, n_kv_heads, head_dim] of dtype */
    uint16_t *ks, *vs;          /* KV_INT8: bf16 scale per (slot, KV head) row; else NULL */
    int32_t dtype;              /* KV_F32 | KV_BF16 | KV_INT8 */
    float softcap;              /* Layer.softcap (0: none) */
} KVLayer;

typedef struct {
    int32_t T;                  /* tokens in the step */
    int32_t kv_dtype;           /* KV_F32 | KV_BF16 | KV_INT8 */
    int32_t nthreads;
    int32_t max_ctx;            /* longest attention span (pos + 1) in the step */
    int32_t act_mode;           /* ACT_F32 (exact) | ACT_INT8 blocks | ACT_BF16 rows */
    const float *cos, *sin;     /* [T, rot_half] */
    const int64_t *out_loc;     /* [T] pool slot of each token's K/V */
    const int64_t *rows;        /* [T] row of req_to_token */
    const int64_t *pos;         /* [T] position; the token attends to 0 .. pos */
    const int32_t *req_to_token;
    int64_t r2t_stride;
    float *ws;                  /* workspace of rlm_workspace_floats() floats */
    uint16_t *const *k_scales;  /* KV_INT8: per layer the K and V row scales */
    uint16_t *const *v_scales;  /* ([capacity, n_kv_heads] bf16); else NULL */
    const float *cos_b, *sin_b; /* [T, rot_half] the second rotary table (layers with
                                   rope_table 1), or NULL */
} Step;

/* AVX2 builds run fp32 steps of PANEL_MIN_T+ tokens as a panel GEMM (matmul_f32.c). */
#if defined(RLM_AVX2) && !defined(__AVX512F__)
#define RLM_PANEL 1
#define PANEL_MIN_T 16
#endif

typedef uint16_t f16; /* IEEE half: block scales are stored as the GGUF file has them */

static inline float H(f16 h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float f;
    if (e == 0) { /* zero or subnormal: man * 2^-24 */
        f = (float)man * (1.0f / 16777216.0f);
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((e + 112) << 23) | (man << 13);
    }
    memcpy(&f, &u, 4);
    return f;
#endif
}
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#ifdef RLM_AVX2
/* Ask for bytes [p, p + n) a cache line at a time (a prefetch never faults, past an end
 * included). Every helper that only prefetches is always_inline: gcc finds such a
 * function free of side effects and deletes the calls it has not inlined yet: with plain
 * static inline helpers no build from 2b44c8a to c6749be held one prefetch instruction
 * (tests/test_native.py counts them in the built library). */
static inline __attribute__((always_inline)) void prefetch_bytes(const void *p, int64_t n) {
    for (int64_t off = 0; off < n; off += 64) _mm_prefetch((const char *)p + off, _MM_HINT_T0);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i unpack_q4(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m128i mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(v, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

/* 8 int32 partial sums of u8 x s8 over 32 bytes */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

static inline __m256 load8_kv(const void *base, int64_t off, int32_t dtype) {
    if (dtype == KV_F32) return _mm256_loadu_ps((const float *)base + off);
    if (dtype == KV_INT8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)((const int8_t *)base + off))));
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + off));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

/* One vector of floats at the build's width (16 lanes on AVX-512, 8 on AVX2): the loops
 * that are the same at both widths (fp32 dot tiles, exp, attention) are written once in
 * these names. */
#if defined(RLM_AVX2) && defined(__AVX512F__)
#define AV_W 16
typedef __m512 avec;
#define AV_LOAD _mm512_load_ps
#define AV_LOADU _mm512_loadu_ps
#define AV_ADD _mm512_add_ps
#define AV_SUB _mm512_sub_ps
#define AV_MUL _mm512_mul_ps
#define AV_MAX _mm512_max_ps
#define AV_FMA _mm512_fmadd_ps
#define AV_FNMADD _mm512_fnmadd_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps
#define AV_STOREU _mm512_storeu_ps
#define AV_SUM _mm512_reduce_add_ps
#elif defined(RLM_AVX2)
#define AV_W 8
typedef __m256 avec;
#define AV_LOAD _mm256_load_ps
#define AV_LOADU _mm256_loadu_ps
#define AV_ADD _mm256_add_ps
#define AV_SUB _mm256_sub_ps
#define AV_MUL _mm256_mul_ps
#define AV_MAX _mm256_max_ps
#define AV_FMA _mm256_fmadd_ps
#define AV_FNMADD _mm256_fnmadd_ps
#define AV_SET1 _mm256_set1_ps
#define AV_ZERO _mm256_setzero_ps
#define AV_STOREU _mm256_storeu_ps
#define AV_SUM hsum256
#endif

/* A prepared activation matrix [T, k]: fp32 rows (+ per-block sums), or int8 blocks. */
typedef struct {
    int f32;                   /* fp32 rows (ACT_F32, and ACT_BF16 where it runs as fp32) */
    const float *xf, *xd, *xs; /* xf: fp32 rows; xd/xs: int8 scales and scaled sums, or
                                  (f32) xs = per-block sums of xf */
    const int8_t *xa;
    const uint16_t *xb;        /* bf16 rows (ACT_BF16 on a bf16 build), else NULL */
    int amx;                   /* xb packed as AMX B tiles (see pack_tiles) */
    const float *xt;           /* fp32 rows transposed for the panel GEMM, else NULL */
    const int8_t *xq;          /* int8 blocks packed as AMX B tiles (amx_i8.c), else NULL */
    const float *xdt, *xst;    /* with xq: their scales and scaled sums by token
                                  (pack_token_i8) */
    const int8_t *ka;          /* K-quant weights' int8 activations (quantize_row_k): blocks
                                  of 256 with one scale each, ka [T, k], kd [T, k/256], */
    const float *kd;           /* kb [T, k/16] their int16 sums by 16; NULL where no K-quant */
    const int16_t *kb;         /* matrix reads this step */
    int xq_k;                  /* xq packs ka (the K-quant blocks), not xa */
} Act;

/* ------------------------------------------------------------------ what the parts share
 * (static: one translation unit, see above) */

/* pool.c: fn(ctx, tid, nth) on nth threads (the caller is tid 0), returning when all are
 * done; barrier: all nth threads of the running job meet. */
typedef void (*rlm_job)(void *ctx, int tid, int nth);
static void run_parallel(rlm_job fn, void *ctx, int nth);
static void barrier(int nth);
#ifdef RLM_PROFILE
static double now_seconds(void);
#endif

/* dense.c */
static void dense_row_f32(const QMat *w, const uint8_t *row, int k, float *out);

/* blocks.c */
static void quantize_row(const float *x, int k, int8_t *a, float *dx, float *sx);
#ifdef RLM_CHUNK
static inline int chunk_block(int l);
static void interleave_act(int8_t *a, float *dx, int nb);
#endif
static void dequant_row(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                        int nb, float *out);
static inline __attribute__((always_inline)) void prefetch_rows(const QMat *w, int n, int count,
                                                             int n_end);
static inline const f16 *wm_of(const QMat *w, int n, int nb);
#ifdef RLM_AVX2
static inline __m256 q4_f8(__m128i nib, int part);
#endif
#if defined(RLM_AVX2) && defined(__AVX512F__)
static inline void block_f32(const QMat *w, const uint8_t *wq, int b, __m512 *lo, __m512 *hi);
#endif
#ifdef RLM_BF16
static inline void to_bf16(const float *x, int k, uint16_t *out);
static void dequant_row_bf16(const QMat *w, const uint8_t *wq, const f16 *wd,
                             const f16 *wm, int nb, uint16_t *out);
#endif

/* kquants.c */
static void kq_dequant_row(const QMat *w, const uint8_t *wq, float *out);
/* kx.c */
static void kx_unpack_row(const QMat *w, int64_t n, uint8_t *q, float *ds, float *dm);
static inline int64_t kx_sb_bytes(int fmt);
#ifdef RLM_AVX2
static void kx_rows(const QMat *w, int g0, int g1, int T, const Act *a, float *y, int64_t ldy);
#endif
/* kx3.c */
static void kx3_unpack_row(const QMat *w, int64_t n, uint8_t *q, float *ds);
#ifdef RLM_AVX2
static void kx3_rows(const QMat *w, int g0, int g1, int T, const Act *a, float *y, int64_t ldy);
#endif
static void kq_rows_i8(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                       int64_t ldy);
/* kx32.c */
static inline int64_t kx32_bytes(int fmt);
static void kx32_unpack_row(const QMat *w, int64_t n, uint8_t *qs, f16 *d, f16 *m);
#ifdef RLM_KX32
static void kx32_rows(const QMat *w, int n0, int n1, int T, const Act *a, float *y, int64_t ldy);
#endif

/* The matmuls: y[t, n] (row stride ldy) for rows n in [n0, n1) of w, all T tokens of a. */
static void qgemv_rows_f32(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                           int64_t ldy);                             /* matmul_f32.c */
#ifdef RLM_PANEL
static void transpose_token(const float *xr, int t, int k, float *xt); /* matmul_f32.c */
#endif
#ifdef RLM_BF16
static void qgemv_rows_bf16(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                            int64_t ldy);                            /* matmul_bf16.c */
#endif
#ifdef RLM_AMX
static int amx_ok(void);                                             /* amx.c */
static void pack_token(const uint16_t *row, int t, int nkb, uint32_t *packed);
static void qgemv_rows_amx(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                           int64_t ldy);
static void qgemm_amx_large(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                            int64_t ldy);
#endif
static void dense_rows_f32(const QMat *w, int n0, int n1, int T, const float *x, float *y,
                           int64_t ldy);                             /* dense.c */
static void qgemv_rows(const QMat *w, int n0, int n1, int T, const Act *act, float *y,
                       int64_t ldy);                                 /* matmul.c */
static void gemv(const QMat *m, int T, const Act *a, float *y, int tid, int nth);
static void gemv_cat(const QCat *c, int T, const Act *a, float *y, int tid, int nth);

/* vmath.c */
static inline float exp_sum(float *sc, int64_t count, float mx);
static void act_mul(const float *g, const float *u, int n, float *out, int gelu);

/* attention.c */
static void attend_heads(const float *q, int nh, const int32_t *slots, int64_t p, int g,
                         int Hkv, int D, float scale, const KVLayer *kv, float *scores,
                         float *out);
static void store_kv_token(void *cache, uint16_t *scales, int32_t dtype, int64_t slot,
                           const float *x, int Hkv, int D);

/* ------------------------------------------------------------------ the library's API
 * (declared for ctypes in build.py) */
int64_t rlm_workspace_floats(const Layer *L, int32_t T, int32_t max_ctx, int32_t nthreads);
int64_t rlm_matmul_workspace_floats(int32_t T, int32_t k, int32_t nthreads);
void rlm_layers(const Layer *layers, int32_t n_layers, void *const *k_caches,
                void *const *v_caches, const Step *S, float *res);
void rlm_norm_head(const QMat *head, const float *norm, float eps, int32_t T, const float *x,
                   float *logits, float *ws, int32_t act_mode, int32_t nthreads);
int32_t rlm_profile(double *out, int32_t reset);
void rlm_dequant_rows(const QMat *w, const int64_t *rows, int32_t count, float *out);
void rlm_quantize_rows(const float *x, int32_t T, int32_t k, int8_t *a, float *dx, float *sx);
void rlm_quantize_rows_k(const float *x, int32_t T, int32_t k, int8_t *a, float *kd, int16_t *kb);
void rlm_attention(const float *q, int32_t T, int32_t Hq, int32_t Hkv, int32_t D, float scale,
                   const int64_t *rows, const int64_t *pos, const int32_t *req_to_token,
                   int64_t r2t_stride, const void *k_cache, const void *v_cache,
                   int32_t kv_dtype, int32_t max_ctx, float *out, const uint16_t *k_scale,
                   const uint16_t *v_scale, float softcap);
void rlm_store_kv(const float *x, int32_t T, int32_t Hkv, int32_t D, const int64_t *slots,
                  void *cache, uint16_t *scales, int32_t kv_dtype);
void rlm_act_mul(const float *g, const float *u, int32_t n, float *out, int32_t act);
const char *rlm_isa(void);
int32_t rlm_bf16(void);
int32_t rlm_amx(void);
int32_t rlm_amx_i8(void);
int32_t rlm_amx_kq(void);
int32_t rlm_bf16_min_rows(void);

#endif /* RLM_H */
