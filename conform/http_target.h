/* http_target.h - a script target that replays operations against a devio-server over HTTP.
 * It maps each operation to its route and back to the in-process shape; it never alters a number. */
#ifndef DEVIO_CONFORM_HTTP_H
#define DEVIO_CONFORM_HTTP_H

#include <stdint.h>

#include "conform/script.h"
#include "device/devio.h"

/* Connection settings. Fill with devio_http_options_default() then override. */
typedef struct devio_http_options {
    const char *server;         /* base URL, e.g. "http://127.0.0.1:8080"; borrowed */
    const char *token;          /* bearer token, NULL for none; borrowed */
    uint32_t connect_timeout_s; /* default 10 */
    uint32_t request_timeout_s; /* one request, and one await without timeout_ms; default 600 */
    uint32_t await_slice_ms;    /* long poll of an await without timeout_ms; default 60000 */
} devio_http_options;

devio_http_options devio_http_options_default(void);

typedef struct devio_http_target devio_http_target; /* opaque */

/* Connect to opt->server and read GET /v1/device (the vocabulary size that
 * raw logits are cut by). On success *out is owned by the caller, who ends
 * it with devio_http_target_free(). On failure *out is NULL and err says
 * why: DEVIO_E_IO when the server cannot be reached, refuses the token or
 * does not answer like a devio-server. opt and its strings are copied. */
devio_status devio_http_target_open(const devio_http_options *opt, devio_http_target **out,
                                    devio_error *err);
void devio_http_target_free(devio_http_target *h);

/* Fill t so that it drives h (borrowed, must outlive t). */
void devio_http_target_fill(devio_http_target *h, devio_script_target *t);

/* NULL while every exchange got a devio answer; otherwise why the last one
 * did not (unreachable server, refused token, an answer that is not
 * devio's). Once set it stays set and every later call fails at once with
 * DEVIO_E_IO, so a run can be abandoned without more traffic. Borrowed. */
const char *devio_http_target_failure(const devio_http_target *h);

/* Requests sent and TCP connections opened so far (keep-alive shows as
 * connections staying at 1). */
void devio_http_target_counts(const devio_http_target *h, uint64_t *requests,
                              uint64_t *connections);

#endif
