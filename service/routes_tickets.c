/* routes_tickets.c - the step routes (launch, step, await) over service/tickets.c, and the history of GET /v1/tickets.
 * Decode with api/, run the typed step, encode; the history's JSON is spelled here, never in the store.
 * An await never blocks its thread on a step: it parks the connection (service/await_waits.h). */
#include <string.h>

#include "api/codec.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/request.h"
#include "service/routes.h"
#include "service/server.h"

/* Long polls are capped at one hour; clients retry on ticket_pending. */
#define AWAIT_CAP_MS 3600000u

/* The request's plan, sized by the device's limits, then launch (step: and await). */
static devio_status run_plan(devio_server *s, const json_t *body, const char *request_id,
                             bool await_it, uint64_t *ticket, devio_step_result *res,
                             devio_error *err)
{
    devio_device *dev;
    devio_plan_buf buf;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    const devio_config *c = devio_config_of(dev);
    st = devio_json_plan_decode(body, c->max_rows, c->max_batch_tokens, &buf, err);
    if (st == DEVIO_OK) {
        st = await_it
                 ? devio_tickets_step(&s->tickets, dev, &buf.plan, request_id, res, err)
                 : devio_tickets_launch(&s->tickets, dev, &buf.plan, request_id, ticket, err);
        devio_plan_buf_free(&buf);
    }
    devio_server_release(s);
    return st;
}

/* Answer a settled step and free it. */
static devio_status reply_result(devio_reply *out, devio_step_result *res, devio_error *err)
{
    devio_status st = devio_reply_json(out, 200, devio_json_step_result(res), err);
    devio_step_result_free(res);
    return st;
}

devio_status devio_route_launch(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    uint64_t ticket = 0;
    devio_status st = run_plan(s, rq->body, rq->request_id, false, &ticket, NULL, err);
    return st == DEVIO_OK ? devio_reply_json(out, 202, devio_json_ticket_ref(ticket), err) : st;
}

/* The handler runs again after its connection was parked and resumed: the
 * wait then holds the ticket and the deadline of the first call. */
static bool resumed(const devio_request *rq)
{
    return rq->wait && rq->wait->conn;
}

/* One look at the ticket, without waiting. */
static devio_status await_now(devio_server *s, uint64_t ticket, int64_t timeout_ms,
                              devio_step_result *res, devio_error *err)
{
    devio_device *dev;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = devio_tickets_await(&s->tickets, dev, ticket, timeout_ms, res, err);
    devio_server_release(s);
    return st;
}

/* Look at the ticket until it answers, the deadline passes or the connection parks. */
static devio_status await_look(devio_server *s, const devio_request *rq, uint64_t ticket,
                               int64_t deadline_us, devio_step_result *res, devio_reply *out,
                               devio_error *err)
{
    devio_wait *w = rq->wait;
    for (;;) {
        /* Listed before the look, so that a settle after it is not missed. */
        devio_waits_enter(&s->waits, w, rq->conn, ticket, deadline_us);
        devio_status st = await_now(s, ticket, 0, res, err);
        if (st != DEVIO_E_TICKET_PENDING ||
            (deadline_us >= 0 && (int64_t)devio_clock_us() >= deadline_us)) {
            devio_waits_leave(&s->waits, w);
            return st;
        }
        switch (devio_waits_park(&s->waits, w)) {
        case DEVIO_WAIT_PARKED:
            out->suspended = true;
            return DEVIO_OK;
        case DEVIO_WAIT_RECHECK:
            continue;
        case DEVIO_WAIT_CLOSED:
            return devio_fail(err, DEVIO_E_TORN_DOWN, "server stopped");
        }
    }
}

/* The await's wait, without holding a thread: look at the ticket; while it
 * is pending and the deadline is ahead, park the connection until the step
 * settles or the deadline passes, then look again (the handler runs anew).
 * s->awaiting counts the request from its first look to its answer. */
static devio_status await_parked(devio_server *s, const devio_request *rq, uint64_t ticket,
                                 int64_t deadline_us, devio_step_result *res, devio_reply *out,
                                 devio_error *err)
{
    devio_wait *w = rq->wait;
    if (!w->conn)
        atomic_fetch_add(&s->awaiting, 1);
    devio_status st = await_look(s, rq, ticket, deadline_us, res, out, err);
    if (!out->suspended)
        atomic_fetch_sub(&s->awaiting, 1);
    return st;
}

