/* events.c - the event ring and its server-sent-event streams (events.h).
 * The device's hook only copies into the ring and signals; streams are formatted on HTTP threads
 * and woken by a notifier thread, so no stream can ever hold up a step. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <jansson.h>

#include "common/clock.h"
#include "device/status.h"
#include "service/events.h"

/* Bytes a stream formats at once: many events, and always at least one whole. */
#define STREAM_BUF 16384
#define TICK_MS 500

struct devio_event_stream {
    devio_events *ev;            /* borrowed; outlives every stream */
    struct MHD_Connection *conn; /* borrowed: the connection sending it */
    int fd;                      /* its socket, peeked for a client gone while parked */
    devio_event_stream *prev, *next; /* in ev->streams, under ev->mu */
    uint64_t next_id;            /* the next event to send */
    uint64_t idle_since_us;      /* last bytes given to libmicrohttpd */
    bool hello_sent, parked, gone;
    size_t len, off;             /* buf[off..len) still to send */
    char buf[STREAM_BUF];
};

static const char *const kind_names[] = {
    [DEVIO_EVENT_SEQ_CREATED] = "seq_created",       [DEVIO_EVENT_SEQ_FREED] = "seq_freed",
    [DEVIO_EVENT_SEQ_PARKED] = "seq_parked",         [DEVIO_EVENT_SEQ_RESTORED] = "seq_restored",
    [DEVIO_EVENT_SEQ_EXPORTED] = "seq_exported",     [DEVIO_EVENT_SEQ_IMPORTED] = "seq_imported",
    [DEVIO_EVENT_BLOCK_STORED] = "block_stored",     [DEVIO_EVENT_BLOCK_REMOVED] = "block_removed",
    [DEVIO_EVENT_ADAPTER_LOADED] = "adapter_loaded",
    [DEVIO_EVENT_ADAPTER_UNLOADED] = "adapter_unloaded",
    [DEVIO_EVENT_DEVICE_FAILED] = "device_failed",
};

const char *devio_event_kind_name(devio_event_kind k)
{
    size_t n = sizeof kind_names / sizeof *kind_names;
    return (size_t)k < n && kind_names[k] ? kind_names[k] : "unknown";
}

static void *notifier_main(void *arg);

devio_status devio_events_start(devio_events *ev, uint32_t cap, uint32_t max_subs,
                                uint64_t epoch, devio_error *err)
{
    memset(ev, 0, sizeof *ev);
    if (cap < 1)
        return devio_fail(err, DEVIO_E_INVALID, "--event-buffer must be at least 1");
    ev->ring = calloc(cap, sizeof *ev->ring);
    if (!ev->ring)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for %u events", cap);
    ev->cap = cap;
    ev->max_subs = max_subs;
    ev->epoch = epoch;
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->wake, NULL);
    if (pthread_create(&ev->notifier, NULL, notifier_main, ev) != 0) {
        pthread_cond_destroy(&ev->wake);
        pthread_mutex_destroy(&ev->mu);
        free(ev->ring);
        ev->ring = NULL;
        return devio_fail(err, DEVIO_E_NOMEM, "cannot start the events thread");
    }
    ev->started = true;
    return DEVIO_OK;
}

void devio_events_hook(void *ctx, const devio_event *e)
{
    devio_events *ev = ctx;
    pthread_mutex_lock(&ev->mu);
    uint64_t id = ++ev->last_id;
    devio_event_rec *r = &ev->ring[(id - 1) % ev->cap];
    r->id = id;
    r->e = *e;
    r->e.name = NULL;
    r->name[0] = '\0';
    if (e->name)
        snprintf(r->name, sizeof r->name, "%s", e->name);
    pthread_cond_signal(&ev->wake);
    pthread_mutex_unlock(&ev->mu);
}

void devio_events_close(devio_events *ev)
{
    if (!ev->started)
        return;
    pthread_mutex_lock(&ev->mu);
    ev->closing = true;
    pthread_cond_signal(&ev->wake);
    pthread_mutex_unlock(&ev->mu);
}

void devio_events_stop(devio_events *ev)
{
    if (!ev->started)
        return;
    pthread_mutex_lock(&ev->mu);
    ev->closing = ev->stop = true;
    pthread_cond_signal(&ev->wake);
    pthread_mutex_unlock(&ev->mu);
    pthread_join(ev->notifier, NULL);
    pthread_cond_destroy(&ev->wake);
    pthread_mutex_destroy(&ev->mu);
    free(ev->ring);
    ev->ring = NULL;
    ev->started = false;
}

