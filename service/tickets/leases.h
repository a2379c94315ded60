/* leases.h - ticket leases: every launched ticket is watched until an await takes its answer; the reaper thread settles, for nobody, those whose lease ran out or whose /v1/step connection closed, and finishes launches whose connection closed mid-way.
 * It never calls the device or the store itself: the server's ops do, on the reaper thread, never on an HTTP thread. */
#ifndef DEVIO_LEASES_H
#define DEVIO_LEASES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "service/tickets/tickets.h"

/* What the reaper calls (on its thread, without the table's lock). */
typedef enum devio_reap {
    DEVIO_REAP_DONE = 0, /* settled for nobody: the ticket is gone */
    DEVIO_REAP_GONE,     /* an await took it first, or the device is down: forget it */
    DEVIO_REAP_RETRY,    /* not now (its row could not be written, an await is looking) */
} devio_reap;

typedef struct devio_leases_ops {
    /* Settle `ticket` for nobody. closed: its /v1/step connection closed;
     * else its lease ran out. */
    devio_reap (*reap)(void *ctx, uint64_t ticket, bool closed);
    /* End a launch whose connection closed while its row was being written
     * (op LAUNCHING, owned by the callee for the call): commit or cancel. */
    void (*finish)(void *ctx, devio_ticket_op *op);
} devio_leases_ops;

typedef struct devio_lease {
    uint64_t ticket;
    int64_t due_us;   /* devio_clock_us() time to reap at; INT64_MAX: not due */
    bool settled, closed, busy;
} devio_lease;

typedef struct devio_leases_job {
    struct devio_leases_job *next;
    devio_ticket_op op;
} devio_leases_job;

typedef struct devio_leases {
    uint64_t lease_us;            /* 0: tickets are never reaped for their lease */
    const devio_leases_ops *ops;  /* borrowed, static */
    void *ctx;                    /* borrowed: the server */
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* the reaper: an earlier due time, a job, or stop */
    pthread_t thread;
    bool started, stop;
    devio_lease *tab;             /* owned; n used of cap */
    uint32_t n, cap;
    devio_leases_job *jobs;       /* owned; finished in order */
} devio_leases;

/* Start the table and its reaper thread. lease_ms 0: no lease (tickets of
 * closed /v1/step connections are still reaped). */
devio_status devio_leases_start(devio_leases *ls, uint32_t lease_ms, const devio_leases_ops *ops,
                                void *ctx, devio_error *err);
/* Finish the queued jobs, stop the thread, free the table. Idempotent. */
void devio_leases_stop(devio_leases *ls);

/* `ticket` was launched: watch it. */
void devio_leases_add(devio_leases *ls, uint64_t ticket);
/* `ticket` settled (the device's on_settled hook): its lease starts. */
void devio_leases_settled(devio_leases *ls, uint64_t ticket);
/* An await took `ticket`'s answer: forget it. */
void devio_leases_taken(devio_leases *ls, uint64_t ticket);
/* The /v1/step that launched `ticket` lost its connection: reap it as soon
 * as it has settled. */
void devio_leases_closed(devio_leases *ls, uint64_t ticket);
/* Queue an op abandoned while LAUNCHING for the reaper to finish (copied).
 * False when out of memory: the caller cancels the launch. */
bool devio_leases_finish(devio_leases *ls, const devio_ticket_op *op);
/* Forget every ticket (teardown aborted them). */
void devio_leases_clear(devio_leases *ls);

#endif
