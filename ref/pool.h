/* pool.h - a small fixed pool of compute threads that runs indexed jobs.
 * It only schedules: it never decides how work is split, so no number may
 * depend on which thread ran a job or on how many threads there are. */
#ifndef DEVIO_REF_POOL_H
#define DEVIO_REF_POOL_H

#include <stdint.h>

typedef struct devio_pool devio_pool;

/* A job: job_index in [0, n_jobs), thread_index in [0, n_threads) names the
 * thread running it (for per-thread scratch). Jobs of one run may execute
 * in any order and concurrently. */
typedef void (*devio_pool_fn)(void *ctx, uint32_t job_index, uint32_t thread_index);

/* Start n_threads - 1 workers (the caller of devio_pool_run is thread 0).
 * n_threads == 0 is treated as 1. Returns NULL when threads or memory
 * cannot be had. Under DEVIO_NO_THREADS no thread is started and every
 * job runs on the caller. Caller frees with devio_pool_free(). */
devio_pool *devio_pool_create(uint32_t n_threads);

/* Threads the pool runs jobs on, caller included (1 under DEVIO_NO_THREADS). */
uint32_t devio_pool_threads(const devio_pool *pool);

/* Run fn(ctx, j, thread) for every j in [0, n_jobs) and return when all have
 * finished. The caller claims jobs too; a worker that has not woken up by
 * the time the jobs are gone is not waited for. Workers spin briefly after
 * a run before sleeping, because a decode step issues about a hundred short
 * runs back to back. Not reentrant: one run at a time per pool, and fn must
 * not call it. */
void devio_pool_run(devio_pool *pool, uint32_t n_jobs, devio_pool_fn fn, void *ctx);

/* Stop and join the workers, release the pool. pool may be NULL. */
void devio_pool_free(devio_pool *pool);

#endif
