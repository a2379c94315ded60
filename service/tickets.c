/* tickets.c - launch and await with their history rows and metrics; step is the two in a row.
 * A launch or an await answers only once its history row is committed; when the row cannot be written
 * the call answers store_unavailable and the device is as if it had not been made (the ticket stays awaitable). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/tickets.h"

/* Queue history write n (0: the queue could not take it) and wait for it. */
static bool written(const devio_tickets *t, uint64_t n, devio_error *werr)
{
    if (n == 0) {
        devio_fail(werr, DEVIO_E_IO, "the history write could not be queued");
        return false;
    }
    return devio_store_wait(t->store, n, werr) == DEVIO_OK;
}

devio_status devio_tickets_launch(const devio_tickets *t, devio_device *dev,
                                  const devio_plan *plan, const char *request_id,
                                  uint64_t *ticket, devio_error *err)
{
    devio_store_health h;
    devio_store_health_get(t->store, &h);
    if (!h.writable)
        return devio_fail(err, DEVIO_E_STORE_UNAVAILABLE,
                          "the ticket history cannot be written, nothing was launched: %s",
                          h.reason);
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
    devio_error werr = {0};
    /* The device lock is not held here: launches of other clients reserve
     * meanwhile and their rows share this one's transaction. */
    bool ok = written(t, devio_store_ticket_launched(t->store, &rec), &werr);
    free(seqs);
    if (!ok) {
        devio_launch_cancel(dev, id);
        return devio_fail(err, DEVIO_E_STORE_UNAVAILABLE,
                          "the ticket history cannot be written, nothing was launched: %s",
                          werr.message);
    }
    st = devio_launch_commit(dev, id, err);
    if (st != DEVIO_OK) {
        /* The backend refused the step after its row was written: the row
         * says so (best effort; the store logs a failure itself). */
        devio_ticket_record f = {.id = id, .status = "failed", .settled_ms = devio_unix_ms(),
                                 .error_code = devio_status_str(st),
                                 .error_message = err ? err->message : ""};
        written(t, devio_store_ticket_settled(t->store, &f), &werr);
        return st;
    }
    devio_metrics_launched(t->metrics, id, plan);
    *ticket = id;
    return DEVIO_OK;
}

devio_status devio_tickets_await(const devio_tickets *t, devio_device *dev, uint64_t ticket,
                                 int64_t timeout_ms, devio_step_result *out, devio_error *err)
{
    bool held = false;
    devio_status st = devio_await_begin(dev, ticket, timeout_ms, out, &held, err);
    if (!held)
        return st; /* pending, consumed, unknown, torn down: nothing to write */
    devio_ticket_record rec = {.id = ticket, .settled_ms = devio_unix_ms()};
    if (st == DEVIO_OK) {
        rec.status = "ok";
        rec.queued_us = out->queued_us;
        rec.compute_us = out->compute_us;
    } else {
        rec.status = "failed";
        rec.error_code = devio_status_str(st);
        rec.error_message = err ? err->message : "";
    }
    devio_error werr = {0};
    if (!written(t, devio_store_ticket_settled(t->store, &rec), &werr)) {
        devio_await_end(dev, ticket, false);
        if (st == DEVIO_OK)
            devio_step_result_free(out);
        return devio_fail_at(err, DEVIO_E_STORE_UNAVAILABLE, "ticket", (int64_t)ticket,
                             "ticket %" PRIu64 " settled but its result cannot be written to"
                             " the history; it stays awaitable: %s",
                             ticket, werr.message);
    }
    devio_await_end(dev, ticket, true);
    devio_metrics_settled(t->metrics, ticket, st == DEVIO_OK ? out : NULL);
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
