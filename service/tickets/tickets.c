/* tickets.c - launch and await with their history rows and metrics; step is the two in a row.
 * A launch or an await answers only once its history row is committed; when the row cannot be written
 * the call answers store_unavailable and the device is as if it had not been made (the ticket stays awaitable). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/tickets/leases.h"
#include "service/tickets/tickets.h"

/* Queue history write n (0: the queue could not take it) and wait for it. */
static bool written(const devio_tickets *t, uint64_t n, devio_error *werr)
{
    if (n == 0) {
        devio_fail(werr, DEVIO_E_IO, "the history write could not be queued");
        return false;
    }
    return devio_store_wait(t->store, n, werr) == DEVIO_OK;
}

static devio_status unwritable(devio_error *err, const char *why)
{
    return devio_fail(err, DEVIO_E_STORE_UNAVAILABLE,
                      "the ticket history cannot be written, nothing was launched: %s", why);
}

devio_status devio_tickets_launch_begin(const devio_tickets *t, devio_device *dev,
                                        const devio_plan *plan, const char *request_id,
                                        const devio_key_record *key, devio_ticket_op *op,
                                        devio_error *err)
{
    devio_store_health h;
    devio_store_health_get(t->store, &h);
    if (!h.writable)
        return unwritable(err, h.reason);
    uint64_t id = 0;
    devio_status st = devio_launch_reserve(dev, plan, &id, err);
    if (st != DEVIO_OK)
        return st;
    devio_ticket_record rec = {.id = id, .status = "in_flight",
                               .launched_ms = devio_unix_ms(), .rows = plan->n_rows,
                               .request_id = request_id};
    /* Without memory for the ids the row is still written, with no seqs. */
    uint64_t *seqs = malloc((plan->n_rows + 1) * sizeof *seqs);
    for (uint32_t i = 0; i < plan->n_rows; i++) {
        rec.tokens += plan->rows[i].n_tokens;
        if (seqs)
            seqs[i] = plan->rows[i].seq;
    }
    rec.seqs = seqs;
    rec.n_seqs = seqs ? plan->n_rows : 0;
    char ref[40];
    devio_key_record krec;
    if (key) {
        snprintf(ref, sizeof ref, "{\"ticket\":%" PRIu64 "}", id);
        krec = *key;
        krec.answer = ref;
        rec.key = &krec;
    }
    uint64_t n = devio_store_ticket_launched(t->store, &rec);
    free(seqs);
    if (n == 0) {
        devio_launch_cancel(dev, id);
        return unwritable(err, "the history write could not be queued");
    }
    op->phase = DEVIO_OP_LAUNCHING;
    op->ticket = id;
    /* Watched from before its commit, so that a settle right after is seen. */
    if (t->leases)
        devio_leases_add(t->leases, id);
    op->write = n;
    op->shape = devio_metrics_shape(plan);
    op->shape.ticket = id;
    return DEVIO_OK;
}

devio_status devio_tickets_launch_end(const devio_tickets *t, devio_device *dev,
                                      devio_ticket_op *op, devio_error *err)
{
    uint64_t id = op->ticket;
    devio_error werr = {0};
    op->phase = DEVIO_OP_NONE;
    /* The device lock was not held while the row was written: launches of
     * other clients reserved meanwhile and their rows shared its transaction. */
    if (!written(t, op->write, &werr)) {
        devio_launch_cancel(dev, id);
        if (t->leases)
            devio_leases_taken(t->leases, id);
        return unwritable(err, werr.message);
    }
    devio_status st = devio_launch_commit(dev, id, err);
    if (st != DEVIO_OK) {
        if (t->leases)
            devio_leases_taken(t->leases, id);
        /* The backend refused the step after its row was written: the row
         * says so (best effort; the store logs a failure itself). */
        devio_ticket_record f = {.id = id, .status = "failed", .settled_ms = devio_unix_ms(),
                                 .error_code = devio_status_str(st),
                                 .error_message = err ? err->message : ""};
        devio_store_ticket_settled(t->store, &f);
        return st;
    }
    devio_metrics_launched(t->metrics, &op->shape);
    op->phase = DEVIO_OP_AWAITING;
    return DEVIO_OK;
}

