/* http_error.h - the one place where device statuses become HTTP codes (docs/http.md).
 * Pure mapping; it never builds bodies. */
#ifndef DEVIO_HTTP_ERROR_H
#define DEVIO_HTTP_ERROR_H

#include "device/devio.h"

/* The HTTP status every route answers `s` with: 200 for DEVIO_OK, 500 for a
 * value outside the enum. */
unsigned devio_http_code(devio_status s);

#endif
