/* request.h - what route handlers read from a request (query, headers, captures) and how they fill a reply.
 * The only helpers a handler needs from libmicrohttpd; they never route, authorise or touch the device. */
#ifndef DEVIO_REQUEST_H
#define DEVIO_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api/adapter_record.h"
#include "device/devio.h"
#include "service/http/route_match.h"

/* A query argument or a header of the request; NULL when absent. Borrowed
 * from libmicrohttpd for the life of the request. */
const char *devio_request_query(const devio_request *rq, const char *key);
const char *devio_request_header(const devio_request *rq, const char *key);

/* An integer query argument (decimal, at most INT64_MAX): DEVIO_OK and
 * *present false when absent (*out untouched), DEVIO_E_INVALID naming
 * `key` when it is not such an integer. */
devio_status devio_request_query_u64(const devio_request *rq, const char *key, uint64_t *out,
                                     bool *present, devio_error *err);

/* The {name} capture as a C string; DEVIO_E_INVALID when it does not fit an adapter name. */
devio_status devio_request_name(const devio_request *rq, char name[DEVIO_ADAPTER_NAME_MAX],
                                devio_error *err);

/* Fill r with j encoded (DEVIO_JSON_FLAGS), application/json. Takes the
 * reference to j; j NULL (an encoder out of memory) or a failed encoding is
 * DEVIO_E_NOMEM. */
devio_status devio_reply_json(devio_reply *r, unsigned code, json_t *j, devio_error *err);
/* Fill r with `len` bytes of `body` (malloc'd; the reply takes it). */
void devio_reply_bytes(devio_reply *r, unsigned code, const char *ctype, char *body, size_t len);
/* Fill r with a body made as it is sent (the reply takes it; body_out.h). */
void devio_reply_stream(devio_reply *r, unsigned code, const char *ctype, devio_body_out *body);
/* Replace whatever r holds with the error body of e and its HTTP code. Never
 * fails: without memory it answers a static out_of_memory body. */
void devio_reply_error(devio_reply *r, const devio_error *e);
void devio_reply_free(devio_reply *r);

#endif
