/* ticket_replay.c - answers read again from the history: a keyed launch or step
 * retried (keys.c), and an await of a ticket this process cannot answer from
 * the device (routes_tickets.c). Reads the store; never runs a step. */
#include "service/routes/ticket_replay.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "device/status.h"
#include "service/http/request.h"
#include "service/server.h"

/* 200 with an answer the history kept, byte for byte: Idempotent-Replayed. */
static devio_status replay_answer(devio_reply *out, const char *answer, devio_error *err)
{
    size_t n = strlen(answer);
    char *body = malloc(n + 1);
    if (!body)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    memcpy(body, answer, n + 1);
    devio_reply_bytes(out, 200, "application/json", body, n);
    out->replayed = true;
    return DEVIO_OK;
}

devio_status devio_ticket_from_history(devio_server *s, uint64_t ticket, devio_status st,
                                 devio_reply *out, devio_error *err)
{
    devio_error herr = {0};
    devio_ticket_page p = {0};
    devio_status hs = devio_store_ticket_get(s->store, ticket, &p, &herr);
    if (hs != DEVIO_OK || p.n == 0) {
        devio_ticket_page_free(&p);
        return st;
    }
    const devio_ticket_row *row = &p.rows[0];
    if (strcmp(row->status, "ok") == 0 && row->answer) {
        st = replay_answer(out, row->answer, err);
    } else if (strcmp(row->status, "failed") == 0) {
        st = devio_fail_at(err, devio_status_parse(row->error_code), "ticket", (int64_t)ticket,
                           "%s", row->error_message ? row->error_message : "");
    } else if (strcmp(row->status, "reaped") == 0) {
        st = devio_fail_at(err, DEVIO_E_TICKET_REAPED, "ticket", (int64_t)ticket,
                           "ticket %" PRIu64 " was settled by the server for nobody: %s%s",
                           ticket, row->error_message ? row->error_message : "",
                           row->answer ? "; its answer is in GET /v1/tickets/{id}" : "");
    } else if (strcmp(row->status, "aborted") == 0) {
        st = devio_fail_at(err, DEVIO_E_UNKNOWN_TICKET, "ticket", (int64_t)ticket,
                           "ticket %" PRIu64 " was aborted: %s", ticket,
                           row->error_message ? row->error_message : "");
    }
    devio_ticket_page_free(&p);
    return st;
}

devio_status devio_ticket_replay(devio_server *s, uint64_t ticket, bool launch, devio_reply *out,
                                 bool *found, devio_error *err)
{
    devio_ticket_page p = {0};
    devio_status st = devio_store_ticket_get(s->store, ticket, &p, err);
    *found = st == DEVIO_OK && p.n == 1;
    if (!*found) {
        devio_ticket_page_free(&p);
        return st;
    }
    const devio_ticket_row *row = &p.rows[0];
    if (launch) {
        st = devio_reply_json(out, 202, devio_json_ticket_ref(ticket), err);
    } else if (strcmp(row->status, "in_flight") == 0) {
        out->retry_after_s = 1;
        st = devio_fail_at(err, DEVIO_E_KEY_IN_USE, "ticket", (int64_t)ticket,
                           "the step of this Idempotency-Key (ticket %" PRIu64 ") is still "
                           "running; ask again",
                           ticket);
    } else if (row->answer) {
        /* ok, or reaped when its client went: the answer it settled with */
        st = replay_answer(out, row->answer, err);
    } else {
        st = devio_ticket_from_history(s, ticket, DEVIO_E_UNKNOWN_TICKET, out, err);
    }
    out->replayed = st == DEVIO_OK;
    devio_ticket_page_free(&p);
    return st;
}
