/* leases.c - the lease table, its reaper thread and the ring of reaped ids.
 * Every change happens under the table's lock; the reaper drops it before it calls the server's ops. */
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "device/status.h"
#include "service/tickets/leases.h"
#include "service/tickets/monotonic_wait.h"

/* A reap that could not finish is tried again this much later. */
#define RETRY_US 1000000

static devio_lease *find(devio_leases *ls, uint64_t ticket)
{
    for (uint32_t i = 0; i < ls->n; i++)
        if (ls->tab[i].ticket == ticket)
            return &ls->tab[i];
    return NULL;
}

static void drop(devio_leases *ls, devio_lease *l)
{
    *l = ls->tab[--ls->n];
}

/* When l falls due: at its settle when its connection closed, a lease after
 * it otherwise, never while it runs or without a lease. Lock held. */
static void schedule(devio_leases *ls, devio_lease *l, int64_t settled_us)
{
    if (!l->settled)
        l->due_us = INT64_MAX;
    else if (l->closed)
        l->due_us = settled_us;
    else
        l->due_us = ls->lease_us ? settled_us + (int64_t)ls->lease_us : INT64_MAX;
    pthread_cond_signal(&ls->cv);
}

/* The first lease due by `now` and not being reaped, or NULL with *next the
 * earliest due time. Lock held. */
static devio_lease *due(devio_leases *ls, int64_t now, int64_t *next)
{
    *next = INT64_MAX;
    for (uint32_t i = 0; i < ls->n; i++) {
        devio_lease *l = &ls->tab[i];
        if (l->busy)
            continue;
        if (l->due_us <= now)
            return l;
        if (l->due_us < *next)
            *next = l->due_us;
    }
    return NULL;
}

/* Reap l with the lock dropped; it stays listed (busy) meanwhile. */
static void reap_one(devio_leases *ls, devio_lease *l)
{
    uint64_t ticket = l->ticket;
    bool closed = l->closed;
    l->busy = true;
    pthread_mutex_unlock(&ls->mu);
    devio_reap r = ls->ops->reap(ls->ctx, ticket, closed);
    pthread_mutex_lock(&ls->mu);
    l = find(ls, ticket); /* the table may have moved */
    if (!l)
        return;
    if (r == DEVIO_REAP_RETRY) {
        l->busy = false;
        l->due_us = (int64_t)devio_clock_us() + RETRY_US;
    } else {
        drop(ls, l);
    }
}

static void *reaper_main(void *arg)
{
    devio_leases *ls = arg;
    pthread_mutex_lock(&ls->mu);
    for (;;) {
        devio_leases_job *job = ls->jobs;
        if (job) {
            ls->jobs = job->next;
            pthread_mutex_unlock(&ls->mu);
            ls->ops->finish(ls->ctx, &job->op);
            free(job);
            pthread_mutex_lock(&ls->mu);
            continue;
        }
        if (ls->stop)
            break;
        int64_t next;
        devio_lease *l = due(ls, (int64_t)devio_clock_us(), &next);
        if (l) {
            reap_one(ls, l);
        } else if (next == INT64_MAX) {
            pthread_cond_wait(&ls->cv, &ls->mu);
        } else {
            struct timespec at = devio_monotonic_at(next);
            pthread_cond_timedwait(&ls->cv, &ls->mu, &at);
        }
    }
    pthread_mutex_unlock(&ls->mu);
    return NULL;
}

devio_status devio_leases_start(devio_leases *ls, uint32_t lease_ms, const devio_leases_ops *ops,
                                void *ctx, devio_error *err)
{
    *ls = (devio_leases){.lease_us = (uint64_t)lease_ms * 1000, .ops = ops, .ctx = ctx};
    pthread_mutex_init(&ls->mu, NULL);
    devio_cond_init_monotonic(&ls->cv); /* due times are devio_clock_us() times */
    if (pthread_create(&ls->thread, NULL, reaper_main, ls) != 0) {
        pthread_cond_destroy(&ls->cv);
        pthread_mutex_destroy(&ls->mu);
        return devio_fail(err, DEVIO_E_IO, "cannot start the ticket reaper thread");
    }
    ls->started = true;
    return DEVIO_OK;
}

void devio_leases_stop(devio_leases *ls)
{
    if (!ls->started)
        return;
    pthread_mutex_lock(&ls->mu);
    ls->stop = true;
    pthread_cond_signal(&ls->cv);
    pthread_mutex_unlock(&ls->mu);
    pthread_join(ls->thread, NULL);
    ls->started = false;
    free(ls->tab);
    ls->tab = NULL;
    ls->n = ls->cap = 0;
    pthread_cond_destroy(&ls->cv);
    pthread_mutex_destroy(&ls->mu);
}

void devio_leases_add(devio_leases *ls, uint64_t ticket)
{
    pthread_mutex_lock(&ls->mu);
    if (ls->n == ls->cap) {
        uint32_t cap = ls->cap ? 2 * ls->cap : 16;
        devio_lease *t = realloc(ls->tab, cap * sizeof *t);
        if (!t) { /* unwatched: its awaits work as before, it is never reaped */
            pthread_mutex_unlock(&ls->mu);
            return;
        }
        ls->tab = t;
        ls->cap = cap;
    }
    ls->tab[ls->n++] = (devio_lease){.ticket = ticket, .due_us = INT64_MAX};
    pthread_mutex_unlock(&ls->mu);
}

void devio_leases_settled(devio_leases *ls, uint64_t ticket)
{
    pthread_mutex_lock(&ls->mu);
    devio_lease *l = find(ls, ticket);
    /* The hook also fires when a held answer is handed back: the lease runs
     * from the first settle. */
    if (l && !l->settled) {
        l->settled = true;
        schedule(ls, l, (int64_t)devio_clock_us());
    }
    pthread_mutex_unlock(&ls->mu);
}

void devio_leases_taken(devio_leases *ls, uint64_t ticket)
{
    pthread_mutex_lock(&ls->mu);
    devio_lease *l = find(ls, ticket);
    if (l && !l->busy)
        drop(ls, l);
    pthread_mutex_unlock(&ls->mu);
}

void devio_leases_closed(devio_leases *ls, uint64_t ticket)
{
    pthread_mutex_lock(&ls->mu);
    devio_lease *l = find(ls, ticket);
    if (l && !l->closed) {
        l->closed = true;
        if (!l->busy)
            schedule(ls, l, (int64_t)devio_clock_us());
    }
    pthread_mutex_unlock(&ls->mu);
}

bool devio_leases_finish(devio_leases *ls, const devio_ticket_op *op)
{
    devio_leases_job *job = malloc(sizeof *job);
    if (!job)
        return false;
    *job = (devio_leases_job){.op = *op};
    pthread_mutex_lock(&ls->mu);
    devio_leases_job **at = &ls->jobs;
    while (*at)
        at = &(*at)->next;
    *at = job;
    pthread_cond_signal(&ls->cv);
    pthread_mutex_unlock(&ls->mu);
    return true;
}

void devio_leases_clear(devio_leases *ls)
{
    pthread_mutex_lock(&ls->mu);
    /* A lease being reaped stays until its reap returns (the device answers GONE). */
    for (uint32_t i = ls->n; i-- > 0;)
        if (!ls->tab[i].busy)
            drop(ls, &ls->tab[i]);
    pthread_mutex_unlock(&ls->mu);
}
