/* body_in.c - a streamed request body: pieces gathered on the HTTP thread, whole chunks handed to
 * a worker with the connection set aside, the rest written at the body's end.
 * The HTTP thread only copies bytes; every call of the sink (which may wait on the device) is a
 * worker's, so a slow sink holds up its own connection and no other. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "device/status.h"
#include "service/http/body_in.h"

void devio_body_in_start(devio_body_in *b, devio_offload *o, devio_body_sink_write *write,
                         void *sink, bool hash)
{
    memset(b, 0, sizeof *b);
    b->offload = o;
    b->write = write;
    b->sink = sink;
    b->hash = hash;
    devio_sha256_init(&b->sum);
    pthread_mutex_init(&b->mu, NULL);
    b->started = true;
}

/* Room for n more bytes in g. */
static bool reserve(devio_body_buf *g, size_t n)
{
    if (g->len + n <= g->cap)
        return true;
    size_t cap = g->cap ? g->cap : DEVIO_BODY_IN_CHUNK + 64 * 1024;
    while (cap < g->len + n)
        cap *= 2;
    uint8_t *p = realloc(g->p, cap);
    if (!p)
        return false;
    g->p = p;
    g->cap = cap;
    return true;
}

/* Hash and write n bytes, unless the sink refused earlier ones (a worker's). */
static void feed(devio_body_in *b, const uint8_t *p, size_t n)
{
    if (n == 0)
        return;
    if (b->hash)
        devio_sha256_update(&b->sum, p, n);
    pthread_mutex_lock(&b->mu);
    bool refused = b->failed != DEVIO_OK;
    pthread_mutex_unlock(&b->mu);
    if (refused)
        return;
    devio_error e = {0};
    devio_status st = b->write(b->sink, p, n, &e);
    if (st == DEVIO_OK)
        return;
    pthread_mutex_lock(&b->mu);
    b->failed = st;
    b->why = e;
    pthread_mutex_unlock(&b->mu);
}

/* A worker writes the chunk in `spare`, then brings the connection back. */
static void write_chunk(devio_offload_job *job)
{
    devio_body_in *b = (devio_body_in *)((char *)job - offsetof(devio_body_in, job));
    struct MHD_Connection *c = b->conn;
    feed(b, b->spare.p, b->spare.len);
    pthread_mutex_lock(&b->mu);
    b->spare.len = 0;
    b->writing = false;
    pthread_mutex_unlock(&b->mu);
    /* The last touch of b: once resumed, the request may end and free it. */
    MHD_resume_connection(c);
}

bool devio_body_in_take(devio_body_in *b, struct MHD_Connection *c, const void *piece, size_t n)
{
    pthread_mutex_lock(&b->mu);
    b->received += n;
    /* Once refused, bytes matter only to the digest. */
    bool keep = b->failed == DEVIO_OK || b->hash;
    if (keep && !reserve(&b->gather, n)) {
        pthread_mutex_unlock(&b->mu);
        return false;
    }
    if (keep) {
        memcpy(b->gather.p + b->gather.len, piece, n);
        b->gather.len += n;
    }
    /* libmicrohttpd may call again in the same pass (a chunked body's next chunk) after the
     * connection was set aside: those bytes wait in `gather` for the chunk under way. */
    bool go = !b->writing && b->gather.len >= DEVIO_BODY_IN_CHUNK;
    if (go) {
        devio_body_buf t = b->spare;
        b->spare = b->gather;
        b->gather = t;
        b->gather.len = 0;
        b->writing = true;
        b->conn = c;
        b->job.run = write_chunk;
        /* Set aside before the job is queued: the worker resumes it. */
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&b->mu);
    if (go)
        devio_offload_submit(b->offload, &b->job);
    return true;
}

devio_status devio_body_in_end(devio_body_in *b, char digest[65], devio_error *err)
{
    /* No chunk is under way: libmicrohttpd makes its last call (the body's end) only once the
     * connection the last chunk set aside is resumed, which its worker does last. */
    digest[0] = '\0';
    feed(b, b->gather.p, b->gather.len);
    b->gather.len = 0;
    if (b->hash) {
        uint8_t d[32];
        devio_sha256_final(&b->sum, d);
        devio_sha256_hex(d, digest);
    }
    return devio_body_in_result(b, err);
}

devio_status devio_body_in_result(devio_body_in *b, devio_error *err)
{
    pthread_mutex_lock(&b->mu);
    devio_status st = b->failed;
    if (st != DEVIO_OK && err)
        *err = b->why;
    pthread_mutex_unlock(&b->mu);
    return st;
}

void devio_body_in_free(devio_body_in *b)
{
    if (!b->started)
        return;
    free(b->gather.p);
    free(b->spare.p);
    pthread_mutex_destroy(&b->mu);
    memset(b, 0, sizeof *b);
}
