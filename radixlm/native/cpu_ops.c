/* radixlm native CPU ops: the decode step of a Llama-family layer in one call.
 *
 * Weights are GGUF-style blocks of 32 along the input dimension (Q4_0/Q4_1 as 4-bit
 * unsigned q with W = d*q + m; Q8_0 as int8 with W = d*q). Activations are quantized
 * per block of 32 to int8 (x = dx*a) with their block sum, as llama.cpp does, so a block
 * dot product is one u8 x s8 instruction sequence:
 *   Q4: sum_j (d q_j + m)(dx a_j) = d dx sum_j q_j a_j + m (dx sum_j a_j)
 *   Q8: sum_j (d w_j)(dx a_j)     = d dx sum_j w_j a_j
 * Everything else (RMSNorm, rotary, attention, SiLU) is fp32. K/V caches are fp32 or bf16
 * (converted by bit shifts: no bf16 arithmetic anywhere).
 *
 * Built on the host that runs it with -march=native (radixlm/native/build.py), so the
 * #if branches below pick AVX-512 VNNI, AVX-VNNI, AVX2 or plain C at compile time on the
 * machine's own features. Threads: a small pool of our own (below), one parallel job per
 * step, spin barriers between its stages.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RLM_AVX2 1
#endif

enum { FMT_Q4 = 4, FMT_Q8 = 8 };
enum { KV_F32 = 0, KV_BF16 = 1 };
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
/* Steps of at least this many tokens run ACT_BF16 matmuls on AMX tiles (where granted);
 * from RLM_AMX_LARGE_T tokens on with the roles of the operands swapped (see
 * qgemm_amx_large). Without AMX, the default runs bf16 dot products from RLM_BF16_MIN_ROWS
 * tokens (see rlm_bf16_min_rows). */
#define RLM_AMX_MIN_ROWS 8
#define RLM_BF16_MIN_ROWS 2
#define RLM_AMX_LARGE_T 256

typedef struct {
    int32_t fmt;          /* FMT_Q4 | FMT_Q8 */
    int32_t n, k;         /* output rows, input columns (k % 32 == 0) */
    const uint8_t *qs;    /* Q4: [n, k/32, 16] (low nibble = j, high = j + 16); Q8: [n, k/32, 32] */
    const uint16_t *d;    /* [n, k/32] fp16 block scales (GGUF's own) */
    const uint16_t *m;    /* [n, k/32] fp16 block minimums (Q4 only) */
} QMat;

typedef struct {
    int32_t hidden, n_heads, n_kv_heads, head_dim, inter;
    float eps, attn_scale;
    const float *in_norm, *post_norm; /* [hidden] */
    const float *qkv_bias;            /* [q + 2 kv] or NULL */
    QMat qkv, o, gate_up, down;
} Layer;

typedef struct {
    int32_t T;                  /* tokens in the step */
    int32_t kv_dtype;           /* KV_F32 | KV_BF16 */
    int32_t nthreads;
    int32_t max_ctx;            /* longest attention span (pos + 1) in the step */
    int32_t act_mode;           /* ACT_F32 (exact) | ACT_INT8 blocks | ACT_BF16 rows */
    const float *cos, *sin;     /* [T, head_dim / 2] */
    const int64_t *out_loc;     /* [T] pool slot of each token's K/V */
    const int64_t *rows;        /* [T] row of req_to_token */
    const int64_t *pos;         /* [T] position; the token attends to 0 .. pos */
    const int32_t *req_to_token;
    int64_t r2t_stride;
    float *ws;                  /* workspace of rlm_workspace_floats() floats */
} Step;

/* ------------------------------------------------------------------ thread pool
 * A step has ~10 stages per layer with a barrier between each (300+ per decode step).
 * libgomp throttles its spin-waits to almost nothing as soon as it manages more threads
 * than there are CPUs (an idle team of the main thread plus the scheduler thread's team
 * is enough), and every barrier then sleeps in the kernel: a decode step issued from the
 * engine's scheduler thread measured 2x its time on the main thread. Our own pool spins at
 * barriers (yielding after a while) and parks its workers on a condition variable only
 * between jobs, whichever thread submits them. One job at a time (a mutex), so several
 * engines in one process share it safely. */
typedef void (*rlm_job)(void *ctx, int tid, int nth);
#define RLM_MAX_THREADS 256
#define RLM_IDLE_SPINS 20000  /* ~1 ms of pause before a worker parks */

static struct {
    pthread_mutex_t job_lock, park_lock;
    pthread_cond_t park;
    int nworkers;
    _Atomic unsigned gen;
    _Atomic int pending;
    rlm_job fn;
    void *ctx;
    int nth;
    _Atomic int bar_count;
    _Atomic unsigned bar_gen;
} P = {.job_lock = PTHREAD_MUTEX_INITIALIZER, .park_lock = PTHREAD_MUTEX_INITIALIZER,
       .park = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *pool_worker(void *arg) {
    const int tid = (int)(intptr_t)arg;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen) {
            if (++spins < RLM_IDLE_SPINS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&P.park_lock);
            while (atomic_load_explicit(&P.gen, memory_order_acquire) == seen)
                pthread_cond_wait(&P.park, &P.park_lock);
            pthread_mutex_unlock(&P.park_lock);
        }
        seen = g;
        if (tid < P.nth) P.fn(P.ctx, tid, P.nth);
        atomic_fetch_sub_explicit(&P.pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

/* fn(ctx, tid, nth) on nth threads (the caller is tid 0); returns when all are done. */
static void run_parallel(rlm_job fn, void *ctx, int nth) {
    if (nth > RLM_MAX_THREADS) nth = RLM_MAX_THREADS;
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&P.job_lock);
    while (P.nworkers < nth - 1) {
        pthread_t th;
        if (pthread_create(&th, NULL, pool_worker, (void *)(intptr_t)(P.nworkers + 1)) != 0)
            break;
        pthread_detach(th);
        P.nworkers++;
    }
    if (nth > P.nworkers + 1) nth = P.nworkers + 1;
    P.fn = fn;
    P.ctx = ctx;
    P.nth = nth;
    atomic_store_explicit(&P.bar_count, 0, memory_order_relaxed);
    atomic_store_explicit(&P.pending, P.nworkers, memory_order_release);
    pthread_mutex_lock(&P.park_lock);
    atomic_fetch_add_explicit(&P.gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&P.park);
    pthread_mutex_unlock(&P.park_lock);
    fn(ctx, 0, nth);
    while (atomic_load_explicit(&P.pending, memory_order_acquire) > 0) cpu_relax();
    pthread_mutex_unlock(&P.job_lock);
}

/* All nth threads of the running job meet here. */
static void barrier(int nth) {
    if (nth <= 1) return;
    unsigned g = atomic_load_explicit(&P.bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&P.bar_count, 1, memory_order_acq_rel) == nth - 1) {
        atomic_store_explicit(&P.bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&P.bar_gen, 1, memory_order_acq_rel);
        return;
    }
    for (unsigned spins = 0; atomic_load_explicit(&P.bar_gen, memory_order_acquire) == g;) {
        cpu_relax();
        if (++spins % 4096 == 0) sched_yield();  /* a descheduled peer: give the CPU back */
    }
}

#ifdef RLM_PROFILE
static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

/* ------------------------------------------------------------------ helpers */
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
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + off));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

/* ------------------------------------------------------------------ quantization */
/* x [k] -> a [k] int8, dx [k/32], sx [k/32] (= dx * sum a) */
static void quantize_row(const float *x, int k, int8_t *a, float *dx, float *sx) {
    for (int b = 0; b < k / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)lrintf(xb[j] * id);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            a[b * 32 + j] = (int8_t)v;
            sum += v;
        }
        dx[b] = d;
        sx[b] = d * (float)sum;
    }
}

