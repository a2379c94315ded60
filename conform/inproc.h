/* inproc.h - the in-process script target: each operation of a conformance script on a device in this process.
 * Borrows its device and owns nothing; the server's routes and this target share the codecs and the plan runner of api/. */
#ifndef DEVIO_INPROC_H
#define DEVIO_INPROC_H

#include <jansson.h>

#include "conform/script.h"
#include "device/devio.h"

/* op: "create", "seq", "launch", "await", "step", "apply", "facts", "lora".
 * body is borrowed (may be NULL for create/facts). On success *result is a
 * new reference the caller releases; on failure *result is NULL and err is
 * filled. Bodies are those of docs/http.md: launch/step take a plan, await
 * takes {"ticket":N,"timeout_ms":M} (no timeout_ms: wait), apply an effect,
 * lora a command {"kind":..., "name":..., "path":..., "pin":...}, seq {"seq":N}. */
devio_status devio_inproc_call(devio_device *d, const char *op, const json_t *body,
                               json_t **result, devio_error *err);

/* Fill t so that it drives `d` (borrowed, must outlive t): operations
 * through devio_inproc_call, logits read from the device directly. */
void devio_inproc_target(devio_device *d, devio_script_target *t);

#endif
