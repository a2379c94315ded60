/* routes_tickets.c - the step routes (launch, step, await) over service/tickets/tickets.c, and the history of GET /v1/tickets.
 * Decode with api/ (a plan through devio_plan_run), run the typed step, encode; the history's JSON is spelled here, never in the store.
 * No handler blocks its thread on a step or on the history: it parks the connection (service/tickets/parked_awaits.h)
 * until the step settles or its history row is written, and runs again. */
#include <inttypes.h>
#include <string.h>

#include "api/codec.h"
#include "api/plan_run.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/http/request.h"
#include "service/routes/route_handlers.h"
#include "service/routes/ticket_replay.h"
#include "service/server.h"

/* Long polls are capped at one hour; clients ask again while pending. */
#define AWAIT_CAP_MS 3600000u

/* Wait without a thread until `done` says so: park the connection until the
 * store's writer has written rq->op->write. True: parked (answer nothing
 * now); false: done, or the server is stopping or the request cannot park
 * (the caller then ends the op on this thread). */
static bool parked_until(devio_server *s, const devio_request *rq, devio_reply *out,
                         bool (*done)(devio_server *, devio_ticket_op *))
{
    devio_wait *w = rq->wait;
    if (!w)
        return false;
    for (;;) {
        /* Listed before the look, so that a batch written after it is not missed. */
        devio_waits_enter_write(&s->waits, w, rq->conn, rq->op->write);
        if (done(s, rq->op)) {
            devio_waits_leave(&s->waits, w);
            return false;
        }
        switch (devio_waits_park(&s->waits, w)) {
        case DEVIO_WAIT_PARKED:
            out->suspended = true;
            return true;
        case DEVIO_WAIT_RECHECK:
            continue;
        case DEVIO_WAIT_CLOSED:
            return false;
        }
    }
}

static bool row_written(devio_server *s, devio_ticket_op *op)
{
    return devio_store_done(s->store, op->write);
}

/* The store's writer ended the launch (launches.c). */
static bool launch_ended(devio_server *s, devio_ticket_op *op)
{
    return !devio_launches_pending(s, op);
}

/* What launch_begin hands devio_plan_run: the plan's start in the server. */
typedef struct launch_ctx {
    devio_server *s;
    const devio_request *rq;
} launch_ctx;

/* The decoded plan's launch begun with its history row: op LAUNCHING.
 * Counted in s->launching until its end half runs. */
static devio_status start_ticket(void *ctx, devio_device *dev, const devio_plan *plan,
                                 devio_error *err)
{
    const launch_ctx *l = ctx;
    devio_server *s = l->s;
    devio_status st;
    atomic_fetch_add(&s->launching, 1);
    if (atomic_load(&s->tearing))
        st = devio_fail(err, DEVIO_E_TORN_DOWN, "the device is being torn down");
    else {
        devio_key_record key;
        bool keyed = devio_keyed_launch_key(l->rq->keyed, &key);
        st = devio_tickets_launch_begin(&s->tickets, dev, plan, l->rq->request_id,
                                        keyed ? &key : NULL, l->rq->op, err);
        if (st == DEVIO_OK && keyed)
            devio_keyed_launched(s, l->rq->keyed, l->rq->op->write);
    }
    if (st != DEVIO_OK)
        atomic_fetch_sub(&s->launching, 1);
    return st;
}

/* The request's plan, sized by the device's limits, then its launch begun
 * (start_ticket), by the plan runner the in-process target uses too. */
static devio_status launch_begin(devio_server *s, const devio_request *rq, devio_error *err)
{
    devio_device *dev;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    launch_ctx l = {.s = s, .rq = rq};
    st = devio_plan_run(dev, rq->body, start_ticket, &l, err);
    devio_server_release(s);
    if (st == DEVIO_OK)
        devio_launches_track(s, rq->op);
    return st;
}

/* The launch's outcome once its end half ran: the writer's, or this
 * thread's when the request could not park (waiting here for the row). */
static devio_status launch_outcome(devio_server *s, devio_ticket_op *op, devio_error *err)
{
    if (devio_launches_untrack(s, op))
        devio_launches_end(s, op);
    if (op->st != DEVIO_OK && err)
        *err = op->err;
    return op->st;
}