/* ------------------------------------------------------------------ quantized matmul */
/* One row of a Q4/Q8 matrix against one quantized activation row (T == 1). */
static inline float qdot_row1(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                              const int8_t *xa, const float *xd, const float *xs, int nb) {
#ifdef RLM_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float msum = 0.f;
    int b = 0;
    if (w->fmt == FMT_Q4) {
        for (; b + 2 <= nb; b += 2) {
            __m256i p0 = dot_u8s8(unpack_q4(wq + b * 16),
                                  _mm256_loadu_si256((const __m256i *)(xa + b * 32)));
            __m256i p1 = dot_u8s8(unpack_q4(wq + b * 16 + 16),
                                  _mm256_loadu_si256((const __m256i *)(xa + b * 32 + 32)));
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(H(wd[b]) * xd[b]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
                                   _mm256_set1_ps(H(wd[b + 1]) * xd[b + 1]), acc1);
            msum += H(wm[b]) * xs[b] + H(wm[b + 1]) * xs[b + 1];
        }
        for (; b < nb; b++) {
            __m256i p0 = dot_u8s8(unpack_q4(wq + b * 16),
                                  _mm256_loadu_si256((const __m256i *)(xa + b * 32)));
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(H(wd[b]) * xd[b]), acc0);
            msum += H(wm[b]) * xs[b];
        }
    } else {
        for (; b < nb; b++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(wq + b * 32));
            __m256i s = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xa + b * 32)), wv);
            __m256i p0 = dot_u8s8(_mm256_abs_epi8(wv), s);
            if (b & 1)
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(H(wd[b]) * xd[b]),
                                       acc1);
            else
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(H(wd[b]) * xd[b]),
                                       acc0);
        }
    }
    return hsum256(_mm256_add_ps(acc0, acc1)) + msum;
#else
    float acc = 0.f;
    for (int b = 0; b < nb; b++) {
        int isum = 0;
        if (w->fmt == FMT_Q4) {
            for (int j = 0; j < 16; j++) {
                isum += (wq[b * 16 + j] & 0x0f) * xa[b * 32 + j];
                isum += (wq[b * 16 + j] >> 4) * xa[b * 32 + j + 16];
            }
            acc += H(wd[b]) * xd[b] * (float)isum + H(wm[b]) * xs[b];
        } else {
            for (int j = 0; j < 32; j++) isum += (int8_t)wq[b * 32 + j] * xa[b * 32 + j];
            acc += H(wd[b]) * xd[b] * (float)isum;
        }
    }
    return acc;
#endif
}

/* ---- fp32 activations: the weights are dequantized on the fly, the products are exact
 * fp32 (what the reference torch path computes, up to summation order). */
#ifdef RLM_AVX2
/* 8 floats of weights w[j0 .. j0+7] of a Q4 block (q in 0..15, unscaled) */
static inline __m256 q4_f8(__m128i nib, int part) {
    /* part 0: elements 0-7, 1: 8-15 (low nibbles), 2: 16-23, 3: 24-31 (high nibbles) */
    __m128i v = part < 2 ? _mm_and_si128(nib, _mm_set1_epi8(0x0f))
                         : _mm_and_si128(_mm_srli_epi16(nib, 4), _mm_set1_epi8(0x0f));
    if (part & 1) v = _mm_srli_si128(v, 8);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}
#endif

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* Block b of a Q4 (q in 0..15, unscaled) or Q8 row as fp32: elements 0-15 and 16-31. */
static inline void block_f32(const QMat *w, const uint8_t *wq, int b, __m512 *lo, __m512 *hi) {
    if (w->fmt == FMT_Q4) {
        const __m128i mask = _mm_set1_epi8(0x0f);
        __m128i v = _mm_loadu_si128((const __m128i *)(wq + b * 16));
        *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
        *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
    } else {
        *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(wq + b * 32))));
        *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(wq + b * 32 + 16))));
    }
}
#endif

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

/* Row n dequantized to fp32 (W = d q + m) into out[k]. */
static void dequant_row(const QMat *w, const uint8_t *wq, const f16 *wd, const f16 *wm,
                        int nb, float *out) {
    for (int b = 0; b < nb; b++) {
        float d = H(wd[b]), m = wm ? H(wm[b]) : 0.f;
#if defined(RLM_AVX2) && defined(__AVX512F__)
        __m512 lo, hi;
        block_f32(w, wq, b, &lo, &hi);
        __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
        _mm512_store_ps(out + b * 32, _mm512_fmadd_ps(lo, dv, mv));
        _mm512_store_ps(out + b * 32 + 16, _mm512_fmadd_ps(hi, dv, mv));
#elif defined(RLM_AVX2)
        __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
        for (int p = 0; p < 4; p++) {
            __m256 f = w->fmt == FMT_Q4
                ? q4_f8(_mm_loadu_si128((const __m128i *)(wq + b * 16)), p)
                : _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                      _mm_loadl_epi64((const __m128i *)(wq + b * 32 + p * 8))));
            _mm256_store_ps(out + b * 32 + p * 8, _mm256_fmadd_ps(f, dv, mv));
        }
#else
        for (int j = 0; j < 16 && w->fmt == FMT_Q4; j++) {
            out[b * 32 + j] = d * (float)(wq[b * 16 + j] & 0x0f) + m;
            out[b * 32 + j + 16] = d * (float)(wq[b * 16 + j] >> 4) + m;
        }
        for (int j = 0; j < 32 && w->fmt == FMT_Q8; j++)
            out[b * 32 + j] = d * (float)(int8_t)wq[b * 32 + j];
#endif
    }
}

/* y[t] = dot(wf, x[t]) for 4 tokens at once (wf: a dequantized row). */
static inline void dot4_f32(const float *wf, const float *x, int64_t ldx, int k, float *out) {
#if defined(RLM_AVX2) && defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < k; j += 16) {
        __m512 wv = _mm512_loadu_ps(wf + j);
        a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + j), a0);
        a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + ldx + j), a1);
        a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 2 * ldx + j), a2);
        a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 3 * ldx + j), a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
#elif defined(RLM_AVX2)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < k; j += 8) {
        __m256 wv = _mm256_loadu_ps(wf + j);
        a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j), a0);
        a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + ldx + j), a1);
        a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * ldx + j), a2);
        a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * ldx + j), a3);
    }
    out[0] = hsum256(a0);
    out[1] = hsum256(a1);
    out[2] = hsum256(a2);
    out[3] = hsum256(a3);
#else
    for (int i = 0; i < 4; i++) {
        float s = 0.f;
        for (int j = 0; j < k; j++) s += wf[j] * x[i * ldx + j];
        out[i] = s;
    }
#endif
}

/* RT dequantized rows (row stride ldw) x 4 tokens (row stride ldx): out[r * 4 + i]. Rows of
 * weights and tokens both reused from registers: FMA-bound instead of load-bound. */
