/* framing.h - the request headers that say where a body ends (Content-Length, Transfer-Encoding), checked for one reading only.
 * Pure: it never touches a socket; a request two parsers could frame two ways is refused, never guessed at. */
#ifndef DEVIO_FRAMING_H
#define DEVIO_FRAMING_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

typedef struct devio_framing {
    unsigned n_length;   /* Content-Length headers seen */
    unsigned n_encoding; /* Transfer-Encoding headers seen */
    bool length_bad;     /* a Content-Length that is not a decimal number up to UINT64_MAX */
    uint64_t length;     /* the first Content-Length's value */
    bool encoding_bad;   /* a Transfer-Encoding other than exactly "chunked" */
    char encoding[32];   /* the first such value, cut to fit */
    bool name_bad;       /* a header name that is not a token (whitespace before its colon),
                            or a framing header's name with more after it (a folded line,
                            which libmicrohttpd joins onto the name) */
    char name[32];       /* the first such name, cut to fit */
} devio_framing;

/* Take one request header (name case-insensitive); names are checked, and
 * the framing headers' values kept. */
void devio_framing_add(devio_framing *f, const char *name, const char *value);

/* DEVIO_OK when the headers frame the body one way only: every name a token
 * (RFC 9112 refuses whitespace between a name and its colon), at most one
 * Content-Length (two are refused even when equal), at most one
 * Transfer-Encoding and only "chunked", never both, and no other header whose
 * name starts with one of theirs. Else DEVIO_E_BAD_FRAMING naming the fault. */
devio_status devio_framing_check(const devio_framing *f, devio_error *err);

#endif