uint32_t devio_events_subscribers(devio_events *ev)
{
    if (!ev->started)
        return 0;
    pthread_mutex_lock(&ev->mu);
    uint32_t n = ev->n_subs;
    pthread_mutex_unlock(&ev->mu);
    return n;
}

/* Whether the client of a parked stream has gone (FIN or reset); bytes it sent mean it is
 * still there. */
static bool client_gone(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Resume the parked streams that have something to send: new events, a keep-alive due, the
 * end (closing), or a client gone. Resumed outside ev->mu: a parked stream is not freed until
 * its connection is resumed. */
static void *notifier_main(void *arg)
{
    devio_events *ev = arg;
    struct MHD_Connection **wake = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&ev->mu);
    while (!ev->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += TICK_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&ev->wake, &ev->mu, &until);
        if (cap < ev->n_subs) {
            /* Grown with the lock let go: streams only join under it, counted again below. */
            size_t want = ev->n_subs;
            pthread_mutex_unlock(&ev->mu);
            struct MHD_Connection **w = realloc(wake, want * sizeof *w);
            pthread_mutex_lock(&ev->mu);
            if (w) {
                wake = w;
                cap = want;
            }
        }
        uint64_t now = devio_clock_us();
        size_t n = 0;
        for (devio_event_stream *s = ev->streams; s && n < cap; s = s->next) {
            if (!s->parked)
                continue;
            bool due = now - s->idle_since_us >= DEVIO_EVENTS_KEEPALIVE_MS * 1000ull;
            if (!s->gone && s->fd >= 0 && client_gone(s->fd))
                s->gone = true;
            if (ev->closing || s->gone || due || s->next_id <= ev->last_id) {
                s->parked = false;
                wake[n++] = s->conn;
            }
        }
        pthread_mutex_unlock(&ev->mu);
        for (size_t i = 0; i < n; i++)
            MHD_resume_connection(wake[i]);
        pthread_mutex_lock(&ev->mu);
    }
    pthread_mutex_unlock(&ev->mu);
    free(wake);
    return NULL;
}

/* The JSON data of event r, only the fields its kind has. */
static json_t *event_json(const devio_event_rec *r)
{
    const devio_event *e = &r->e;
    char hash[17];
    snprintf(hash, sizeof hash, "%016" PRIx64, e->prefix_hash);
    switch (e->kind) {
    case DEVIO_EVENT_SEQ_CREATED:
        if (e->parent)
            return json_pack("{sIsI}", "seq", (json_int_t)e->seq, "parent",
                             (json_int_t)e->parent);
        return json_pack("{sI}", "seq", (json_int_t)e->seq);
    case DEVIO_EVENT_BLOCK_STORED:
        return json_pack("{sIsIsIss}", "seq", (json_int_t)e->seq, "block", (json_int_t)e->block,
                         "prefix_len", (json_int_t)e->prefix_len, "prefix_hash", hash);
    case DEVIO_EVENT_BLOCK_REMOVED:
        return json_pack("{sIss}", "block", (json_int_t)e->block, "prefix_hash", hash);
    case DEVIO_EVENT_ADAPTER_LOADED:
    case DEVIO_EVENT_ADAPTER_UNLOADED:
        return json_pack("{ss}", "name", r->name);
    case DEVIO_EVENT_DEVICE_FAILED:
        return json_pack("{ss}", "message", r->name);
    default:
        return json_pack("{sI}", "seq", (json_int_t)e->seq);
    }
}

/* Append "id/event/data" to s->buf when it fits (has_id false: no id line): false when it
 * does not. */
static bool put(devio_event_stream *s, bool has_id, uint64_t id, const char *kind, json_t *data)
{
    char *text = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!text)
        text = strdup("{}");
    size_t room = sizeof s->buf - s->len;
    int n = has_id ? snprintf(s->buf + s->len, room, "id: %" PRIu64 "\nevent: %s\ndata: %s\n\n", id,
                          kind, text ? text : "{}")
               : snprintf(s->buf + s->len, room, "event: %s\ndata: %s\n\n", kind,
                          text ? text : "{}");
    free(text);
    if (n < 0 || (size_t)n >= room) {
        s->buf[s->len] = '\0';
        return false;
    }
    s->len += (size_t)n;
    return true;
}

