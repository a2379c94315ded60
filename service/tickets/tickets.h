/* tickets.h - the steps of devio-server: launch, await and step on the device, each with its history row and metrics.
 * Typed all the way (devio_plan in, devio_step_result out); it never decodes or encodes JSON.
 *
 * The life of a ticket, in one picture. Each line starts from the phase of
 * the request's op (devio_op_phase, below) and names the function that moves
 * it on, the thread that runs it, what the device does (device/core/) and
 * what the history row says (service/store/store.h). Threads: H an HTTP thread (service/server.c), W the store's writer thread
 * (service/store/store_writer.c), D the device's worker (device/core/step.c),
 * R the reaper (service/tickets/leases.c).
 *
 *  NONE ──devio_tickets_launch_begin (H, POST /v1/launch or /v1/step)──────────►
 *     devio_launch_reserve: ids and blocks reserved; row "in_flight" queued;
 *     lease taken (devio_leases_add), so that a settle right after is seen
 *  LAUNCHING ──(the row written) devio_launches_end → devio_tickets_launch_end
 *     (W when the request parked; H when it could not)──────────────────────────►
 *     devio_launch_commit: the step is queued to the device.  Row failed or
 *     backend refused: devio_launch_cancel, nothing stays reserved, lease
 *     dropped, op NONE, the answer is the error.
 *  AWAITING ── the step runs (D, run_step); on_settled → devio_server_settled
 *     (D): parked awaits resumed (parked_awaits.h), the lease's clock starts ──►
 *  AWAITING ──devio_tickets_await_begin (H, an await or the /v1/step itself;
 *     R for a ticket reaped: lease out, or its /v1/step connection closed,
 *     service/abandoned.c)──► devio_await_begin holds the settled ticket;
 *     row "ok" / "failed" (or "reaped") queued
 *  SETTLING ──(the row written) devio_tickets_await_end (H, or R)──────────────►
 *     devio_await_end: the ticket ends, its result the answer; lease dropped
 *     (devio_leases_taken); op NONE.  Row failed: the ticket stays settled
 *     and awaitable, the answer store_unavailable.
 *  NONE: the device holds nothing for the ticket; its answer is the history's
 *     (service/routes/ticket_replay.c reads it again for a replay or a late
 *     await).  A teardown aborts what was never awaited: every "in_flight"
 *     row of this process "aborted" (devio_tickets_aborted).
 *
 * A request parks between the halves (never blocking an HTTP thread on the
 * store or the device): service/routes/routes_tickets.c drives the halves,
 * service/launches.c lists the launches the writer ends, and
 * service/abandoned.c finishes those whose client went. */
#ifndef DEVIO_TICKETS_H
#define DEVIO_TICKETS_H

#include <stdint.h>

#include "device/devio.h"
#include "service/metrics/metrics.h"
#include "service/store/store.h"

typedef struct devio_leases devio_leases; /* service/tickets/leases.h */

/* The answer text of a settled step as it is sent (malloc'd; NULL: none),
 * kept with its history row so that the answer can be read again. */
typedef char *devio_answer_text(const devio_step_result *r);

/* What a step touches besides the device. All borrowed; they outlive every call. */
typedef struct devio_tickets {
    devio_store *store;
    devio_metrics *metrics;
    devio_leases *leases; /* NULL: tickets are not watched (in-process callers) */
    devio_answer_text *answer; /* NULL: no answer is kept */
} devio_tickets;

/* In every call `dev` is borrowed: the caller keeps it alive for the call
 * (the server's device read lock), history writes included. */

/* ---- in halves, so that no HTTP thread waits on the history ---------------

 * A launch or an await is begun, its history row queued, and ended once the
 * row's write is done (devio_store_done): the server parks the connection
 * between the halves. The op carries what the halves share. */

typedef enum devio_op_phase {
    DEVIO_OP_NONE = 0,
    DEVIO_OP_LAUNCHING, /* ticket reserved, its "in_flight" row is write `write` */
    DEVIO_OP_AWAITING,  /* ticket launched, not yet taken */
    DEVIO_OP_SETTLING,  /* ticket held with its outcome, its settled row is write `write` */
} devio_op_phase;

typedef struct devio_ticket_op {
    devio_op_phase phase;
    uint64_t ticket;
    uint64_t write;          /* LAUNCHING, SETTLING: the history write to wait for */
    devio_metrics_pending shape; /* LAUNCHING: the plan's shape, counted once launched */
    devio_status st;         /* SETTLING: the step's own outcome, and err when it failed */
    devio_error err;
    devio_step_result res;   /* SETTLING with st DEVIO_OK: the result, owned by the op */
    char *answer;            /* SETTLING with st DEVIO_OK: the answer text the history keeps
                                (tickets.answer), malloc'd, NULL without; after a successful
                                await_end the caller's, to send as it is or free */
    /* What the server keeps across a parked request's calls (service/server.c). */
    struct devio_ticket_op *next_launch; /* LAUNCHING: the server's list (launches.c) */
    bool tracked;            /* LAUNCHING: on that list, to be ended by the store's writer */
    bool owned;              /* a launch or a step: until the answer naming the ticket is
                                made, the ticket is the server's, reaped if the client goes */
    bool counted;            /* counted in the server's awaits under way */
    int64_t deadline_us;     /* an await's deadline (devio_clock_us), < 0: none */
} devio_ticket_op;

