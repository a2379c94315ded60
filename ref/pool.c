/* pool.c - fixed compute threads for the reference backend: spin, then sleep.
 * Never splits work or touches numbers; under DEVIO_NO_THREADS every job runs
 * inline on the caller, so the wasm32-wasi build needs no threads at all. */
#include "ref/pool.h"

#include <stdlib.h>

#ifndef DEVIO_NO_THREADS
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

/* How long an idle thread keeps polling before it sleeps. A decode step has
 * gaps of a few microseconds between runs; a condvar wake-up costs tens of
 * microseconds, so a thread that sleeps between runs halves the speed. */
#define POOL_SPIN_NS 200000LL
#endif

/* The state word of the threaded pool: the generation of the current run
 * in the high half; a closed bit and the number of workers that joined the
 * run in the low half. A worker joins only an open run of the generation it
 * was woken for, so a worker that wakes late (its core was busy elsewhere)
 * finds the run closed and never delays the caller: the caller runs any
 * jobs nobody claimed and waits only for workers that did join. */
#define POOL_CLOSED 0x80000000u
#define POOL_JOINED 0x7fffffffu

struct devio_pool {
    uint32_t n_threads;
#ifndef DEVIO_NO_THREADS
    pthread_t *workers;
    uint32_t n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* generation moved on, or stop */
    pthread_cond_t cv_done; /* the last joined worker left a closed run */
    atomic_uint_least64_t state;
    atomic_uint next_job; /* next job index to claim */
    atomic_bool stop;
    uint32_t generation;  /* caller's copy of the current generation */
    /* The current run, written before its generation is published. */
    uint32_t n_jobs;
    devio_pool_fn fn;
    void *ctx;
#endif
};

#ifdef DEVIO_NO_THREADS

devio_pool *devio_pool_create(uint32_t n_threads)
{
    (void)n_threads;
    devio_pool *p = calloc(1, sizeof *p);
    if (p)
        p->n_threads = 1;
    return p;
}

uint32_t devio_pool_threads(const devio_pool *pool)
{
    return pool->n_threads;
}

void devio_pool_run(devio_pool *pool, uint32_t n_jobs, devio_pool_fn fn, void *ctx)
{
    (void)pool;
    for (uint32_t j = 0; j < n_jobs; j++)
        fn(ctx, j, 0);
}

void devio_pool_free(devio_pool *pool)
{
    free(pool);
}

#else

typedef struct pool_worker_arg {
    devio_pool *pool;
    uint32_t index;
} pool_worker_arg;

static void pool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long long pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* True once POOL_SPIN_NS have passed since the first call with *deadline 0;
 * reads the clock only every 64 calls. */
static bool pool_spin_over(uint32_t i, long long *deadline)
{
    if ((i & 63) != 63)
        return false;
    long long now = pool_now_ns();
    if (*deadline == 0) {
        *deadline = now + POOL_SPIN_NS;
        return false;
    }
    return now > *deadline;
}

static uint32_t pool_gen(uint64_t state)
{
    return (uint32_t)(state >> 32);
}

/* Claim and run jobs of the current run until none is left. Only the
 * caller and joined workers get here, so the run cannot change meanwhile. */
static void pool_drain_jobs(devio_pool *p, uint32_t thread_index)
{
    uint32_t n = p->n_jobs;
    for (;;) {
        uint32_t j = atomic_fetch_add_explicit(&p->next_job, 1, memory_order_relaxed);
        if (j >= n)
            break;
        p->fn(p->ctx, j, thread_index);
    }
}