/* Fill s->buf from the ring (ev->mu held): hello first, missed when the ring dropped some,
 * then as many events as fit. */
static void fill(devio_event_stream *s)
{
    devio_events *ev = s->ev;
    s->len = s->off = 0;
    if (!s->hello_sent) {
        /* Its id is the last one before the stream's first event: a client reconnecting
         * after only the hello loses nothing. */
        put(s, true, s->next_id - 1, "hello",
            json_pack("{sIsI}", "epoch", (json_int_t)ev->epoch, "last_id",
                      (json_int_t)ev->last_id));
        s->hello_sent = true;
    }
    uint64_t oldest = ev->last_id >= ev->cap ? ev->last_id - ev->cap + 1 : 1;
    if (s->next_id < oldest) {
        json_t *missed = json_pack("{sIsI}", "missed", (json_int_t)(oldest - s->next_id),
                                   "from", (json_int_t)s->next_id);
        put(s, false, 0, "missed", missed);
        s->next_id = oldest;
    }
    for (; s->next_id <= ev->last_id; s->next_id++) {
        const devio_event_rec *r = &ev->ring[(s->next_id - 1) % ev->cap];
        if (!put(s, true, r->id, devio_event_kind_name(r->e.kind), event_json(r)))
            break;
    }
}

/* libmicrohttpd's content reader, on the HTTP thread. */
static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    devio_event_stream *s = cls;
    devio_events *ev = s->ev;
    (void)pos;
    ssize_t out = 0;
    pthread_mutex_lock(&ev->mu);
    if (s->off == s->len && !s->gone)
        fill(s);
    if (s->gone) {
        out = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (s->off < s->len) {
        size_t k = s->len - s->off < max ? s->len - s->off : max;
        memcpy(buf, s->buf + s->off, k);
        s->off += k;
        out = (ssize_t)k;
        s->idle_since_us = devio_clock_us();
    } else if (ev->closing) {
        out = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (devio_clock_us() - s->idle_since_us >= DEVIO_EVENTS_KEEPALIVE_MS * 1000ull) {
        static const char ka[] = ": keep-alive\n\n";
        size_t k = sizeof ka - 1 < max ? sizeof ka - 1 : max;
        memcpy(buf, ka, k);
        out = (ssize_t)k;
        s->idle_since_us = devio_clock_us();
    } else {
        /* Nothing to send: set aside until the notifier brings it back. */
        s->parked = true;
        MHD_suspend_connection(s->conn);
    }
    pthread_mutex_unlock(&ev->mu);
    return out;
}

/* libmicrohttpd frees the response: the stream leaves the list. */
static void free_stream(void *cls)
{
    devio_event_stream *s = cls;
    devio_events *ev = s->ev;
    pthread_mutex_lock(&ev->mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        ev->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    ev->n_subs--;
    pthread_mutex_unlock(&ev->mu);
    free(s);
}

devio_status devio_events_subscribe(devio_events *ev, struct MHD_Connection *c, int fd,
                                    bool resume, uint64_t after, struct MHD_Response **resp,
                                    devio_error *err)
{
    *resp = NULL;
    devio_event_stream *s = calloc(1, sizeof *s);
    if (!s)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an event stream");
    *s = (devio_event_stream){.ev = ev, .conn = c, .fd = fd, .idle_since_us = devio_clock_us()};
    pthread_mutex_lock(&ev->mu);
    devio_status st = DEVIO_OK;
    if (ev->closing)
        st = devio_fail(err, DEVIO_E_NOT_READY, "the server is stopping");
    else if (ev->n_subs >= ev->max_subs)
        st = devio_fail(err, DEVIO_E_TOO_MANY_CONNECTIONS,
                        "%u event streams are open (--event-subscribers)", ev->n_subs);
    if (st != DEVIO_OK) {
        pthread_mutex_unlock(&ev->mu);
        free(s);
        return st;
    }
    /* An id this process never gave (another process's) resumes from the oldest kept. */
    s->next_id = !resume ? ev->last_id + 1 : after <= ev->last_id ? after + 1 : 1;
    s->next = ev->streams;
    if (ev->streams)
        ev->streams->prev = s;
    ev->streams = s;
    ev->n_subs++;
    pthread_mutex_unlock(&ev->mu);
    *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BUF, read_stream, s,
                                              free_stream);
    if (!*resp) {
        free_stream(s);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an event stream");
    }
    return DEVIO_OK;
}
