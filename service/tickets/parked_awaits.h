/* parked_awaits.h - awaits parked off the HTTP threads: connections waiting for a ticket, resumed when it settles or their deadline passes.
 * It never calls the device and never answers a request: it only suspends and resumes connections through the ops it is given. */
#ifndef DEVIO_PARKED_AWAITS_H
#define DEVIO_PARKED_AWAITS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

/* How a connection is put aside and brought back (libmicrohttpd's suspend
 * and resume in the server; recorders in tests). Both are called with the
 * table's lock held and must not call back into the table. */
typedef struct devio_waits_ops {
    void (*suspend)(void *conn); /* on the handler's thread, inside devio_waits_park */
    void (*resume)(void *conn);  /* on the settling, timer or closing thread; once per suspend */
} devio_waits_ops;

/* One await's place in the table. It lives in the caller's per-request
 * state, which must outlive its listing (a suspended connection is never
 * completed, so its state stays until it is resumed). */
typedef struct devio_wait {
    void *conn;
    uint64_t ticket;
    uint64_t write;             /* > 0: waits for this history write instead of a settle */
    int64_t deadline_us;        /* devio_clock_us() time to give up at; < 0: none */
    bool listed, suspended;
    bool woken;                 /* the ticket settled between enter and park */
    struct devio_wait *prev, *next;
} devio_wait;

typedef struct devio_waits {
    const devio_waits_ops *ops; /* borrowed, static */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* the timer: a nearer deadline, or closing */
    pthread_t timer;
    bool timer_started;
    bool closed;                /* devio_waits_close ran: nothing parks any more */
    devio_wait *head;           /* listed waits, newest first */
    uint32_t n_suspended;
    int64_t timer_due;          /* the deadline the timer sleeps until; INT64_MAX: none */
} devio_waits;

/* Start the table and its timer thread. */
devio_status devio_waits_start(devio_waits *ws, const devio_waits_ops *ops, devio_error *err);
/* Resume every suspended wait and refuse further parks (DEVIO_WAIT_CLOSED).
 * Idempotent; the table stays usable for enter, leave and settled. */
void devio_waits_close(devio_waits *ws);
/* Close, stop the timer, free what start made. No wait may be listed after. */
void devio_waits_stop(devio_waits *ws);

/* List w for `ticket` before the ticket is looked at, so that a settle
 * between the look and devio_waits_park is not missed. */
void devio_waits_enter(devio_waits *ws, devio_wait *w, void *conn, uint64_t ticket,
                       int64_t deadline_us);

/* List w for history write `write` (> 0) before devio_store_done is asked,
 * so that a batch written between the look and the park is not missed. No
 * deadline: the writer always finishes a write, committed or failed. */
void devio_waits_enter_write(devio_waits *ws, devio_wait *w, void *conn, uint64_t write);

typedef enum devio_wait_park {
    DEVIO_WAIT_PARKED = 0, /* suspended: return without an answer; resume comes once */
    DEVIO_WAIT_RECHECK,    /* the ticket settled meanwhile: unlisted, look again */
    DEVIO_WAIT_CLOSED,     /* the table is closed: unlisted, answer now */
} devio_wait_park;

/* The look found the ticket pending: suspend w's connection unless it was
 * woken meanwhile or the table is closed. */
devio_wait_park devio_waits_park(devio_waits *ws, devio_wait *w);

/* Unlist w (the answer is decided). A wait not listed is left alone. */
void devio_waits_leave(devio_waits *ws, devio_wait *w);

/* `ticket` settled: resume its suspended waits (unlisting them), mark the
 * others woken. The device's on_settled hook. */
void devio_waits_settled(void *ws, uint64_t ticket);

/* Every history write <= done is done: resume the waits for one of them,
 * mark the others woken. The store's on_written hook. */
void devio_waits_written(void *ws, uint64_t done);

/* Whether a wait for `ticket`'s settle is listed (an await is looking). */
bool devio_waits_watching(devio_waits *ws, uint64_t ticket);

/* Waits suspended now. */
uint32_t devio_waits_suspended(devio_waits *ws);

#endif
