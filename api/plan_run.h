/* plan_run.h - the one way a JSON plan reaches a device: decoded within the device's limits, then started.
 * The server's launch route and the in-process conformance target both call it; it must never start a plan itself. */
#ifndef DEVIO_PLAN_RUN_H
#define DEVIO_PLAN_RUN_H

#include <jansson.h>

#include "device/devio.h"

/* Starts a decoded plan: devio_launch in process, the ticket history's
 * launch in the server. `plan` is borrowed for the call only (its storage
 * is freed when the call returns); ctx is the caller's. */
typedef devio_status (*devio_plan_start_fn)(void *ctx, devio_device *d, const devio_plan *plan,
                                            devio_error *err);

/* Decode `body` ({"rows":[...]}, docs/http.md), capped at d's max_rows and
 * max_batch_tokens (DEVIO_E_TOO_LARGE beyond), and hand the plan to
 * start(ctx, d, plan, err). Returns the decoder's status when the body is
 * refused (start is not called), else start's. d and body are borrowed. */
devio_status devio_plan_run(devio_device *d, const json_t *body, devio_plan_start_fn start,
                            void *ctx, devio_error *err);

#endif
