/* dispatch.h - one DeviceIo operation from its JSON body to its JSON result, for the in-process script target.
 * A table over the codecs of codec.h and adapter_codec.h, the very ones the HTTP routes use, so both answer alike. */
#ifndef DEVIO_DISPATCH_H
#define DEVIO_DISPATCH_H

#include <jansson.h>

#include "device/devio.h"

/* op: "create", "seq", "launch", "await", "step", "apply", "facts", "lora".
 * body is borrowed (may be NULL for create/facts). On success *result is a
 * new reference the caller releases; on failure *result is NULL and err is
 * filled. Bodies are those of docs/http.md: launch/step take a plan, await
 * takes {"ticket":N,"timeout_ms":M} (no timeout_ms: wait), apply an effect,
 * lora a command {"kind":..., "name":..., "path":..., "pin":...}, seq {"seq":N}. */
devio_status devio_api_call(devio_device *d, const char *op, const json_t *body,
                            json_t **result, devio_error *err);

#endif
