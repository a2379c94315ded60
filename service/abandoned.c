/* abandoned.c - tickets nobody will take: reaped after their lease or once their /v1/step connection closed, launches finished for a client gone.
 * Runs on the reaper thread (leases.h) or, for what cannot wait, on the thread that saw the connection end; it never blocks an HTTP thread. */
#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "device/status.h"
#include "service/server.h"

static devio_reap reap(void *ctx, uint64_t ticket, bool closed)
{
    devio_server *s = ctx;
    /* An await looking at it now takes the answer itself. */
    if (!closed && devio_waits_watching(&s->waits, ticket))
        return DEVIO_REAP_RETRY;
    devio_device *dev;
    if (devio_server_hold(s, &dev, NULL) != DEVIO_OK)
        return DEVIO_REAP_GONE;
    char why[160];
    if (closed)
        snprintf(why, sizeof why, "the connection of its /v1/step or /v1/launch closed before the"
                                  " answer naming it was sent; the server settled it");
    else
        snprintf(why, sizeof why, "not awaited within the lease of %" PRIu64 " ms after it"
                                  " settled (--ticket-lease-ms); its logits handles were released",
                 s->leases.lease_us / 1000);
    devio_ticket_op op = {.phase = DEVIO_OP_AWAITING, .ticket = ticket};
    devio_error err = {0};
    devio_status st = devio_tickets_await_begin(&s->tickets, dev, &op, 0, why, &err);
    devio_reap r = st == DEVIO_E_TICKET_PENDING ? DEVIO_REAP_RETRY : DEVIO_REAP_GONE;
    if (st == DEVIO_OK) {
        devio_step_result res = {0};
        st = devio_tickets_await_end(&s->tickets, dev, &op, DEVIO_AWAIT_DROP, &res, &err);
        devio_step_result_free(&res);
        free(op.answer);
        /* Unwritten, the ticket stays settled and awaitable: try again. */
        r = st == DEVIO_E_STORE_UNAVAILABLE ? DEVIO_REAP_RETRY : DEVIO_REAP_DONE;
    }
    devio_server_release(s);
    if (r == DEVIO_REAP_DONE) {
        devio_metrics_reaped(&s->metrics, ticket, closed);
        devio_log(DEVIO_LOG_WARN, "reaper", "ticket %" PRIu64 " reaped: %s", ticket, why);
    }
    return r;
}

/* A launch whose client went while its row was written: end it here (the
 * store wait is this thread's), then reap it as a closed step once settled. */
static void finish(void *ctx, devio_ticket_op *op)
{
    devio_server *s = ctx;
    devio_launches_end(s, op);
    if (op->st == DEVIO_OK)
        devio_leases_closed(&s->leases, op->ticket);
}

const devio_leases_ops devio_server_reaper = {.reap = reap, .finish = finish};

void devio_server_abandon(devio_server *s, devio_ticket_op *op)
{
    if (op->counted)
        atomic_fetch_sub(&s->awaiting, 1);
    op->counted = false;
    devio_device *dev;
    /* Unlisted first (under the list's lock): past this the store's writer
     * no longer touches op, and op->phase is its last word. */
    bool listed = devio_launches_untrack(s, op);
    if (listed) {
        /* Its id never reached the client: whatever it computes is nobody's.
         * The reaper waits for its row, then commits it as a closed step. */
        if (!devio_leases_finish(&s->leases, op)) {
            if (devio_server_hold(s, &dev, NULL) == DEVIO_OK) {
                devio_launch_cancel(dev, op->ticket);
                devio_server_release(s);
            }
            devio_leases_taken(&s->leases, op->ticket);
            atomic_fetch_sub(&s->launching, 1);
        }
        op->phase = DEVIO_OP_NONE;
        return;
    }
    switch (op->phase) {
    case DEVIO_OP_NONE:
    case DEVIO_OP_LAUNCHING: /* not listed: its end half has run */
        return;
    case DEVIO_OP_SETTLING:
        /* The answer was taken but not sent: hand it back (its row will be
         * written as taken, then as reaped or taken again). */
        if (devio_server_hold(s, &dev, NULL) == DEVIO_OK) {
            devio_tickets_op_release(dev, op);
            devio_server_release(s);
        } else {
            devio_step_result_free(&op->res);
            free(op->answer);
            op->answer = NULL;
        }
        /* fall through */
    case DEVIO_OP_AWAITING:
        if (op->owned)
            devio_leases_closed(&s->leases, op->ticket);
        break;
    }
    op->phase = DEVIO_OP_NONE;
}

void devio_server_settled(void *ctx, uint64_t ticket)
{
    devio_server *s = ctx;
    devio_waits_settled(&s->waits, ticket);
    devio_leases_settled(&s->leases, ticket);
}