/* Reserve, queue the "in_flight" row: op LAUNCHING. Refused (nothing
 * reserved, op untouched) when the store is known unwritable. `key` (may be
 * NULL): the request's Idempotency-Key row, written with the launch row and
 * answering {"ticket":id} (its answer is filled here). */
devio_status devio_tickets_launch_begin(const devio_tickets *t, devio_device *dev,
                                        const devio_plan *plan, const char *request_id,
                                        const devio_key_record *key, devio_ticket_op *op,
                                        devio_error *err);
/* Wait for the row (at once when devio_store_done), then commit: op
 * AWAITING; or, when the row failed or the backend refused, cancel and
 * answer the error: op NONE (a backend refusal's row says "failed", queued
 * and not waited for, so that the store's writer may call this). */
devio_status devio_tickets_launch_end(const devio_tickets *t, devio_device *dev,
                                      devio_ticket_op *op, devio_error *err);
/* One look at op->ticket (AWAITING), waiting up to timeout_ms: once it has
 * settled, hold it and queue its settled row: op SETTLING, DEVIO_OK. Any
 * other answer (pending, consumed, unknown, torn down) leaves op as it was
 * and writes nothing. `reaped` NULL: the row says "ok" or "failed"; else it
 * says "reaped" (error ticket_reaped) with this message, the step's timings
 * kept. */
devio_status devio_tickets_await_begin(const devio_tickets *t, devio_device *dev,
                                       devio_ticket_op *op, int64_t timeout_ms,
                                       const char *reaped, devio_error *err);
/* Wait for the settled row (at once when devio_store_done), then end the
 * ticket as `how` says and count it: the step's outcome, with its result
 * moved into *out on DEVIO_OK (the caller's); op NONE. When the row failed
 * the ticket stays settled and awaitable and the answer is
 * DEVIO_E_STORE_UNAVAILABLE (details.ticket); op NONE. */
devio_status devio_tickets_await_end(const devio_tickets *t, devio_device *dev,
                                     devio_ticket_op *op, devio_await_ending how,
                                     devio_step_result *out, devio_error *err);
/* Drop what a SETTLING op holds without ending the ticket: it stays settled
 * and awaitable. */
void devio_tickets_op_release(devio_device *dev, devio_ticket_op *op);

/* ---- whole, blocking: tests and in-process callers ------------------------ */

/* devio_launch_reserve, the ticket's "in_flight" row committed, then
 * devio_launch_commit: the client sees the id only once its row is durable.
 * When the row cannot be written (or the store is already known unwritable)
 * the answer is DEVIO_E_STORE_UNAVAILABLE and nothing was launched: the
 * reservation is cancelled, the device is as before the call. The device
 * lock is not held while the row is written, so concurrent launches share
 * the store's transactions. request_id (may be NULL) is stored with the row. */
devio_status devio_tickets_launch(const devio_tickets *t, devio_device *dev,
                                  const devio_plan *plan, const char *request_id,
                                  uint64_t *ticket, devio_error *err);

/* devio_await_begin, then the settled row ("ok" with timings, or "failed"
 * with the error) committed, then devio_await_end and the step metrics.
 * Answers that leave the ticket as it was (pending, consumed, unknown, torn
 * down) write nothing. When the row cannot be written the answer is
 * DEVIO_E_STORE_UNAVAILABLE (details.ticket) and the ticket stays settled
 * and awaitable, its result kept for a later await. On success *out is the
 * caller's (devio_step_result_free). */
devio_status devio_tickets_await(const devio_tickets *t, devio_device *dev, uint64_t ticket,
                                 int64_t timeout_ms, devio_step_result *out, devio_error *err);

/* devio_tickets_launch then devio_tickets_await without a timeout. When the
 * result's row cannot be written the answer (store_unavailable) names the
 * ticket in details.ticket: it was launched and stays awaitable. */
devio_status devio_tickets_step(const devio_tickets *t, devio_device *dev,
                                const devio_plan *plan, const char *request_id,
                                devio_step_result *out, devio_error *err);

/* After a teardown reported `aborted` unawaited tickets: count them and mark
 * every "in_flight" row of this process "aborted" with `reason`, committed
 * before this returns (a failed write is logged). */
void devio_tickets_aborted(const devio_tickets *t, uint32_t aborted, const char *reason);

#endif