#if defined(RLM_AVX2) && defined(__AVX512F__)
#define RT 4
static inline void dot_rt4_f32(const float *wf, int64_t ldw, const float *x, int64_t ldx,
                               int k, float *out) {
    __m512 acc[RT][4];
    for (int r = 0; r < RT; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 16) {
        __m512 xv[4];
        for (int i = 0; i < 4; i++) xv[i] = _mm512_loadu_ps(x + i * ldx + j);
        for (int r = 0; r < RT; r++) {
            __m512 wv = _mm512_load_ps(wf + r * ldw + j);
            for (int i = 0; i < 4; i++) acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RT; r++)
        for (int i = 0; i < 4; i++) out[r * 4 + i] = _mm512_reduce_add_ps(acc[r][i]);
}
#elif defined(RLM_AVX2)
#define RT 2
static inline void dot_rt4_f32(const float *wf, int64_t ldw, const float *x, int64_t ldx,
                               int k, float *out) {
    __m256 acc[RT][4];
    for (int r = 0; r < RT; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();
    for (int j = 0; j < k; j += 8) {
        __m256 xv[4];
        for (int i = 0; i < 4; i++) xv[i] = _mm256_loadu_ps(x + i * ldx + j);
        for (int r = 0; r < RT; r++) {
            __m256 wv = _mm256_load_ps(wf + r * ldw + j);
            for (int i = 0; i < 4; i++) acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RT; r++)
        for (int i = 0; i < 4; i++) out[r * 4 + i] = hsum256(acc[r][i]);
}
#else
#define RT 1
static inline void dot_rt4_f32(const float *wf, int64_t ldw, const float *x, int64_t ldx,
                               int k, float *out) {
    (void)ldw;
    dot4_f32(wf, x, ldx, k, out);
}
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
} Act;

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* Four Q4 rows at once against one fp32 activation row: x loads shared by the rows and
 * one horizontal reduction for the four (rows of ~576 columns are short: per-row
 * reductions were a third of the time). out[r] = row n0 + r. */
static inline __attribute__((always_inline)) void qdot_f32_q4x4(
    const int NT, const uint8_t *wq, const f16 *wd, const f16 *wm, int64_t rb, int nb,
    const float *x, int64_t ldx, const float *xs, float *out) {
    /* NT (1-3) tokens share each row's unpacked nibbles: a batch of 2 or 3 costs little
     * more than one token (the step streams the same weights). out[i * 4 + r]. */
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
            __m128i v = _mm_loadu_si128((const __m128i *)(wq + r * rb * 16 + b * 16));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_and_si128(_mm_srli_epi16(v, 4), mask)));
            __m512 d = _mm512_set1_ps(H(wd[r * rb + b]));
            for (int i = 0; i < NT; i++)
                acc[r][i] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, x1[i], _mm512_mul_ps(lo, x0[i])),
                                            d, acc[r][i]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NT; i++) {
            float m = 0.f;
            for (int b = 0; b < nb; b++) m += H(wm[r * rb + b]) * xs[i * nb + b];
            out[i * 4 + r] = _mm512_reduce_add_ps(acc[r][i]) + m;
        }
}
#endif

#if defined(RLM_AVX2) && defined(__AVX512F__)
/* The Q8 twin of qdot_f32_q4x4 (W = d q): 4 rows x NT (1-3) tokens, out[i * 4 + r]. */
static inline __attribute__((always_inline)) void qdot_f32_q8x4(
    const int NT, const uint8_t *wq, const f16 *wd, int64_t rb, int nb, const float *x,
    int64_t ldx, float *out) {
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
            const uint8_t *q = wq + r * rb * 32 + b * 32;
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
            __m512 hi = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
            __m512 d = _mm512_set1_ps(H(wd[r * rb + b]));
            for (int i = 0; i < NT; i++)
                acc[r][i] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, x1[i], _mm512_mul_ps(lo, x0[i])),
                                            d, acc[r][i]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NT; i++) out[i * 4 + r] = _mm512_reduce_add_ps(acc[r][i]);
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

/* Ask for rows [n, n + count) of w ahead of use: decode streams every weight from DRAM
 * once per step, and the hardware prefetcher alone left the kernels latency-bound. */
static inline void prefetch_rows(const QMat *w, int n, int count, int n_end) {
#ifdef RLM_AVX2
    if (n >= n_end) return;
    if (n + count > n_end) count = n_end - n;
    const int nb = w->k / 32;
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
    const char *q = (const char *)(w->qs + (int64_t)n * row_bytes);
    for (int64_t off = 0; off < row_bytes * count; off += 64) _mm_prefetch(q + off, _MM_HINT_T0);
    const char *d = (const char *)(w->d + (int64_t)n * nb);
    for (int64_t off = 0; off < (int64_t)nb * count * 2; off += 64) _mm_prefetch(d + off, _MM_HINT_T0);
    if (w->fmt == FMT_Q4) {
        const char *m = (const char *)(w->m + (int64_t)n * nb);
        for (int64_t off = 0; off < (int64_t)nb * count * 2; off += 64)
            _mm_prefetch(m + off, _MM_HINT_T0);
    }
#else
    (void)w, (void)n, (void)count, (void)n_end;
#endif
}

static inline const f16 *wm_of(const QMat *w, int n, int nb) {
    return w->fmt == FMT_Q4 ? w->m + (int64_t)n * nb : NULL;
}

#if defined(RLM_AVX2) && !defined(__AVX512F__)
#define RLM_PANEL 1
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
#define PANEL_MIN_T 16
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
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
    int block = (int)((128 * 1024) / ((int64_t)k * 4)) / PMR * PMR;
    block = block < PMR ? PMR : (block > 16 * PMR ? 16 * PMR : block);
    float *wf = (float *)aligned_alloc(64, sizeof(float) * (size_t)block * k);
    if (!wf) abort(); /* no memory for ~128 KB: nothing sensible left to do */
    for (int nblk = n0; nblk < n1; nblk += block) {
        const int brows = n1 - nblk < block ? n1 - nblk : block;
        const int bpad = (brows + PMR - 1) / PMR * PMR;
        for (int r = 0; r < brows; r++)
            dequant_row(w, w->qs + (int64_t)(nblk + r) * row_bytes,
                        w->d + (int64_t)(nblk + r) * nb, wm_of(w, nblk + r, nb), nb,
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
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
#ifdef RLM_PANEL
    if (a->xt) {
        qgemm_panel_f32(w, n0, n1, T, a->xt, y, ldy);
        return;
    }
#endif
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
            if (T == 1) qdot_f32_q8x4(1, wq, wd, nb, nb, a->xf, k, out);
            else if (T == 2) qdot_f32_q8x4(2, wq, wd, nb, nb, a->xf, k, out);
            else qdot_f32_q8x4(3, wq, wd, nb, nb, a->xf, k, out);
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
            if (T == 1) qdot_f32_q4x4(1, wq, wd, wm, nb, nb, a->xf, k, a->xs, out);
            else if (T == 2) qdot_f32_q4x4(2, wq, wd, wm, nb, nb, a->xf, k, a->xs, out);
            else qdot_f32_q4x4(3, wq, wd, wm, nb, nb, a->xf, k, a->xs, out);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < 4; r++) y[(int64_t)t * ldy + n + r] = out[t * 4 + r];
        }
    }
