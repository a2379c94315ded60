/* offload.h - requests that may wait (on the device or on SQLite) run here, on worker threads, while their connection is set aside.
 * It runs jobs and nothing else: it never touches a connection, the device or the store itself. */
#ifndef DEVIO_OFFLOAD_H
#define DEVIO_OFFLOAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

/* One job. It lives in the caller's per-request state, which must outlive
 * the run (the server keeps a request's state until its connection, set
 * aside while the job runs, is resumed by the job itself). */
typedef struct devio_offload_job {
    struct devio_offload_job *next;
    void (*run)(struct devio_offload_job *job); /* on a worker; may block for as long as it needs */
} devio_offload_job;

/* Workers are started as jobs need them, up to `max`, and kept; a job that
 * finds every worker busy and `max` running waits in order. */
typedef struct devio_offload {
    pthread_mutex_t mu;
    pthread_cond_t work;
    devio_offload_job *head, *tail;
    pthread_t *threads; /* owned: max of them */
    uint32_t max, n, idle;
    bool stopping;
} devio_offload;

/* Start with one worker (so that a machine that cannot start one is told at
 * start, not at the first request). */
devio_status devio_offload_start(devio_offload *o, uint32_t max, devio_error *err);
/* Queue job. Never fails: with no worker able to run it (none could be
 * started) it runs on the caller's thread before this returns. */
void devio_offload_submit(devio_offload *o, devio_offload_job *job);
/* Run every queued job, stop the workers and free what start made. */
void devio_offload_stop(devio_offload *o);

#endif
