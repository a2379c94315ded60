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

/* devio_launch, then the ticket's "in_flight" row, committed before this
 * returns so that the client sees the id only once its row is there. The
 * step is queued either way, so a failed row write is logged, not returned:
 * the client must learn the id to await it. */
devio_status devio_tickets_launch(const devio_tickets *t, devio_device *dev,
                                  const devio_plan *plan, uint64_t *ticket, devio_error *err);

/* devio_await, then the settled row ("ok" with timings, or "failed" with the
 * error) and the step metrics. Answers that leave the ticket as it was
 * (pending, consumed, unknown, torn down) write nothing. The ticket is consumed
 * either way, so a failed row write is logged and the answer stands. On
 * success *out is the caller's (devio_step_result_free). */
devio_status devio_tickets_await(const devio_tickets *t, devio_device *dev, uint64_t ticket,
                                 int64_t timeout_ms, devio_step_result *out, devio_error *err);

/* devio_tickets_launch then devio_tickets_await without a timeout. */
devio_status devio_tickets_step(const devio_tickets *t, devio_device *dev,
                                const devio_plan *plan, devio_step_result *out,
                                devio_error *err);

/* After a teardown reported `aborted` unawaited tickets: count them and mark
 * every "in_flight" row of this process "aborted" with `reason`, committed
 * before this returns (a failed write is logged). */
void devio_tickets_aborted(const devio_tickets *t, uint32_t aborted, const char *reason);

#endif