/* One look at the ticket, without waiting: op SETTLING once it settled.
 * (A ticket already taken, by an await or the reaper, is the history's to
 * answer: devio_ticket_from_history.) */
static devio_status await_now(devio_server *s, devio_ticket_op *op, devio_error *err)
{
    devio_device *dev;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = devio_tickets_await_begin(&s->tickets, dev, op, 0, NULL, err);
    devio_server_release(s);
    return st;
}

/* Look at the ticket until it settles (op SETTLING), the deadline passes or
 * the connection parks. */
static devio_status await_look(devio_server *s, const devio_request *rq, devio_reply *out,
                               devio_error *err)
{
    devio_wait *w = rq->wait;
    devio_ticket_op *op = rq->op;
    for (;;) {
        if (w) /* listed before the look, so that a settle after it is not missed */
            devio_waits_enter(&s->waits, w, rq->conn, op->ticket, op->deadline_us);
        devio_status st = await_now(s, op, err);
        if (!w || st != DEVIO_E_TICKET_PENDING ||
            (op->deadline_us >= 0 && (int64_t)devio_clock_us() >= op->deadline_us)) {
            if (w)
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

/* The end half of an await whose settled row is written. */
static devio_status await_end(devio_server *s, devio_ticket_op *op, devio_step_result *res,
                              devio_error *err)
{
    devio_device *dev;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK) {
        devio_step_result_free(&op->res);
        free(op->answer);
        op->answer = NULL;
        op->phase = DEVIO_OP_NONE;
        return st;
    }
    st = devio_tickets_await_end(&s->tickets, dev, op, DEVIO_AWAIT_CONSUME, res, err);
    devio_server_release(s);
    return st;
}

/* Take rq->op as far as it goes without waiting on a thread: the launch's
 * row (LAUNCHING), then, when `settle`, the step (AWAITING) and its row
 * (SETTLING). DEVIO_OK with out->suspended: parked, the handler runs again
 * with the same op; DEVIO_OK otherwise: *res is the step's result (settle)
 * or op->ticket the launched ticket. s->awaiting counts the request from its
 * first look at the ticket to its answer. */
static devio_status drive(devio_server *s, const devio_request *rq, bool settle,
                          devio_step_result *res, devio_reply *out, devio_error *err)
{
    devio_ticket_op *op = rq->op;
    devio_status st = DEVIO_OK;
    while (st == DEVIO_OK && !out->suspended) {
        switch (devio_launches_phase(s, op)) {
        case DEVIO_OP_LAUNCHING:
            if (parked_until(s, rq, out, launch_ended))
                break;
            st = launch_outcome(s, op, err);
            if (st == DEVIO_OK && !settle)
                return DEVIO_OK;
            break;
        case DEVIO_OP_AWAITING:
            if (!settle)
                return DEVIO_OK; /* launched: ended by the store's writer while parked */
            if (!op->counted) {
                op->counted = true;
                atomic_fetch_add(&s->awaiting, 1);
            }
            st = await_look(s, rq, out, err);
            break;
        case DEVIO_OP_SETTLING:
            if (parked_until(s, rq, out, row_written))
                break;
            return await_end(s, op, res, err);
        case DEVIO_OP_NONE:
            /* The store's writer ended the launch while parked, and it failed. */
            if (op->st != DEVIO_OK && err)
                *err = op->err;
            return op->st;
        }
    }
    return st;
}

/* The answer is decided: the request no longer counts among awaits under way. */
static void uncount(devio_server *s, devio_ticket_op *op)
{
    if (op->counted)
        atomic_fetch_sub(&s->awaiting, 1);
    op->counted = false;
}

/* Answer a settled step and free it: the answer text the history keeps
 * when there is one (the same bytes a replay sends), else encoded now. */
static devio_status reply_result(devio_reply *out, devio_ticket_op *op, devio_step_result *res,
                                 devio_error *err)
{
    devio_status st = DEVIO_OK;
    if (op->answer)
        devio_reply_bytes(out, 200, "application/json", op->answer, strlen(op->answer));
    else
        st = devio_reply_json(out, 200, devio_json_step_result(res), err);
    op->answer = NULL;
    devio_step_result_free(res);
    return st;
}

devio_status devio_route_launch(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    devio_ticket_op *op = rq->op;
    devio_status st = DEVIO_OK;
    if (!op->owned) {
        op->owned = true;
        st = launch_begin(s, rq, err);
    }
    if (st == DEVIO_OK)
        st = drive(s, rq, false, NULL, out, err);
    if (st != DEVIO_OK || out->suspended)
        return st;
    op->phase = DEVIO_OP_NONE; /* launched: the ticket is the client's */
    return devio_reply_json(out, 202, devio_json_ticket_ref(op->ticket), err);
}

devio_status devio_route_await(devio_server *s, const devio_request *rq, devio_reply *out,
                               devio_error *err)
{
    devio_ticket_op *op = rq->op;
    if (op->phase == DEVIO_OP_NONE) {
        uint64_t t = 0;
        bool present = false;
        devio_status st = devio_request_query_u64(rq, "timeout_ms", &t, &present, err);
        if (st != DEVIO_OK)
            return st;
        int64_t timeout = present ? (int64_t)(t > AWAIT_CAP_MS ? AWAIT_CAP_MS : t) : -1;
        *op = (devio_ticket_op){.phase = DEVIO_OP_AWAITING, .ticket = rq->params.id,
                                .deadline_us = timeout < 0 ? -1
                                                           : (int64_t)devio_clock_us() +
                                                                 timeout * 1000};
    }
    devio_step_result res = {0};
    devio_status st = drive(s, rq, true, &res, out, err);
    if (out->suspended)
        return st;
    op->phase = DEVIO_OP_NONE;
    uncount(s, op);
    if (st == DEVIO_OK)
        return reply_result(out, op, &res, err);
    /* Not yet: a success that says so, with when to ask again (408 would
     * blame the client, and some clients retry a 408 by themselves). */
    if (st == DEVIO_E_TICKET_PENDING) {
        out->retry_after_s = 1;
        return devio_reply_json(out, 202, json_pack("{s:I,s:s}", "ticket",
                                                    (json_int_t)op->ticket, "status", "pending"),
                                err);
    }
    /* Awaited before (its answer lost on the way, say), reaped, or launched
     * by an earlier process: the history answers again. */
    if (st == DEVIO_E_TICKET_CONSUMED || st == DEVIO_E_UNKNOWN_TICKET)
        return devio_ticket_from_history(s, op->ticket, st, out, err);
    return st;
}

devio_status devio_route_step(devio_server *s, const devio_request *rq, devio_reply *out,
                              devio_error *err)
{
    devio_ticket_op *op = rq->op;
    devio_status st = DEVIO_OK;
    if (!op->owned) {
        op->owned = true;
        op->deadline_us = -1;
        st = launch_begin(s, rq, err);
    }
    devio_step_result res = {0};
    if (st == DEVIO_OK)
        st = drive(s, rq, true, &res, out, err);
    if (out->suspended)
        return st;
    op->phase = DEVIO_OP_NONE;
    uncount(s, op);
    return st == DEVIO_OK ? reply_result(out, op, &res, err) : st;
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

/* One ticket's history row, with the answer it settled with: GET /v1/tickets/{id}. */
devio_status devio_route_ticket(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    devio_ticket_page p = {0};
    devio_status st = devio_store_ticket_get(s->store, rq->params.id, &p, err);
    if (st == DEVIO_OK && p.n == 0)
        st = devio_fail_at(err, DEVIO_E_UNKNOWN_TICKET, "ticket", (int64_t)rq->params.id,
                           "no ticket %" PRIu64 " in the history (never launched, or trimmed by"
                           " --retention)", rq->params.id);
    if (st != DEVIO_OK) {
        devio_ticket_page_free(&p);
        return st;
    }
    json_t *j = ticket_row_json(&p.rows[0]);
    json_t *answer = p.rows[0].answer ? json_loads(p.rows[0].answer, 0, NULL) : NULL;
    if (j)
        json_object_set_new(j, "answer", answer ? answer : json_null());
    devio_ticket_page_free(&p);
    return devio_reply_json(out, 200, j, err);
}
