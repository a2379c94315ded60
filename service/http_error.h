/* http_error.h - the one place where device statuses become HTTP codes.
 * Pure mapping; it never builds bodies. */
#ifndef DEVIO_HTTP_ERROR_H
#define DEVIO_HTTP_ERROR_H

#include "device/devio.h"

unsigned devio_http_code(devio_status s);

#endif
