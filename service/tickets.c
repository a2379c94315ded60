/* tickets.c - launch and await with their history rows and metrics; step is the two in a row.
 * A history write never takes an answer from the client: it is waited for, and logged when it fails. */
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "service/tickets.h"

/* Wait for history write n; a failure is logged, the answer stands. */
static void wait_logged(const devio_tickets *t, uint64_t n, uint64_t ticket)
{
    devio_error werr = {0};
    if (devio_store_wait(t->store, n, &werr) != DEVIO_OK)
        fprintf(stderr, "devio-server: history write for ticket %llu failed: %s\n",
                (unsigned long long)ticket, werr.message);
}

devio_status devio_tickets_launch(const devio_tickets *t, devio_device *dev,
                                  const devio_plan *plan, uint64_t *ticket, devio_error *err)
{
    devio_status st = devio_launch(dev, plan, ticket, err);
    if (st != DEVIO_OK)
        return st;
    devio_metrics_launched(t->metrics, *ticket, plan);
    devio_ticket_record rec = {.id = *ticket, .status = "in_flight",
                               .launched_ms = devio_unix_ms(), .rows = plan->n_rows};
    /* Without memory for the ids the row is still written, with no seqs. */
    uint64_t *seqs = malloc((plan->n_rows + 1) * sizeof *seqs);
    for (uint32_t i = 0; i < plan->n_rows; i++) {
        rec.tokens += plan->rows[i].n_tokens;
        if (seqs)
            seqs[i] = plan->rows[i].seq;
    }
    rec.seqs = seqs;
    rec.n_seqs = seqs ? plan->n_rows : 0;
    wait_logged(t, devio_store_ticket_launched(t->store, &rec), *ticket);
    free(seqs);
    return DEVIO_OK;
}

devio_status devio_tickets_await(const devio_tickets *t, devio_device *dev, uint64_t ticket,
                                 int64_t timeout_ms, devio_step_result *out, devio_error *err)
{
    devio_status st = devio_await(dev, ticket, timeout_ms, out, err);
    if (st == DEVIO_E_TICKET_PENDING || st == DEVIO_E_TICKET_CONSUMED ||
        st == DEVIO_E_UNKNOWN_TICKET || st == DEVIO_E_TORN_DOWN)
        return st;
    devio_ticket_record rec = {.id = ticket, .settled_ms = devio_unix_ms()};
    if (st == DEVIO_OK) {
        rec.status = "ok";
        rec.queued_us = out->queued_us;
        rec.compute_us = out->compute_us;
        devio_metrics_settled(t->metrics, ticket, out);
    } else {
        rec.status = "failed";
        rec.error_code = devio_status_str(st);
        rec.error_message = err ? err->message : "";
        devio_metrics_settled(t->metrics, ticket, NULL);
    }
    wait_logged(t, devio_store_ticket_settled(t->store, &rec), ticket);
    return st;
}

devio_status devio_tickets_step(const devio_tickets *t, devio_device *dev,
                                const devio_plan *plan, devio_step_result *out,
                                devio_error *err)
{
    uint64_t ticket = 0;
    devio_status st = devio_tickets_launch(t, dev, plan, &ticket, err);
    return st == DEVIO_OK ? devio_tickets_await(t, dev, ticket, -1, out, err) : st;
}

void devio_tickets_aborted(const devio_tickets *t, uint32_t aborted, const char *reason)
{
    devio_metrics_aborted(t->metrics, aborted);
    devio_error werr = {0};
    if (devio_store_wait(t->store, devio_store_abort_in_flight(t->store, reason), &werr) !=
        DEVIO_OK)
        fprintf(stderr, "devio-server: history write for aborted tickets failed: %s\n",
                werr.message);
}