#endif
    if (T >= 4) { /* RT rows dequantized at once, then 4 tokens at a time */
        /* the last T % 4 tokens as one more (zero-padded) group of 4: re-reading the
         * dequantized rows beats unpacking each row's blocks again per token */
        const int full = T / 4 * 4, rest = T - full;
        float xpad[rest ? 4 * k : 1] __attribute__((aligned(64)));
        if (rest) {
            memcpy(xpad, a->xf + (int64_t)full * k, sizeof(float) * (size_t)rest * k);
            memset(xpad + (int64_t)rest * k, 0, sizeof(float) * (size_t)(4 - rest) * k);
        }
        for (; n + RT <= n1; n += RT) {
            for (int r = 0; r < RT; r++)
                dequant_row(w, w->qs + (int64_t)(n + r) * row_bytes, w->d + (int64_t)(n + r) * nb,
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

#ifdef RLM_BF16
/* The 16 horizontal sums of v[0..15], in order, as one vector: a butterfly of in-lane
 * unpacks/shuffles, then across the 128-bit lanes (~45 instructions where 16 separate
 * reductions took ~130, a quarter of a 4x4 bf16 tile's work at k = 576). */
static inline __m512 hsum4_lanes(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* per 128-bit lane q: [sum_q a, sum_q b, sum_q c, sum_q d] */
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
}

static inline __m512 hsum16(const __m512 *v) {
    __m512 r0 = hsum4_lanes(v[0], v[1], v[2], v[3]), r1 = hsum4_lanes(v[4], v[5], v[6], v[7]);
    __m512 r2 = hsum4_lanes(v[8], v[9], v[10], v[11]);
    __m512 r3 = hsum4_lanes(v[12], v[13], v[14], v[15]);
    __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(r0, r1, 0x44), _mm512_shuffle_f32x4(r0, r1, 0xEE));
    __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(r2, r3, 0x44), _mm512_shuffle_f32x4(r2, r3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, z, 0x88), _mm512_shuffle_f32x4(x, z, 0xDD));
}

/* 4 bf16 rows (row stride ldw) x nt <= 4 bf16 tokens (row stride ldx), 32 columns per dot
 * instruction: out[r * 4 + i] for i < nt. nt is a constant where it is inlined (see
 * dot_r4t_bf16): fewer tokens, fewer accumulators, no padding tokens multiplied. */
static inline __attribute__((always_inline)) void dot_r4tn_bf16(
    const uint16_t *wb, int64_t ldw, const uint16_t *x, int64_t ldx, int k, float *out,
    const int nt) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 32) {
        __m512bh xv[4];
        for (int i = 0; i < nt; i++) xv[i] = (__m512bh)_mm512_loadu_si512(x + i * ldx + j);
        for (int r = 0; r < 4; r++) {
            __m512bh wv = (__m512bh)_mm512_load_si512(wb + r * ldw + j);
            for (int i = 0; i < nt; i++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wv, xv[i]);
        }
    }
    _mm512_storeu_ps(out, hsum16(&acc[0][0]));
}

static void dot_r4t_bf16(const uint16_t *wb, int64_t ldw, const uint16_t *x, int64_t ldx,
                         int k, float *out, int nt) {
    switch (nt) {
    case 1: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 1); break;
    case 2: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 2); break;
    case 3: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 3); break;
    default: dot_r4tn_bf16(wb, ldw, x, ldx, k, out, 4);
    }
}

static inline float dot1_bf16(const uint16_t *wb, const uint16_t *x, int k) {
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_load_si512(wb + j),
                               (__m512bh)_mm512_loadu_si512(x + j));
    return _mm512_reduce_add_ps(acc);
}

/* fp32 [k] -> bf16 [k] (k % 32 == 0), round to nearest even as torch does. */
static inline void to_bf16(const float *x, int k, uint16_t *out) {
    for (int j = 0; j < k; j += 32)
        _mm512_storeu_si512(out + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16),
                                                                 _mm512_loadu_ps(x + j)));
}

/* Row n dequantized (W = d q + m) straight to bf16, nearest even. Q4 blocks by table: the
 * 16 values d q + m (q = 0..15) rounded once, then one word permute looks up all 32
 * nibbles (the same fused multiply-add and rounding per value as converting each weight,
 * in a third fewer 512-bit instructions). */
static void dequant_row_bf16(const QMat *w, const uint8_t *wq, const f16 *wd,
                             const f16 *wm, int nb, uint16_t *out) {
#ifdef __AVX512BW__
    if (w->fmt == FMT_Q4) {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m256i nib = _mm256_set1_epi16(0x0f);
        for (int b = 0; b < nb; b++) {
            __m512 vals = _mm512_fmadd_ps(iota, _mm512_set1_ps(H(wd[b])),
                                          _mm512_set1_ps(H(wm[b])));
            __m512i table = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(vals));
            __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(wq + b * 16)));
            __m512i idx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_and_si256(q, nib)), _mm256_srli_epi16(q, 4), 1);
            _mm512_store_si512(out + b * 32, _mm512_permutexvar_epi16(idx, table));
        }
        return;
    }
#endif
    for (int b = 0; b < nb; b++) {
        __m512 lo, hi, dv = _mm512_set1_ps(H(wd[b])), mv = _mm512_set1_ps(wm ? H(wm[b]) : 0.f);
        block_f32(w, wq, b, &lo, &hi);
        _mm512_store_si512(out + b * 32, (__m512i)_mm512_cvtne2ps_pbh(
            _mm512_fmadd_ps(hi, dv, mv), _mm512_fmadd_ps(lo, dv, mv)));
    }
}

/* ACT_BF16: 4 rows at a time dequantized (W = d q + m) and rounded to bf16 once, then every
 * token against them 4 at a time: twice the multiply-adds per instruction of the fp32 path,
 * for steps with enough tokens to be compute-bound. */
static void qgemv_rows_bf16(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                            int64_t ldy) {
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
    uint16_t wb[4 * k] __attribute__((aligned(64)));
    for (int n = n0; n < n1; n += 4) {
        const int rows = n1 - n < 4 ? n1 - n : 4;
        for (int r = 0; r < rows; r++)
            dequant_row_bf16(w, w->qs + (int64_t)(n + r) * row_bytes,
                             w->d + (int64_t)(n + r) * nb, wm_of(w, n + r, nb), nb,
                             wb + (int64_t)r * k);
        int t = 0;
        if (rows == 4)
            for (; t < T; t += 4) {
                float out[16];
                const int nt = T - t < 4 ? T - t : 4;
                dot_r4t_bf16(wb, k, a->xb + (int64_t)t * k, k, k, out, nt);
                for (int r = 0; r < 4; r++)
                    for (int i = 0; i < nt; i++) y[(int64_t)(t + i) * ldy + n + r] = out[r * 4 + i];
            }
        for (; t < T; t++)
            for (int r = 0; r < rows; r++)
                y[(int64_t)t * ldy + n + r] = dot1_bf16(wb + (int64_t)r * k,
                                                        a->xb + (int64_t)t * k, k);
    }
}
#endif

#ifdef RLM_AMX
/* ------------------------------------------------------------------ AMX tiles
 * C[16 rows of W x 16 tokens] += A[16 rows x 32 columns of W, bf16] . B[32 columns x 16
 * tokens, bf16 pairs]. Weights stay row-major (A needs no transpose: 4 rows dequantized to
 * bf16 as in the AVX-512 path, 16 at a time); the activations are packed once per matmul
 * as B tiles: tile (g, jb) holds tokens 16g.. and columns 32jb.., row i = the pairs
 * (x[t][32jb + 2i], x[t][32jb + 2i + 1]) of its 16 tokens. Linux grants the tile state on
 * request (arch_prctl); where it does not, ACT_BF16 runs the AVX-512 BF16 path. */
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

/* c [16 rows of W x 16 tokens] (row-major) into y[token i][row r] (row stride ldy) for
 * i < nt, r < rows: a 16 x 16 transpose in registers, four stages that each swap one bit of
 * the row index with the same bit of the column index. */
static void store_transposed(const float *c, int nt, int rows, float *y, int64_t ldy) {
    __m512 v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_load_ps(c + i * 16);
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
    const __mmask16 m = (__mmask16)((1u << rows) - 1);
    for (int i = 0; i < nt; i++) _mm512_mask_storeu_ps(y + (int64_t)i * ldy, m, v[i]);
}

/* Rows are dequantized a block at a time (up to 128 rows, ~256 KB of bf16: L2), and every
 * 64-token group of B tiles then serves all the block's 16-row groups: for prefill-sized
 * steps the B tiles would otherwise stream from memory once per 16 rows. */