/* Wait until the generation differs from seen; returns the new one. */
static uint32_t pool_wait_generation(devio_pool *p, uint32_t seen)
{
    long long deadline = 0;
    for (uint32_t i = 0;; i++) {
        uint32_t g = pool_gen(atomic_load_explicit(&p->state, memory_order_acquire));
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_acquire))
            return g;
        if (pool_spin_over(i, &deadline))
            break;
        pool_relax();
    }
    pthread_mutex_lock(&p->mu);
    uint32_t g;
    while ((g = pool_gen(atomic_load_explicit(&p->state, memory_order_acquire))) == seen &&
           !atomic_load_explicit(&p->stop, memory_order_acquire))
        pthread_cond_wait(&p->cv_work, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

/* Join the run of generation g if it is still open. */
static bool pool_join(devio_pool *p, uint32_t g)
{
    uint64_t c = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (pool_gen(c) != g || (c & POOL_CLOSED))
            return false;
        if (atomic_compare_exchange_weak_explicit(&p->state, &c, c + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return true;
    }
}

static void *pool_worker_main(void *argp)
{
    pool_worker_arg *arg = argp;
    devio_pool *p = arg->pool;
    uint32_t index = arg->index;
    free(arg);
    uint32_t seen = 0;
    for (;;) {
        seen = pool_wait_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        if (!pool_join(p, seen))
            continue;
        pool_drain_jobs(p, index);
        uint64_t old = atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel);
        if ((old & POOL_JOINED) == 1 && (old & POOL_CLOSED)) {
            /* Signal under the lock so a caller about to sleep cannot miss it. */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

devio_pool *devio_pool_create(uint32_t n_threads)
{
    if (n_threads == 0)
        n_threads = 1;
    devio_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_threads = n_threads;
    atomic_init(&p->state, 0);
    atomic_init(&p->next_job, 0);
    atomic_init(&p->stop, false);
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto out_free;
    if (pthread_cond_init(&p->cv_work, NULL) != 0)
        goto out_mutex;
    if (pthread_cond_init(&p->cv_done, NULL) != 0)
        goto out_cv_work;
    if (n_threads > 1) {
        p->workers = calloc(n_threads - 1, sizeof *p->workers);
        if (!p->workers)
            goto out_cv_done;
    }
    for (uint32_t i = 1; i < n_threads; i++) {
        pool_worker_arg *arg = malloc(sizeof *arg);
        if (!arg)
            goto out_stop;
        arg->pool = p;
        arg->index = i;
        if (pthread_create(&p->workers[i - 1], NULL, pool_worker_main, arg) != 0) {
            free(arg);
            goto out_stop;
        }
        p->n_started++;
    }
    return p;

out_stop:
    devio_pool_free(p);
    return NULL;
out_cv_done:
    pthread_cond_destroy(&p->cv_done);
out_cv_work:
    pthread_cond_destroy(&p->cv_work);
out_mutex:
    pthread_mutex_destroy(&p->mu);
out_free:
    free(p);
    return NULL;
}

uint32_t devio_pool_threads(const devio_pool *pool)
{
    return pool->n_threads;
}

void devio_pool_run(devio_pool *p, uint32_t n_jobs, devio_pool_fn fn, void *ctx)
{
    if (n_jobs == 0)
        return;
    if (p->n_started == 0 || n_jobs == 1) {
        for (uint32_t j = 0; j < n_jobs; j++)
            fn(ctx, j, 0);
        return;
    }
    p->n_jobs = n_jobs;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->next_job, 0, memory_order_relaxed);
    p->generation++;
    /* Publishing the new generation (open, nobody joined) releases the
     * run's fields to the workers that join it. */
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->state, (uint64_t)p->generation << 32, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    pool_drain_jobs(p, 0);

    uint64_t old = atomic_fetch_or_explicit(&p->state, POOL_CLOSED, memory_order_acq_rel);
    if ((old & POOL_JOINED) == 0)
        return;
    long long deadline = 0;
    for (uint32_t i = 0;; i++) {
        if ((atomic_load_explicit(&p->state, memory_order_acquire) & POOL_JOINED) == 0)
            return;
        if (pool_spin_over(i, &deadline))
            break;
        pool_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->state, memory_order_acquire) & POOL_JOINED)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void devio_pool_free(devio_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, true, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

#endif
