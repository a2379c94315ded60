/* body_out.c - a response body made on workers while it is sent: two buffers, one being sent by
 * the event loop, the next being made by a worker.
 * The event loop never waits for a chunk: when the next is not made it sets the connection
 * aside (from libmicrohttpd's content reader, where that is allowed) and the worker resumes it. */
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "common/log.h"
#include "device/status.h"
#include "service/http/body_out.h"

/* libmicrohttpd's own buffer between this and the socket. */
#define MHD_BLOCK ((size_t)64 * 1024)

struct devio_body_out {
    devio_offload *offload; /* borrowed */
    devio_offload_job job;
    struct MHD_Connection *conn; /* borrowed: the connection sending it */
    devio_body_make *make;
    devio_body_done *done;
    void *src;                   /* the maker's; given back by done */
    uint64_t total;
    pthread_mutex_t mu;          /* guards everything below */
    uint8_t *ready, *next;       /* owned: being sent; made (or being made) after it */
    size_t ready_len, ready_off, next_len, want;
    uint64_t made;               /* bytes made so far */
    bool making;                 /* a worker fills `next` (want bytes) */
    bool parked;                 /* the connection is set aside until `next` is made */
    bool ended;                  /* the response is gone: the worker under way frees b */
    devio_status failed;         /* a chunk that failed: the connection is aborted */
};

static void destroy(devio_body_out *b)
{
    b->done(b->src);
    pthread_mutex_destroy(&b->mu);
    free(b->ready);
    free(b->next);
    free(b);
}

devio_body_out *devio_body_out_new(devio_offload *o, uint64_t total, devio_body_make *make,
                                   devio_body_done *done, void *src)
{
    devio_body_out *b = calloc(1, sizeof *b);
    size_t chunk = total < DEVIO_BODY_OUT_CHUNK ? (size_t)total + 1 : DEVIO_BODY_OUT_CHUNK;
    if (b) {
        b->ready = malloc(chunk);
        b->next = malloc(chunk);
    }
    if (!b || !b->ready || !b->next) {
        if (b) {
            free(b->ready);
            free(b->next);
        }
        free(b);
        done(src);
        return NULL;
    }
    *b = (devio_body_out){.offload = o, .make = make, .done = done, .src = src, .total = total,
                          .ready = b->ready, .next = b->next};
    pthread_mutex_init(&b->mu, NULL);
    return b;
}

uint64_t devio_body_out_total(const devio_body_out *b)
{
    return b->total;
}

/* A worker makes the next chunk; then brings back the connection waiting for it, or frees b
 * when the response went meanwhile. */
static void make_chunk(devio_offload_job *job)
{
    devio_body_out *b = (devio_body_out *)((char *)job - offsetof(devio_body_out, job));
    size_t n = 0;
    devio_error err = {0};
    devio_status st = b->make(b->src, b->next, b->want, &n, &err);
    if (st == DEVIO_OK && n == 0)
        st = devio_fail(&err, DEVIO_E_DEVICE, "the body ended %llu bytes short of its %llu",
                        (unsigned long long)(b->total - b->made), (unsigned long long)b->total);
    pthread_mutex_lock(&b->mu);
    b->making = false;
    if (st == DEVIO_OK) {
        b->next_len = n;
        b->made += n;
    } else {
        b->failed = st;
    }
    bool resume = b->parked, gone = b->ended;
    b->parked = false;
    uint64_t made = b->made, total = b->total;
    pthread_mutex_unlock(&b->mu);
    /* Unless it waits for this chunk (parked) or is gone, the response may end from here on:
     * b is read no more. */
    if (st != DEVIO_OK && !gone)
        devio_log(DEVIO_LOG_WARN, "http",
                  "a streamed answer is cut short after %llu of its %llu bytes: %s: %s",
                  (unsigned long long)made, (unsigned long long)total, devio_status_str(st),
                  err.message);
    if (gone)
        destroy(b);
    else if (resume)
        MHD_resume_connection(b->conn);
}

/* Start making the next chunk when there is room and more to make (lock held): true when
 * the caller must queue the job once it lets go of the lock. */
static bool start_making(devio_body_out *b)
{
    if (b->making || b->next_len || b->failed != DEVIO_OK || b->made >= b->total)
        return false;
    uint64_t left = b->total - b->made;
    b->want = left < DEVIO_BODY_OUT_CHUNK ? (size_t)left : DEVIO_BODY_OUT_CHUNK;
    b->making = true;
    b->job.run = make_chunk;
    return true;
}

/* libmicrohttpd's content reader, on the HTTP thread. */
static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    devio_body_out *b = cls;
    (void)pos;
    pthread_mutex_lock(&b->mu);
    if (b->ready_off == b->ready_len && b->next_len) {
        uint8_t *t = b->ready;
        b->ready = b->next;
        b->next = t;
        b->ready_len = b->next_len;
        b->ready_off = 0;
        b->next_len = 0;
    }
    ssize_t out = 0;
    if (b->ready_off < b->ready_len) {
        size_t k = b->ready_len - b->ready_off;
        k = k < max ? k : max;
        memcpy(buf, b->ready + b->ready_off, k);
        b->ready_off += k;
        out = (ssize_t)k;
    } else if (b->failed != DEVIO_OK || !(b->making || b->made < b->total)) {
        out = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        /* Nothing to send yet: set aside until the worker has made the next chunk. */
        b->parked = true;
        MHD_suspend_connection(b->conn);
    }
    bool go = out >= 0 && start_making(b);
    pthread_mutex_unlock(&b->mu);
    if (go)
        devio_offload_submit(b->offload, &b->job);
    return out;
}

/* libmicrohttpd frees the response: the body ends here, or with the worker still making. */
static void free_body(void *cls)
{
    devio_body_out *b = cls;
    pthread_mutex_lock(&b->mu);
    b->ended = true;
    bool busy = b->making;
    pthread_mutex_unlock(&b->mu);
    if (!busy)
        destroy(b);
}

struct MHD_Response *devio_body_out_response(devio_body_out *b, struct MHD_Connection *c)
{
    b->conn = c;
    struct MHD_Response *r =
        MHD_create_response_from_callback(b->total, MHD_BLOCK, read_body, b, free_body);
    if (!r) {
        destroy(b);
        return NULL;
    }
    /* The first chunk is made while the headers go out. */
    pthread_mutex_lock(&b->mu);
    bool go = start_making(b);
    pthread_mutex_unlock(&b->mu);
    if (go)
        devio_offload_submit(b->offload, &b->job);
    return r;
}

void devio_body_out_free(devio_body_out *b)
{
    if (b)
        destroy(b);
}
