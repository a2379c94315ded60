/* request_rules.h - the rules every request meets outside its handler: JSON depth and media type,
 * the bearer token, a 405's Allow list, request ids and the access line.
 * Pure functions of their arguments (the access line reads the connection); nothing here
 * routes, parses a body or touches the device. */
#ifndef DEVIO_REQUEST_RULES_H
#define DEVIO_REQUEST_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "device/devio.h"
#include "service/http/route_match.h"

/* A query argument given more than once (?top=5&top=6), whose meaning would
 * be a guess: DEVIO_E_INVALID naming it, else DEVIO_OK. */
devio_status devio_http_query_once(struct MHD_Connection *c, devio_error *err);

/* The header `name` when the request carries it at most once (*value NULL
 * when absent; borrowed from libmicrohttpd); DEVIO_E_INVALID when it is
 * repeated, since which one counts would be a guess. */
devio_status devio_http_header_once(struct MHD_Connection *c, const char *name, const char **value,
                                    devio_error *err);

/* The size of a JSON text as one pass over its bytes finds it, before any
 * of it is decoded: its nesting depth (brackets outside strings) and how
 * many values and member names it holds (commas and colons outside strings,
 * plus one), which bounds what decoding it would allocate. */
typedef struct devio_json_size {
    unsigned depth;
    uint64_t values;
} devio_json_size;
devio_json_size devio_http_json_size(const char *p, size_t n);

/* A JSON body's Content-Type: absent, application/json or application/...+json,
 * with any parameters (charset). Anything else is DEVIO_E_MEDIA_TYPE (415). */
devio_status devio_http_json_media_type(const char *ctype, devio_error *err);

/* Whether a Content-Type is application/octet-stream (any parameters, any case): the body
 * a route's octet_stream entry takes (route_match.h). */
bool devio_http_octet_stream(const char *ctype);

/* The Authorization header against the token (token_len bytes), in constant
 * time: the Bearer scheme in any case (RFC 9110, 11.1), then one or more spaces. */
bool devio_http_bearer_ok(const char *header, const char *token, size_t token_len);

/* The methods table[0..n) has for a path template, for a 405's Allow header
 * ("GET, HEAD, DELETE"): HEAD with every GET (libmicrohttpd answers HEAD as GET
 * without the body). */
void devio_http_allowed_methods(const devio_route *table, size_t n, const char *path, char *buf,
                                size_t len);

/* The request id into out (n > DEVIO_REQUEST_ID_MAX): `given` when it is 1 to
 * DEVIO_REQUEST_ID_MAX visible ASCII characters without quotes or backslashes,
 * else "EPOCH-SEQ" in hexadecimal, unique across restarts on one database. */
void devio_http_request_id(const char *given, uint64_t epoch, uint64_t seq, char *out, size_t n);

/* One access line at info level (common/log.h): method, path, status, time,
 * bytes, request id, and the client (an IP address, or "local" for a unix socket). */
void devio_http_log_access(struct MHD_Connection *c, const char *method, const char *url,
                           unsigned code, size_t bytes, double seconds, const char *request_id);

#endif
