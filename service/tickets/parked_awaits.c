/* parked_awaits.c - the table of parked awaits and the one timer thread that resumes those whose deadline passed.
 * Every change to a wait happens under the table's lock; it must never block on anything but that lock. */
#include <stdint.h>
#include <time.h>

#include "common/clock.h"
#include "device/status.h"
#include "service/tickets/parked_awaits.h"
#include "service/tickets/monotonic_wait.h"

static void unlist(devio_waits *ws, devio_wait *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        ws->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->listed = false;
}

/* Unlist a suspended wait and hand its connection back. Lock held. */
static void wake(devio_waits *ws, devio_wait *w)
{
    unlist(ws, w);
    w->suspended = false;
    ws->n_suspended--;
    ws->ops->resume(w->conn);
}

/* Resume every suspended wait whose deadline passed; sleep until the next. */
static void *timer_main(void *arg)
{
    devio_waits *ws = arg;
    pthread_mutex_lock(&ws->mu);
    while (!ws->closed) {
        int64_t now = (int64_t)devio_clock_us(), due = INT64_MAX;
        for (devio_wait *w = ws->head, *next; w; w = next) {
            next = w->next;
            if (!w->suspended || w->deadline_us < 0)
                continue;
            if (w->deadline_us <= now)
                wake(ws, w);
            else if (w->deadline_us < due)
                due = w->deadline_us;
        }
        ws->timer_due = due;
        if (due == INT64_MAX) {
            pthread_cond_wait(&ws->cv, &ws->mu);
        } else {
            struct timespec at = devio_monotonic_at(due);
            pthread_cond_timedwait(&ws->cv, &ws->mu, &at);
        }
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

devio_status devio_waits_start(devio_waits *ws, const devio_waits_ops *ops, devio_error *err)
{
    *ws = (devio_waits){.ops = ops, .timer_due = INT64_MAX};
    pthread_mutex_init(&ws->mu, NULL);
    devio_cond_init_monotonic(&ws->cv); /* deadlines are devio_clock_us() times */
    if (pthread_create(&ws->timer, NULL, timer_main, ws) != 0) {
        pthread_cond_destroy(&ws->cv);
        pthread_mutex_destroy(&ws->mu);
        return devio_fail(err, DEVIO_E_IO, "cannot start the await timer thread");
    }
    ws->timer_started = true;
    return DEVIO_OK;
}

void devio_waits_close(devio_waits *ws)
{
    pthread_mutex_lock(&ws->mu);
    ws->closed = true;
    for (devio_wait *w = ws->head, *next; w; w = next) {
        next = w->next;
        if (w->suspended)
            wake(ws, w);
    }
    pthread_cond_signal(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
}

void devio_waits_stop(devio_waits *ws)
{
    if (!ws->timer_started)
        return;
    devio_waits_close(ws);
    pthread_join(ws->timer, NULL);
    ws->timer_started = false;
    pthread_cond_destroy(&ws->cv);
    pthread_mutex_destroy(&ws->mu);
}

static void enter(devio_waits *ws, devio_wait *w, devio_wait v)
{
    *w = v;
    w->listed = true;
    pthread_mutex_lock(&ws->mu);
    w->next = ws->head;
    if (ws->head)
        ws->head->prev = w;
    ws->head = w;
    pthread_mutex_unlock(&ws->mu);
}

void devio_waits_enter(devio_waits *ws, devio_wait *w, void *conn, uint64_t ticket,
                       int64_t deadline_us)
{
    enter(ws, w, (devio_wait){.conn = conn, .ticket = ticket, .deadline_us = deadline_us});
}

void devio_waits_enter_write(devio_waits *ws, devio_wait *w, void *conn, uint64_t write)
{
    enter(ws, w, (devio_wait){.conn = conn, .write = write, .deadline_us = -1});
}

devio_wait_park devio_waits_park(devio_waits *ws, devio_wait *w)
{
    devio_wait_park p = DEVIO_WAIT_PARKED;
    pthread_mutex_lock(&ws->mu);
    if (ws->closed || w->woken) {
        p = ws->closed ? DEVIO_WAIT_CLOSED : DEVIO_WAIT_RECHECK;
        if (w->listed)
            unlist(ws, w);
    } else {
        /* Suspended under the lock: a settle cannot resume it before it is. */
        w->suspended = true;
        ws->n_suspended++;
        ws->ops->suspend(w->conn);
        if (w->deadline_us >= 0 && w->deadline_us < ws->timer_due) {
            ws->timer_due = w->deadline_us;
            pthread_cond_signal(&ws->cv);
        }
    }
    pthread_mutex_unlock(&ws->mu);
    return p;
}

void devio_waits_leave(devio_waits *ws, devio_wait *w)
{
    pthread_mutex_lock(&ws->mu);
    if (w->listed)
        unlist(ws, w);
    pthread_mutex_unlock(&ws->mu);
}

/* Resume (or mark woken) every listed wait that `hit` picks. */
static void wake_matching(devio_waits *ws, bool (*hit)(const devio_wait *, uint64_t),
                          uint64_t key)
{
    pthread_mutex_lock(&ws->mu);
    for (devio_wait *w = ws->head, *next; w; w = next) {
        next = w->next;
        if (!hit(w, key))
            continue;
        if (w->suspended)
            wake(ws, w);
        else
            w->woken = true;
    }
    pthread_mutex_unlock(&ws->mu);
}

static bool settles(const devio_wait *w, uint64_t ticket)
{
    return w->write == 0 && w->ticket == ticket;
}

static bool written(const devio_wait *w, uint64_t done)
{
    return w->write != 0 && w->write <= done;
}

void devio_waits_settled(void *ws, uint64_t ticket)
{
    wake_matching(ws, settles, ticket);
}

void devio_waits_written(void *ws, uint64_t done)
{
    wake_matching(ws, written, done);
}

bool devio_waits_watching(devio_waits *ws, uint64_t ticket)
{
    pthread_mutex_lock(&ws->mu);
    bool found = false;
    for (const devio_wait *w = ws->head; w && !found; w = w->next)
        found = settles(w, ticket);
    pthread_mutex_unlock(&ws->mu);
    return found;
}

uint32_t devio_waits_suspended(devio_waits *ws)
{
    pthread_mutex_lock(&ws->mu);
    uint32_t n = ws->n_suspended;
    pthread_mutex_unlock(&ws->mu);
    return n;
}