devio_status devio_route_await(devio_server *s, const devio_request *rq, devio_reply *out,
                               devio_error *err)
{
    devio_step_result res;
    devio_status st;
    if (resumed(rq)) {
        st = await_parked(s, rq, rq->wait->ticket, rq->wait->deadline_us, &res, out, err);
    } else {
        uint64_t t = 0;
        bool present = false;
        st = devio_request_query_u64(rq, "timeout_ms", &t, &present, err);
        if (st != DEVIO_OK)
            return st;
        int64_t timeout = present ? (int64_t)(t > AWAIT_CAP_MS ? AWAIT_CAP_MS : t) : -1;
        if (rq->wait)
            st = await_parked(s, rq, rq->params.id,
                              timeout < 0 ? -1 : (int64_t)devio_clock_us() + timeout * 1000,
                              &res, out, err);
        else
            st = await_now(s, rq->params.id, timeout, &res, err);
    }
    if (st != DEVIO_OK || out->suspended)
        return st;
    return reply_result(out, &res, err);
}

devio_status devio_route_step(devio_server *s, const devio_request *rq, devio_reply *out,
                              devio_error *err)
{
    devio_step_result res;
    devio_status st;
    uint64_t ticket = 0;
    if (resumed(rq)) {
        st = await_parked(s, rq, rq->wait->ticket, -1, &res, out, err);
    } else if (rq->wait) {
        st = run_plan(s, rq->body, rq->request_id, false, &ticket, NULL, err);
        if (st == DEVIO_OK)
            st = await_parked(s, rq, ticket, -1, &res, out, err);
    } else {
        st = run_plan(s, rq->body, rq->request_id, true, NULL, &res, err);
    }
    if (st != DEVIO_OK || out->suspended)
        return st;
    return reply_result(out, &res, err);
}

/* ---- history ------------------------------------------------------------------ */

static json_t *int_or_null(bool has, uint64_t v)
{
    return has ? json_integer((json_int_t)v) : json_null();
}

static json_t *ticket_row_json(const devio_ticket_row *t)
{
    json_t *seqs = json_array();
    for (uint32_t i = 0; seqs && i < t->n_seqs; i++)
        if (json_array_append_new(seqs, json_integer((json_int_t)t->seqs[i])) != 0) {
            json_decref(seqs);
            seqs = NULL;
        }
    json_t *error = t->error_code ? json_pack("{s:s,s:s}", "code", t->error_code, "message",
                                              t->error_message ? t->error_message : "")
                                  : json_null();
    return json_pack("{s:I,s:I,s:s,s:I,s:o,s:I,s:I,s:o,s:o,s:o,s:o,s:o}", "id", (json_int_t)t->id,
                     "epoch", (json_int_t)t->epoch, "status", t->status, "launched_ms",
                     (json_int_t)t->launched_ms, "settled_ms",
                     int_or_null(t->has_settled_ms, (uint64_t)t->settled_ms), "rows",
                     (json_int_t)t->rows, "tokens", (json_int_t)t->tokens, "seqs", seqs,
                     "queued_us", int_or_null(t->has_queued_us, t->queued_us), "compute_us",
                     int_or_null(t->has_compute_us, t->compute_us), "error", error,
                     "request_id", t->request_id ? json_string(t->request_id) : json_null());
}

/* {"tickets":[...], "next": id|null} */
static json_t *ticket_page_json(const devio_ticket_page *p)
{
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < p->n; i++)
        if (json_array_append_new(list, ticket_row_json(&p->rows[i])) != 0) {
            json_decref(list);
            list = NULL;
        }
    return json_pack("{s:o,s:o}", "tickets", list, "next", int_or_null(p->has_next, p->next));
}

devio_status devio_route_tickets(devio_server *s, const devio_request *rq, devio_reply *out,
                                 devio_error *err)
{
    devio_ticket_query q = {.limit = 50};
    uint64_t limit = q.limit, since = 0, until = 0;
    bool present;
    devio_status st = devio_request_query_u64(rq, "limit", &limit, &present, err);
    if (st == DEVIO_OK)
        st = devio_request_query_u64(rq, "before", &q.before_id, &present, err);
    if (st == DEVIO_OK)
        st = devio_request_query_u64(rq, "since_ms", &since, &present, err);
    if (st == DEVIO_OK)
        st = devio_request_query_u64(rq, "until_ms", &until, &present, err);
    if (st != DEVIO_OK)
        return st;
    q.limit = limit > UINT32_MAX ? UINT32_MAX : (uint32_t)limit;
    q.since_ms = (int64_t)since;
    q.until_ms = (int64_t)until;
    q.status = devio_request_query(rq, "status");
    devio_ticket_page page;
    st = devio_store_tickets_query(s->store, &q, &page, err);
    if (st != DEVIO_OK)
        return st;
    st = devio_reply_json(out, 200, ticket_page_json(&page), err);
    devio_ticket_page_free(&page);
    return st;
}
