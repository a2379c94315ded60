/* plan_run.c - a JSON plan decoded within the device's limits and handed to its starter.
 * Owns the decoded plan for the call only; it must never call the device but through the starter. */
#include "api/codec.h"
#include "api/plan_run.h"

devio_status devio_plan_run(devio_device *d, const json_t *body, devio_plan_start_fn start,
                            void *ctx, devio_error *err)
{
    const devio_config *c = devio_config_of(d);
    devio_plan_buf buf;
    devio_status s = devio_json_plan_decode(body, c->max_rows, c->max_batch_tokens, &buf, err);
    if (s != DEVIO_OK)
        return s;
    s = start(ctx, d, &buf.plan, err);
    devio_plan_buf_free(&buf);
    return s;
}
