/* body_out.h - a response body made as it is sent, by a maker that may wait (on the device): each
 * chunk made on a worker (offload.h) while the event loop sends the one before.
 * The HTTP thread never calls the maker; it copies chunks out, and sets the connection aside only
 * while the next chunk is not yet made. */
#ifndef DEVIO_BODY_OUT_H
#define DEVIO_BODY_OUT_H

#include <stdint.h>

#include <microhttpd.h>

#include "device/devio.h"
#include "service/http/offload.h"

/* Bytes one worker's turn makes (two such buffers a body). */
#define DEVIO_BODY_OUT_CHUNK ((size_t)256 * 1024)

/* Make the next bytes of the body, at most cap, into buf (*n of them); on a worker, and it
 * may wait. *n == 0 before the promised size is a failure too. */
typedef devio_status devio_body_make(void *src, void *buf, size_t cap, size_t *n,
                                     devio_error *err);
/* The body ended (sent whole, failed, its client gone, or never sent): give src back. */
typedef void devio_body_done(void *src);

typedef struct devio_body_out devio_body_out; /* opaque */

/* A body of exactly `total` bytes from make(src). The body owns src from here: done(src)
 * runs exactly once, when the body is freed. NULL when out of memory (done(src) has run). */
devio_body_out *devio_body_out_new(devio_offload *o, uint64_t total, devio_body_make *make,
                                   devio_body_done *done, void *src);

/* The size promised. */
uint64_t devio_body_out_total(const devio_body_out *b);

/* libmicrohttpd's response for b on connection c (Content-Length: total). b is the
 * response's from here, freed with it; NULL when out of memory (b freed). A chunk that fails
 * to be made aborts the connection after what was sent, so a client sees the body cut
 * short (logged at warn with the maker's message). */
struct MHD_Response *devio_body_out_response(devio_body_out *b, struct MHD_Connection *c);

/* Free a body never given to a response; b may be NULL. */
void devio_body_out_free(devio_body_out *b);

#endif