static void qgemv_rows_amx(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                           int64_t ldy) {
    const int k = w->k, nb = k / 32, nkb = k / 32, groups = (T + 15) / 16;
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
    int block = (int)((256 * 1024) / ((int64_t)k * 2)) / 16 * 16;
    block = block < 16 ? 16 : (block > 128 ? 128 : block);
    uint16_t *wb = (uint16_t *)aligned_alloc(64, (size_t)block * k * 2);
    float cbuf[16 * 16] __attribute__((aligned(64)));
    if (!wb) abort(); /* no memory for 256 KB: nothing sensible left to do */
    amx_configure();
    for (int nblk = n0; nblk < n1; nblk += block) {
        const int brows = n1 - nblk < block ? n1 - nblk : block;
        const int bpad = (brows + 15) / 16 * 16;
        for (int r = 0; r < brows; r++)
            dequant_row_bf16(w, w->qs + (int64_t)(nblk + r) * row_bytes,
                             w->d + (int64_t)(nblk + r) * nb, wm_of(w, nblk + r, nb), nb,
                             wb + (int64_t)r * k);
        if (bpad > brows) memset(wb + (int64_t)brows * k, 0, (size_t)(bpad - brows) * k * 2);
        /* 2 x 2 register blocking: C tiles 0-3 = (row group i, token group j) at 2 i + j,
         * A tiles 4-5 (two 16-row groups), B tiles 6-7 (two 16-token groups): each tile
         * load feeds two dot products. */
        for (int g = 0; g < groups; g += 2) {
            const int two_g = groups - g >= 2;
            const uint16_t *b0 = a->xb + (int64_t)g * nkb * 512;
            const uint16_t *b1 = b0 + (int64_t)nkb * 512;
            for (int rg = 0; rg < bpad; rg += 32) {
                const int two_r = bpad - rg >= 32;
                const uint16_t *w0 = wb + (int64_t)rg * k, *w1 = w0 + (int64_t)16 * k;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                if (two_r && two_g) {
                    for (int jb = 0; jb < nkb; jb++) {
                        _tile_loadd(4, w0 + jb * 32, k * 2);
                        _tile_loadd(6, b0 + jb * 512, 64);
                        _tile_loadd(7, b1 + jb * 512, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_loadd(5, w1 + jb * 32, k * 2);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                } else {
                    for (int jb = 0; jb < nkb; jb++) {
                        _tile_loadd(4, w0 + jb * 32, k * 2);
                        _tile_loadd(6, b0 + jb * 512, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        if (two_g) {
                            _tile_loadd(7, b1 + jb * 512, 64);
                            _tile_dpbf16ps(1, 4, 7);
                        }
                        if (two_r) {
                            _tile_loadd(5, w1 + jb * 32, k * 2);
                            _tile_dpbf16ps(2, 5, 6);
                        }
                    }
                }
                for (int c = 0; c < 4; c++) {
                    const int ri = c / 2, gj = c % 2;
                    if ((ri && !two_r) || (gj && !two_g)) continue;
                    switch (c) {
                    case 0: _tile_stored(0, cbuf, 64); break;
                    case 1: _tile_stored(1, cbuf, 64); break;
                    case 2: _tile_stored(2, cbuf, 64); break;
                    default: _tile_stored(3, cbuf, 64); break;
                    }
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
    for (int i = 0; i < 16; i++) _mm512_store_si512(dst + i * 32, _mm512_castps_si512(v[i]));
}

static void qgemm_amx_large(const QMat *w, int n0, int n1, int T, const Act *a, float *y,
                            int64_t ldy) {
    const int k = w->k, nb = k / 32, nkb = k / 32, groups = (T + 15) / 16;
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
    int block = (int)((256 * 1024) / ((int64_t)k * 2)) / 32 * 32;
    block = block < 32 ? 32 : (block > 128 ? 128 : block);
    uint16_t *wb = (uint16_t *)aligned_alloc(64, (size_t)block * k * 2);
    uint16_t *bt = (uint16_t *)aligned_alloc(64, (size_t)block * k * 2); /* B tiles */
    float cbuf[16 * 16] __attribute__((aligned(64)));
    if (!wb || !bt) abort();
    amx_configure();
    for (int nblk = n0; nblk < n1; nblk += block) {
        const int brows = n1 - nblk < block ? n1 - nblk : block;
        const int bpad = (brows + 15) / 16 * 16, rgroups = bpad / 16;
        for (int r = 0; r < brows; r++)
            dequant_row_bf16(w, w->qs + (int64_t)(nblk + r) * row_bytes,
                             w->d + (int64_t)(nblk + r) * nb, wm_of(w, nblk + r, nb), nb,
                             wb + (int64_t)r * k);
        if (bpad > brows) memset(wb + (int64_t)brows * k, 0, (size_t)(bpad - brows) * k * 2);
        for (int rg = 0; rg < rgroups; rg++) /* B tile (rg, jb) at bt + (rg nkb + jb) 512 */
            for (int jb = 0; jb < nkb; jb++)
                transpose_pairs16(wb + (int64_t)rg * 16 * k + jb * 32, k,
                                  bt + ((int64_t)rg * nkb + jb) * 512);
        for (int g = 0; g < groups; g += 2) {
            const int two_g = groups - g >= 2;
            const uint16_t *a0 = a->xb + (int64_t)g * 16 * k, *a1 = a0 + (int64_t)16 * k;
            for (int rg = 0; rg < rgroups; rg += 2) {
                const int two_r = rgroups - rg >= 2;
                const uint16_t *b0 = bt + (int64_t)rg * nkb * 512, *b1 = b0 + (int64_t)nkb * 512;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                if (two_r && two_g) {
                    for (int jb = 0; jb < nkb; jb++) {
                        _tile_loadd(4, a0 + jb * 32, k * 2);
                        _tile_loadd(6, b0 + jb * 512, 64);
                        _tile_loadd(7, b1 + jb * 512, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_loadd(5, a1 + jb * 32, k * 2);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                } else {
                    for (int jb = 0; jb < nkb; jb++) {
                        _tile_loadd(4, a0 + jb * 32, k * 2);
                        _tile_loadd(6, b0 + jb * 512, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        if (two_r) {
                            _tile_loadd(7, b1 + jb * 512, 64);
                            _tile_dpbf16ps(1, 4, 7);
                        }
                        if (two_g) {
                            _tile_loadd(5, a1 + jb * 32, k * 2);
                            _tile_dpbf16ps(2, 5, 6);
                        }
                    }
                }
                for (int c = 0; c < 4; c++) { /* C tile c = (token group c / 2, rows c % 2) */
                    const int ti = c / 2, rj = c % 2;
                    if ((ti && !two_g) || (rj && !two_r)) continue;
                    const int t0 = (g + ti) * 16, r0 = (rg + rj) * 16;
                    const int nt = T - t0 < 16 ? T - t0 : 16, rows = brows - r0 < 16 ? brows - r0 : 16;
                    float *dst = y + (int64_t)t0 * ldy + nblk + r0;
                    const int direct = nt == 16 && rows == 16;
                    float *out = direct ? dst : cbuf;
                    const int64_t stride = direct ? ldy * 4 : 64;
                    switch (c) {
                    case 0: _tile_stored(0, out, stride); break;
                    case 1: _tile_stored(1, out, stride); break;
                    case 2: _tile_stored(2, out, stride); break;
                    default: _tile_stored(3, out, stride); break;
                    }
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

/* y[t, n] (row stride ldy) for n in [n0, n1), all T tokens. */
static void qgemv_rows(const QMat *w, int n0, int n1, int T, const Act *act, float *y,
                       int64_t ldy) {
#ifdef RLM_AMX
    if (act->amx == 2) {
        qgemm_amx_large(w, n0, n1, T, act, y, ldy);
        return;
    }
    if (act->amx) {
        qgemv_rows_amx(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
#ifdef RLM_BF16
    if (act->xb) {
        qgemv_rows_bf16(w, n0, n1, T, act, y, ldy);
        return;
    }
#endif
    if (act->f32) {
        qgemv_rows_f32(w, n0, n1, T, act, y, ldy);
        return;
    }
    const int8_t *xa = act->xa;
    const float *xd = act->xd, *xs = act->xs;
    const int k = w->k, nb = k / 32;
    const int64_t row_bytes = (int64_t)nb * (w->fmt == FMT_Q4 ? 16 : 32);
#ifdef RLM_AVX2
    uint8_t ubuf[k] __attribute__((aligned(64)));
#endif
    for (int n = n0; n < n1; n++) {
        const f16 *wd = w->d + (int64_t)n * nb;
        const f16 *wm = w->fmt == FMT_Q4 ? w->m + (int64_t)n * nb : NULL;
        const uint8_t *wq = w->qs + (int64_t)n * row_bytes;
#ifdef RLM_AVX2
        if (T < 4) {
            for (int t = 0; t < T; t++)
                y[(int64_t)t * ldy + n] = qdot_row1(w, wq, wd, wm, xa + (int64_t)t * k,
                                                    xd + (int64_t)t * nb, xs + (int64_t)t * nb,
                                                    nb);
            continue;
        }
        /* unpack the row once (Q4: nibbles -> bytes; Q8: |w|), reuse for every token */
        if (w->fmt == FMT_Q4) {
            for (int b = 0; b < nb; b++)
                _mm256_store_si256((__m256i *)(ubuf + b * 32), unpack_q4(wq + b * 16));
        } else {
            for (int b = 0; b < nb; b++)
                _mm256_store_si256((__m256i *)(ubuf + b * 32),
                                   _mm256_abs_epi8(_mm256_loadu_si256(
                                       (const __m256i *)(wq + b * 32))));
        }
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            float m0 = 0.f, m1 = 0.f, m2 = 0.f, m3 = 0.f;
            const int8_t *a0 = xa + (int64_t)t * k;
            const float *d0 = xd + (int64_t)t * nb, *s0 = xs + (int64_t)t * nb;
            for (int b = 0; b < nb; b++) {
                __m256i u = _mm256_load_si256((const __m256i *)(ubuf + b * 32));
                __m256i sg = w->fmt == FMT_Q8
                    ? _mm256_loadu_si256((const __m256i *)(wq + b * 32)) : u;
#define RLM_TOK(i, acc, ms)                                                              \
    {                                                                                     \
        __m256i s = _mm256_loadu_si256((const __m256i *)(a0 + (int64_t)(i) * k + b * 32)); \
        if (w->fmt == FMT_Q8) s = _mm256_sign_epi8(s, sg);                                \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(u, s)),                         \
                              _mm256_set1_ps(H(wd[b]) * d0[(i) * nb + b]), acc);             \
        if (wm) ms += H(wm[b]) * s0[(i) * nb + b];                                           \
    }
                RLM_TOK(0, acc0, m0) RLM_TOK(1, acc1, m1) RLM_TOK(2, acc2, m2)
                RLM_TOK(3, acc3, m3)
            }
            y[(int64_t)t * ldy + n] = hsum256(acc0) + m0;
            y[(int64_t)(t + 1) * ldy + n] = hsum256(acc1) + m1;
            y[(int64_t)(t + 2) * ldy + n] = hsum256(acc2) + m2;
            y[(int64_t)(t + 3) * ldy + n] = hsum256(acc3) + m3;
        }
#undef RLM_TOK
        for (; t < T; t++)
            y[(int64_t)t * ldy + n] = qdot_row1(w, wq, wd, wm, xa + (int64_t)t * k,
                                                xd + (int64_t)t * nb, xs + (int64_t)t * nb, nb);
#else
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ldy + n] = qdot_row1(w, wq, wd, wm, xa + (int64_t)t * k,
                                                xd + (int64_t)t * nb, xs + (int64_t)t * nb, nb);
#endif
    }
}

/* Split [0, n) into nthreads contiguous chunks (multiples of 4 rows). */
static inline void chunk(int n, int tid, int nth, int *lo, int *hi) {
    int per = ((n + nth - 1) / nth + 3) & ~3;
    *lo = tid * per < n ? tid * per : n;
    *hi = (tid + 1) * per < n ? (tid + 1) * per : n;
}

/* ------------------------------------------------------------------ small fp32 ops */
static void rmsnorm_row(const float *x, const float *w, float eps, int n, float *out) {
    float ss = 0.f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

static void rope_head(float *x, const float *c, const float *s, int half) {
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i] + x1 * s[i];
    }
}

static void store_kv_row(void *cache, int64_t off, const float *x, int n, int32_t dtype) {
    if (dtype == KV_F32) {
        memcpy((float *)cache + off, x, (size_t)n * 4);
    } else {
        uint16_t *dst = (uint16_t *)cache + off;
        for (int i = 0; i < n; i++) dst[i] = f32_to_bf16(x[i]);
    }
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
    for (int i = 0; i < D; i++)
        acc += q[i] * (dtype == KV_F32 ? ((const float *)kc)[off + i]
                                       : bf16_to_f32(((const uint16_t *)kc)[off + i]));
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
    for (int i = 0; i < D; i++)
        out[i] += w * (dtype == KV_F32 ? ((const float *)vc)[off + i]
                                       : bf16_to_f32(((const uint16_t *)vc)[off + i]));
}

/* ------------------------------------------------------------------ exp, softmax, SiLU
 * Vectorized exp (the scalar expf per position and per MLP value dominated attention and
 * the activation). */
#if defined(RLM_AVX2) && defined(__AVX512F__)
/* exp(x) for 16 lanes (x <= 0 here: scores minus their max): 2^n * p(r) with
 * r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6 polynomial, ~2 ulp; -inf and very
 * negative x give 0. The scalar expf per position was half the attention time. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 pl = _mm512_set1_ps(1.3981999507e-3f);
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(8.3334519073e-3f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(4.1665795894e-2f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.6666665459e-1f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(5.0000001201e-1f));
    pl = _mm512_fmadd_ps(pl, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(pl, n);
}

/* sc[0 .. count) = exp(sc - mx); returns their sum. */
static inline float exp_sum(float *sc, int64_t count, float mx) {
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= count; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sc + j), m));
        _mm512_storeu_ps(sc + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < count) {
        __mmask16 k = (__mmask16)((1u << (count - j)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + j), m));
        _mm512_mask_storeu_ps(sc + j, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(acc);
}

/* out = silu(g) * u = g / (1 + exp(-g)) * u over n values. */
static void silu_mul(const float *g, const float *u, int n, float *out) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        /* exp512 wants x <= 0 for range: exp(-|g|), then silu from the sign */
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
        __m512 one = _mm512_set1_ps(1.f);
        __mmask16 pos = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ);
        /* sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0 */
        __m512 num = _mm512_mask_blend_ps(pos, e, one);
        __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

#elif defined(RLM_AVX2)
/* exp(x) for 8 lanes: the same reduction and polynomial as exp512 (AVX2 has no scalef:
 * 2^n is built in the exponent bits). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 pl = _mm256_set1_ps(1.3981999507e-3f);
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(8.3334519073e-3f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(4.1665795894e-2f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.6666665459e-1f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(5.0000001201e-1f));
    pl = _mm256_fmadd_ps(pl, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    /* 2^n for n in [-126, 127] as exponent bits; x >= -87.3 keeps n >= -126 */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(pl, _mm256_castsi256_ps(e));
}

static inline float exp_sum(float *sc, int64_t count, float mx) {
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), m));
        _mm256_storeu_ps(sc + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum256(acc);
    for (; j < count; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

static void silu_mul(const float *g, const float *u, int n, float *out) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_or_ps(_mm256_andnot_ps(sign, gv), sign)); /* exp(-|g|) */
        __m256 pos = _mm256_cmp_ps(gv, zero, _CMP_GE_OQ);
        __m256 num = _mm256_blendv_ps(e, one, pos);
        __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}
#else
static inline float exp_sum(float *sc, int64_t count, float mx) {
    float sum = 0.f;
    for (int64_t j = 0; j < count; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

static void silu_mul(const float *g, const float *u, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}
#endif

/* One query head over positions 0 .. p of its request (through req_to_token). */
static void attend_head(const float *q, const int32_t *slots, int64_t p, int g, int Hkv, int D,
                        float scale, const void *kc, const void *vc, int32_t dtype,
                        float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        float s = dot_kv(q, kc, ((int64_t)slots[j] * Hkv + g) * D, D, dtype) * scale;
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = 1.f / exp_sum(scores, p + 1, mx);
    for (int i = 0; i < D; i++) out[i] = 0.f;
    for (int64_t j = 0; j <= p; j++)
        axpy_kv(out, scores[j] * inv, vc, ((int64_t)slots[j] * Hkv + g) * D, D, dtype);
}

#if defined(RLM_AVX2) && defined(__AVX512F__)
static inline __m512 load16_kv(const void *base, int64_t off, int32_t dtype) {
    if (dtype == KV_F32) return _mm512_loadu_ps((const float *)base + off);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One vector width for the attention group loop: 16 floats on AVX-512, 8 on AVX2. */
#define AV_W 16
typedef __m512 avec;
#define AV_LOADU _mm512_loadu_ps
#define AV_MUL _mm512_mul_ps
#define AV_FMA _mm512_fmadd_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps
#define AV_STOREU _mm512_storeu_ps
#define AV_SUM _mm512_reduce_add_ps
#define AV_LOAD_KV load16_kv
#elif defined(RLM_AVX2)
#define AV_W 8
typedef __m256 avec;
#define AV_LOADU _mm256_loadu_ps
#define AV_MUL _mm256_mul_ps
#define AV_FMA _mm256_fmadd_ps
#define AV_SET1 _mm256_set1_ps
#define AV_ZERO _mm256_setzero_ps
#define AV_STOREU _mm256_storeu_ps
#define AV_SUM hsum256
#define AV_LOAD_KV load8_kv
#endif

#ifdef AV_W
/* nh (<= HB) query heads that share KV head g, D = AV_W NV: each K and V row is loaded once
 * for the group, and the outputs stay in registers across positions. Same numbers as
 * attend_head up to the order of the sums. scores: nh rows of stride ss. */
static inline __attribute__((always_inline)) void attend_group(
    const int NV, const int HB, const float *q, int nh, const int32_t *slots, int64_t p, int g,
    int Hkv, float scale, const void *kc, const void *vc, int32_t dtype, float *scores,
    int64_t ss, float *out) {
    const int D = AV_W * NV;
    float mx[HB], inv[HB];
    for (int h = 0; h < HB; h++) mx[h] = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        avec kv[NV];
        for (int i = 0; i < NV; i++) kv[i] = AV_LOAD_KV(kc, off + AV_W * i, dtype);
        for (int h = 0; h < HB; h++) {
            if (h >= nh) break;
            avec acc = AV_MUL(AV_LOADU(q + h * D), kv[0]);
            for (int i = 1; i < NV; i++)
                acc = AV_FMA(AV_LOADU(q + h * D + AV_W * i), kv[i], acc);
            float sc = AV_SUM(acc) * scale;
            scores[h * ss + j] = sc;
            mx[h] = sc > mx[h] ? sc : mx[h];
        }
    }
    for (int h = 0; h < nh; h++) inv[h] = 1.f / exp_sum(scores + h * ss, p + 1, mx[h]);
    avec o[HB][NV];
    for (int h = 0; h < HB; h++)
        for (int i = 0; i < NV; i++) o[h][i] = AV_ZERO();
    for (int64_t j = 0; j <= p; j++) {
        const int64_t off = ((int64_t)slots[j] * Hkv + g) * D;
        for (int i = 0; i < NV; i++) {
            avec vv = AV_LOAD_KV(vc, off + AV_W * i, dtype);
            for (int h = 0; h < HB; h++)
                if (h < nh) o[h][i] = AV_FMA(AV_SET1(scores[h * ss + j]), vv,
                                                      o[h][i]);
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
                         int Hkv, int D, float scale, const void *kc, const void *vc,
                         int32_t dtype, float *scores, float *out) {
    const int64_t ss = p + 16;
#if defined(RLM_AVX2) && defined(__AVX512F__)
    if (D == 64) {
        for (int h = 0; h < nh; h += 4)
            attend_group(4, 4, q + h * D, nh - h < 4 ? nh - h : 4, slots, p, g, Hkv, scale,
                             kc, vc, dtype, scores, ss, out + h * D);
        return;
    }
    if (D == 128) {
        for (int h = 0; h < nh; h += 2)
            attend_group(8, 2, q + h * D, nh - h < 2 ? nh - h : 2, slots, p, g, Hkv, scale,
                             kc, vc, dtype, scores, ss, out + h * D);
        return;
    }
#elif defined(RLM_AVX2)
    if (D == 64) { /* 8 vectors of K or V per row, one head at a time: 16 registers */
        for (int h = 0; h < nh; h++)
            attend_group(8, 1, q + h * D, 1, slots, p, g, Hkv, scale, kc, vc, dtype,
                             scores, ss, out + h * D);
        return;
    }
#endif
    (void)ss;
    for (int h = 0; h < nh; h++)
        attend_head(q + h * D, slots, p, g, Hkv, D, scale, kc, vc, dtype, scores, out + h * D);
}

/* ------------------------------------------------------------------ workspace */
/* Attention work is split in units of one token and up to this many query heads of one
 * KV group (K/V rows loaded once per unit). */
#define RLM_HEADS_PER_UNIT 8

typedef struct {
    float *x, *qkv, *attn, *tmp, *gu, *act, *xd, *xs, *scores;
    int8_t *xa;
    uint16_t *xb;
    float *xt;
} Work;

static int64_t max_k(const Layer *L) {
    int64_t k = L->hidden > L->inter ? L->hidden : L->inter;
    int64_t q = (int64_t)L->n_heads * L->head_dim;
    return k > q ? k : q;
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
    RLM_TAKE(scores, (int64_t)nth * RLM_HEADS_PER_UNIT * (max_ctx + 16))
    RLM_TAKE(xa, T * K / 4 + 16)          /* int8: 4 per float */
    RLM_TAKE(xb, (T + 15) / 16 * 16 * K / 2 + 16) /* bf16: 2 per float, padded tokens */
    RLM_TAKE(xt, (T + 31) / 32 * 32 * K)          /* fp32 transposed, padded tokens */
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

/* Prepare rows [lo, hi) of x [T, k] for a matmul: int8 blocks, bf16 rows (ACT_BF16 on a
 * bf16 build; packed as AMX tiles for steps of RLM_AMX_MIN_ROWS tokens or more where the
 * tiles are granted), or fp32 block sums. */
static Act prep_rows(const float *x, int T, int k, const Work *w, int mode, int tid, int nth) {
    int lo, hi, nb = k / 32;
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
            quantize_row(xr, k, w->xa + (int64_t)t * k, w->xd + (int64_t)t * nb,
                         w->xs + (int64_t)t * nb);
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
    Act a = {mode != ACT_INT8, x, w->xd, w->xs, w->xa, bf16 ? w->xb : NULL, amx,
             panel ? w->xt : NULL};
    return a;
}

static void gemv(const QMat *m, int T, const Act *a, float *y, int tid, int nth) {
    int lo, hi;
    chunk(m->n, tid, nth, &lo, &hi);
    qgemv_rows(m, lo, hi, T, a, y, m->n);
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

/* One layer, run by every thread of the team (tid of nth). res [T, hidden] is the
 * residual stream: res += attn(norm(res)); res += mlp(norm(res)). k_cache / v_cache: this
 * layer's [capacity, n_kv_heads, head_dim] pool buffers; the step's K/V are stored at
 * out_loc before any token attends. */
static void layer_body(const Layer *L, const Step *S, void *k_cache, void *v_cache, float *res,
                       const Work *wp, int tid, int nth) {
    const int T = S->T, H = L->hidden, D = L->head_dim, Hq = L->n_heads, Hkv = L->n_kv_heads;
    const int q = Hq * D, kv = Hkv * D, qkvn = q + 2 * kv, I = L->inter, half = D / 2;
    Work w = *wp;
    int lo, hi;
    row_range(T, tid, nth, &lo, &hi);
    PROF_START()
    for (int t = lo; t < hi; t++) rmsnorm_row(res + (int64_t)t * H, L->in_norm, L->eps, H,
                                              w.x + (int64_t)t * H);
    Act a = prep_rows(w.x, T, H, &w, S->act_mode, tid, nth);
    barrier(nth);
    PROF(0)
    gemv(&L->qkv, T, &a, w.qkv, tid, nth);
    barrier(nth);
    PROF(1)
    for (int t = lo; t < hi; t++) {
        float *r = w.qkv + (int64_t)t * qkvn;
        if (L->qkv_bias)
            for (int i = 0; i < qkvn; i++) r[i] += L->qkv_bias[i];
        const float *c = S->cos + (int64_t)t * half, *s = S->sin + (int64_t)t * half;
        for (int h = 0; h < Hq + Hkv; h++) rope_head(r + h * D, c, s, half);
        int64_t off = S->out_loc[t] * kv;
        store_kv_row(k_cache, off, r + q, kv, S->kv_dtype);
        store_kv_row(v_cache, off, r + q + kv, kv, S->kv_dtype);
    }
    barrier(nth);
    PROF(2)
    float *scores = w.scores + (int64_t)tid * RLM_HEADS_PER_UNIT * (S->max_ctx + 16);
    const int rep = Hq / Hkv, per = rep < RLM_HEADS_PER_UNIT ? rep : RLM_HEADS_PER_UNIT;
    const int chunks = (rep + per - 1) / per;
    for (int64_t u = tid; u < (int64_t)T * Hkv * chunks; u += nth) {
        int t = (int)(u / (Hkv * chunks)), g = (int)(u / chunks % Hkv);
        int h0 = g * rep + (int)(u % chunks) * per, nh = g * rep + rep - h0 < per
                                                           ? g * rep + rep - h0 : per;
        const int32_t *slots = S->req_to_token + S->rows[t] * S->r2t_stride;
        attend_heads(w.qkv + (int64_t)t * qkvn + h0 * D, nh, slots, S->pos[t], g, Hkv, D,
                     L->attn_scale, k_cache, v_cache, S->kv_dtype, scores,
                     w.attn + (int64_t)t * q + h0 * D);
    }
    barrier(nth);
    a = prep_rows(w.attn, T, q, &w, S->act_mode, tid, nth);
    barrier(nth);
    PROF(3)
    gemv(&L->o, T, &a, w.tmp, tid, nth);
    barrier(nth);
    PROF(4)
    for (int t = lo; t < hi; t++) {
        float *r = res + (int64_t)t * H;
        const float *o = w.tmp + (int64_t)t * H;
        for (int i = 0; i < H; i++) r[i] += o[i];
        rmsnorm_row(r, L->post_norm, L->eps, H, w.x + (int64_t)t * H);
    }
    a = prep_rows(w.x, T, H, &w, S->act_mode, tid, nth);
    barrier(nth);
    PROF(5)
    gemv(&L->gate_up, T, &a, w.gu, tid, nth);
    barrier(nth);
    PROF(6)
    for (int t = lo; t < hi; t++) {
        const float *g = w.gu + (int64_t)t * 2 * I, *u = g + I;
        float *ac = w.act + (int64_t)t * I;
        silu_mul(g, u, I, ac);
    }
    a = prep_rows(w.act, T, I, &w, S->act_mode, tid, nth);
    barrier(nth);
    PROF(7)
    gemv(&L->down, T, &a, w.tmp, tid, nth);
    barrier(nth);
    for (int t = lo; t < hi; t++) {
        float *r = res + (int64_t)t * H;
        const float *o = w.tmp + (int64_t)t * H;
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
    for (int i = 0; i < j->n_layers; i++) {
        layer_body(&j->layers[i], j->S, j->k_caches[i], j->v_caches[i], j->res, j->w, tid, nth);
        barrier(nth);
    }
}

/* Every layer of the step in one parallel job (layers[i] with k_caches[i] / v_caches[i]). */
void rlm_layers(const Layer *layers, int32_t n_layers, void *const *k_caches,
                void *const *v_caches, const Step *S, float *res) {
    Work w;
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
    Act a = prep_rows(j->w->x, j->T, k, j->w, j->act_mode, tid, nth);
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
    HeadJob j = {head, norm, x, eps, logits, T, act_mode, &w};
    run_parallel(head_job, &j, nthreads);
}

int64_t rlm_matmul_workspace_floats(int32_t T, int32_t k, int32_t nthreads) {
    (void)nthreads;
    return (int64_t)T * k + 2 * (int64_t)T * (k / 32) + ((int64_t)T * k + 64) / 4
           + ((int64_t)(T + 15) / 16 * 16 * k) / 2 + 32 + (int64_t)(T + 31) / 32 * 32 * k + 64;
}

/* Kernel-test entry points: one op each, the same code the layer runs. */
void rlm_quantize_rows(const float *x, int32_t T, int32_t k, int8_t *a, float *dx, float *sx) {
    for (int t = 0; t < T; t++)
        quantize_row(x + (int64_t)t * k, k, a + (int64_t)t * k, dx + (int64_t)t * (k / 32),
                     sx + (int64_t)t * (k / 32));
}

void rlm_attention(const float *q, int32_t T, int32_t Hq, int32_t Hkv, int32_t D, float scale,
                   const int64_t *rows, const int64_t *pos, const int32_t *req_to_token,
                   int64_t r2t_stride, const void *k_cache, const void *v_cache,
                   int32_t kv_dtype, int32_t max_ctx, float *out) {
    const int rep = Hq / Hkv;
    float *scores = (float *)malloc(sizeof(float) * (size_t)rep * (max_ctx + 16));
    for (int t = 0; t < T; t++)
        for (int g = 0; g < Hkv; g++)
            attend_heads(q + ((int64_t)t * Hq + g * rep) * D, rep,
                         req_to_token + rows[t] * r2t_stride, pos[t], g, Hkv, D, scale, k_cache,
                         v_cache, kv_dtype, scores, out + ((int64_t)t * Hq + g * rep) * D);
    free(scores);
}

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

/* Kernel-test entry: out[i] = silu(g[i]) * u[i], the layer's MLP activation. */
void rlm_silu_mul(const float *g, const float *u, int32_t n, float *out) { silu_mul(g, u, n, out); }

/* Steps of at least this many tokens are the ones the engine's default runs bf16 (smaller
 * ones fp32 or int8): RLM_AMX_MIN_ROWS on AMX tiles where rlm_amx() says so; else, on an
 * AVX512-BF16 build, RLM_BF16_MIN_ROWS (a 2-token step 6.8 ms bf16 vs 10.7 fp32, 4 tokens
 * 8.6 vs 13.5, 16 tokens 22.4 vs 41.2 on a 2-core Zen 4); 0 on a build without bf16 dot
 * products (none runs bf16). */
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