devio_status devio_tickets_await_begin(const devio_tickets *t, devio_device *dev,
                                       devio_ticket_op *op, int64_t timeout_ms,
                                       const char *reaped, devio_error *err)
{
    bool held = false;
    devio_step_result res;
    devio_error step_err = {0};
    devio_status st = devio_await_begin(dev, op->ticket, timeout_ms, &res, &held, &step_err);
    if (!held) {
        if (err)
            *err = step_err;
        return st; /* pending, consumed, unknown, torn down: nothing to write */
    }
    devio_ticket_record rec = {.id = op->ticket, .settled_ms = devio_unix_ms()};
    if (st == DEVIO_OK) {
        rec.status = "ok";
        rec.queued_us = res.queued_us;
        rec.compute_us = res.compute_us;
    } else {
        rec.status = "failed";
        rec.error_code = devio_status_str(st);
        rec.error_message = step_err.message;
    }
    if (reaped) {
        rec.status = "reaped";
        rec.error_code = devio_status_str(DEVIO_E_TICKET_REAPED);
        rec.error_message = reaped;
    }
    char *answer = st == DEVIO_OK && t->answer ? t->answer(&res) : NULL;
    rec.answer = answer;
    op->write = devio_store_ticket_settled(t->store, &rec);
    op->answer = answer; /* the reply sends these very bytes: encoded once */
    op->phase = DEVIO_OP_SETTLING;
    op->st = st;
    op->err = step_err;
    op->res = res;
    return DEVIO_OK;
}

devio_status devio_tickets_await_end(const devio_tickets *t, devio_device *dev,
                                     devio_ticket_op *op, devio_await_ending how,
                                     devio_step_result *out, devio_error *err)
{
    uint64_t ticket = op->ticket;
    devio_error werr = {0};
    op->phase = DEVIO_OP_NONE;
    if (!written(t, op->write, &werr)) {
        devio_await_end(dev, ticket, DEVIO_AWAIT_KEEP);
        devio_step_result_free(&op->res);
        free(op->answer);
        op->answer = NULL;
        return devio_fail_at(err, DEVIO_E_STORE_UNAVAILABLE, "ticket", (int64_t)ticket,
                             "ticket %" PRIu64 " settled but its result cannot be written to"
                             " the history; it stays awaitable: %s",
                             ticket, werr.message);
    }
    devio_await_end(dev, ticket, how);
    if (t->leases && how != DEVIO_AWAIT_KEEP)
        devio_leases_taken(t->leases, ticket);
    if (how != DEVIO_AWAIT_DROP) /* a reaped ticket is counted by its reaper */
        devio_metrics_settled(t->metrics, ticket, op->st == DEVIO_OK ? &op->res : NULL);
    if (op->st != DEVIO_OK) {
        if (err)
            *err = op->err;
        return op->st;
    }
    *out = op->res;
    op->res = (devio_step_result){0};
    return DEVIO_OK;
}

void devio_tickets_op_release(devio_device *dev, devio_ticket_op *op)
{
    if (op->phase == DEVIO_OP_SETTLING) {
        devio_await_end(dev, op->ticket, DEVIO_AWAIT_KEEP);
        devio_step_result_free(&op->res);
        free(op->answer);
        op->answer = NULL;
        op->phase = DEVIO_OP_AWAITING;
    }
}

/* ---- whole ------------------------------------------------------------------ */

devio_status devio_tickets_launch(const devio_tickets *t, devio_device *dev,
                                  const devio_plan *plan, const char *request_id,
                                  uint64_t *ticket, devio_error *err)
{
    devio_ticket_op op = {0};
    devio_status st = devio_tickets_launch_begin(t, dev, plan, request_id, NULL, &op, err);
    if (st == DEVIO_OK)
        st = devio_tickets_launch_end(t, dev, &op, err);
    if (st == DEVIO_OK)
        *ticket = op.ticket;
    return st;
}

devio_status devio_tickets_await(const devio_tickets *t, devio_device *dev, uint64_t ticket,
                                 int64_t timeout_ms, devio_step_result *out, devio_error *err)
{
    devio_ticket_op op = {.phase = DEVIO_OP_AWAITING, .ticket = ticket};
    memset(out, 0, sizeof *out);
    devio_status st = devio_tickets_await_begin(t, dev, &op, timeout_ms, NULL, err);
    if (st == DEVIO_OK)
        st = devio_tickets_await_end(t, dev, &op, DEVIO_AWAIT_CONSUME, out, err);
    free(op.answer);
    return st;
}

devio_status devio_tickets_step(const devio_tickets *t, devio_device *dev,
                                const devio_plan *plan, const char *request_id,
                                devio_step_result *out, devio_error *err)
{
    uint64_t ticket = 0;
    devio_status st = devio_tickets_launch(t, dev, plan, request_id, &ticket, err);
    return st == DEVIO_OK ? devio_tickets_await(t, dev, ticket, -1, out, err) : st;
}

void devio_tickets_aborted(const devio_tickets *t, uint32_t aborted, const char *reason)
{
    devio_metrics_aborted(t->metrics, aborted);
    devio_error werr = {0};
    if (devio_store_wait(t->store, devio_store_abort_in_flight(t->store, reason), &werr) !=
        DEVIO_OK)
        devio_log(DEVIO_LOG_ERROR, "store", "history write for aborted tickets failed: %s",
                  werr.message);
}
