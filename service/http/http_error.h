/* http_error.h - the one place where statuses become HTTP codes (the table in
 * http_error.c; docs/http.md lists it), and the server's own codes documented.
 * Pure mapping; it never builds bodies.
 *
 * The codes only the server returns share the enum of device/devio.h (one
 * numbering, one table of names in device/status.c):
 *   DEVIO_E_UNAUTHORIZED          a missing or wrong bearer token
 *   DEVIO_E_NOT_FOUND             no such route
 *   DEVIO_E_METHOD                the route exists, the method does not
 *   DEVIO_E_NOT_READY             starting, or draining after SIGTERM
 *   DEVIO_E_STORE_UNAVAILABLE     the history cannot be written: nothing was done
 *   DEVIO_E_BAD_FRAMING           Content-Length or Transfer-Encoding headers that
 *                                 disagree, or a header name that is no token
 *   DEVIO_E_TOO_MANY_CONNECTIONS  the connection limit, in all or from one address
 *   DEVIO_E_MEDIA_TYPE            a body whose Content-Type is not JSON
 *   DEVIO_E_TICKET_REAPED         the server settled the ticket for nobody: its lease
 *                                 ran out or its /v1/step connection closed
 *   DEVIO_E_KEY_IN_USE            a request with the same Idempotency-Key is under way
 *   DEVIO_E_KEY_REUSED            an Idempotency-Key already answered another request */
#ifndef DEVIO_HTTP_ERROR_H
#define DEVIO_HTTP_ERROR_H

#include "device/devio.h"

/* The HTTP status every route answers `s` with: 200 for DEVIO_OK, 500 for a
 * value outside the enum. */
unsigned devio_http_code(devio_status s);

#endif
