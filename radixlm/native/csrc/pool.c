/* The thread pool.
 *
 * A step has ~10 stages per layer with a barrier between each (300+ per decode step).
 * libgomp throttles its spin-waits to almost nothing as soon as it manages more threads
 * than there are CPUs (an idle team of the main thread plus the scheduler thread's team
 * is enough), and every barrier then sleeps in the kernel: a decode step issued from the
 * engine's scheduler thread measured 2x its time on the main thread. Our own pool spins at
 * barriers (yielding after a while) and parks its workers on a condition variable only
 * between jobs, whichever thread submits them. One job at a time (a mutex), so several
 * engines in one process share it safely. */
#include "rlm.h"

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
    for (unsigned spins = 0; atomic_load_explicit(&P.pending, memory_order_acquire) > 0;) {
        cpu_relax();
        if (++spins % 4096 == 0) sched_yield(); /* a worker not on a CPU: let it run */
    }
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
