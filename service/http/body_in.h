/* body_in.h - a request body streamed into a sink as it arrives: gathered on the HTTP thread,
 * each chunk written on a worker (offload.h) while the connection is set aside.
 * It never calls the sink on an HTTP thread, and never holds more than a chunk or two of a body. */
#ifndef DEVIO_BODY_IN_H
#define DEVIO_BODY_IN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "common/sha256.h"
#include "device/devio.h"
#include "service/http/offload.h"

/* Bytes gathered before a chunk goes to a worker. A state import takes each chunk in under one
 * hold of the device lock, with at most one wait for the steps in flight
 * (device/core/state_import.c): bigger chunks, fewer waits behind a busy device's steps. */
#define DEVIO_BODY_IN_CHUNK ((size_t)4 << 20)

/* Take the next n bytes of the body, in order, on a worker (it may wait on the device).
 * DEVIO_OK, or a refusal: no byte is written to the sink after one. */
typedef devio_status devio_body_sink_write(void *sink, const void *buf, size_t n,
                                           devio_error *err);

/* Bytes gathered, written or held by a worker. */
typedef struct devio_body_buf {
    uint8_t *p; /* owned */
    size_t len, cap;
} devio_body_buf;

/* One request's body on its way to its sink. Lives in the request's state; everything
 * a worker touches stays valid while its connection is set aside. */
typedef struct devio_body_in {
    devio_offload *offload;       /* borrowed: the server's workers */
    devio_body_sink_write *write; /* the sink's writer */
    void *sink;                   /* borrowed; outlives this */
    bool hash;                    /* keep a SHA-256 of every byte (an Idempotency-Key's digest) */
    bool started;                 /* devio_body_in_start ran: mu is live */
    struct MHD_Connection *conn;  /* borrowed: the connection set aside while a chunk is written */
    devio_offload_job job;        /* the chunk being written */
    pthread_mutex_t mu;           /* guards writing, spare, failed and why */
    devio_body_buf gather;        /* taken on the HTTP thread, not yet handed over */
    devio_body_buf spare;         /* the chunk a worker writes (writing), else empty */
    bool writing;
    uint64_t received;            /* bytes taken, dropped ones included */
    devio_sha256 sum;             /* of every byte handed over (hash); the workers' */
    devio_status failed;          /* the sink's first refusal; DEVIO_OK until one */
    devio_error why;
} devio_body_in;

/* Begin a body for `sink` (zeroed b). */
void devio_body_in_start(devio_body_in *b, devio_offload *o, devio_body_sink_write *write,
                         void *sink, bool hash);

/* Take one piece of the body on the HTTP thread (libmicrohttpd's upload data). A chunk
 * that is full goes to a worker and connection c is set aside until it is written (the
 * worker resumes it). After a refusal the bytes are only counted (and hashed, when asked).
 * False when out of memory: the caller closes the connection. */
bool devio_body_in_take(devio_body_in *b, struct MHD_Connection *c, const void *piece, size_t n);

/* The body is whole: what is gathered is written (on a worker: this may wait), and the
 * outcome given: DEVIO_OK, or the sink's first refusal in err. digest: the hex SHA-256 of
 * the whole body when hashing, else "". */
devio_status devio_body_in_end(devio_body_in *b, char digest[65], devio_error *err);

/* The outcome devio_body_in_end gave, again. */
devio_status devio_body_in_result(devio_body_in *b, devio_error *err);

/* Free the buffers; b may be zeroed (never started). No chunk may be under way: its
 * connection is set aside until it is written, so the request cannot have ended. */
void devio_body_in_free(devio_body_in *b);

#endif
