/* status.h - filling a devio_error: the one way the core reports failure.
 * Never allocates; err may be NULL, and then only the status is returned. */
#ifndef DEVIO_STATUS_H
#define DEVIO_STATUS_H

#include "device/devio.h"

#if defined(__GNUC__)
#define DEVIO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DEVIO_PRINTF(a, b)
#endif

/* Fill err (when not NULL) and return s, so callers write `return devio_fail(...)`. */
devio_status devio_fail(devio_error *err, devio_status s, const char *fmt, ...) DEVIO_PRINTF(3, 4);

/* Same, with one detail pair, e.g. ("row", 3). */
devio_status devio_fail_at(devio_error *err, devio_status s, const char *key, int64_t val,
                           const char *fmt, ...) DEVIO_PRINTF(5, 6);

/* Put a formatted prefix before err's message (cut to fit), keeping its
 * status and detail. */
void devio_error_prefix(devio_error *err, const char *fmt, ...) DEVIO_PRINTF(2, 3);

#endif
