/* tickets.h - the steps of devio-server: launch, await and step on the device, each with its history row and metrics.
 * Typed all the way (devio_plan in, devio_step_result out); it never decodes or encodes JSON. */
#ifndef DEVIO_TICKETS_H
#define DEVIO_TICKETS_H

#include <stdint.h>

#include "device/devio.h"
#include "service/metrics.h"
#include "service/store.h"

/* What a step touches besides the device. Both borrowed; they outlive every call. */
typedef struct devio_tickets {
    devio_store *store;
    devio_metrics *metrics;
} devio_tickets;

/* In every call `dev` is borrowed: the caller keeps it alive for the call
 * (the server's device read lock), history writes included. */

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
