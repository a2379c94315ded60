/* events.h - the device's events kept for GET /v1/events: a bounded ring filled by the device's
 * on_event hook and read by server-sent-event streams. The hook never waits on a stream and never
 * allocates; a slow or stalled stream only loses events (told as `missed`). */
#ifndef DEVIO_SERVICE_EVENTS_H
#define DEVIO_SERVICE_EVENTS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <microhttpd.h>

#include "device/devio.h"

/* An adapter's name or a failure's message kept with its event (longer ones cut). */
#define DEVIO_EVENTS_NAME_MAX 128
/* A stream idle this long gets a keep-alive comment line. */
#define DEVIO_EVENTS_KEEPALIVE_MS 15000u

/* One event as kept: fixed size, so that the hook copies and never allocates. */
typedef struct devio_event_rec {
    uint64_t id;
    devio_event e; /* e.name unused here: see name */
    char name[DEVIO_EVENTS_NAME_MAX];
} devio_event_rec;

typedef struct devio_event_stream devio_event_stream; /* one subscriber, opaque */

typedef struct devio_events {
    pthread_mutex_t mu;     /* guards everything below; held briefly, never across a call out */
    pthread_cond_t wake;    /* an event arrived, or closing */
    devio_event_rec *ring;  /* owned: cap records; id i at ring[(i - 1) % cap] */
    uint32_t cap;
    uint64_t last_id;       /* the newest event's id; 0 before the first */
    uint64_t epoch;         /* this process's epoch (the store's), told in `hello` */
    uint32_t max_subs, n_subs;
    devio_event_stream *streams; /* the open streams, linked through their own nodes */
    bool closing;           /* streams end and new ones are refused */
    bool stop;              /* the notifier thread ends */
    bool started;
    pthread_t notifier;     /* resumes parked streams: on events, keep-alives, gone clients */
} devio_events;

/* Ring of cap events (>= 1), at most max_subs streams. On failure nothing is held. */
devio_status devio_events_start(devio_events *ev, uint32_t cap, uint32_t max_subs,
                                uint64_t epoch, devio_error *err);
/* The device's on_event hook (ctx: the devio_events): copies e into the ring and wakes the
 * notifier. Called under the device lock; takes only ev->mu, briefly. */
void devio_events_hook(void *ctx, const devio_event *e);
/* End every open stream (each sends what it has and closes) and refuse new ones. */
void devio_events_close(devio_events *ev);
/* After the daemon has stopped (no stream left): stop the notifier and free the ring. Safe on
 * an events never started. */
void devio_events_stop(devio_events *ev);
/* Streams open now. */
uint32_t devio_events_subscribers(devio_events *ev);

/* A stream for connection c (fd: its socket) resuming after event `after` (0: from the oldest
 * kept; resume false: new events only). *resp: libmicrohttpd's response (chunked), which owns
 * the stream; DEVIO_E_TOO_MANY_CONNECTIONS over the limit, DEVIO_E_NOT_READY while closing. */
devio_status devio_events_subscribe(devio_events *ev, struct MHD_Connection *c, int fd,
                                    bool resume, uint64_t after, struct MHD_Response **resp,
                                    devio_error *err);

/* The SSE kind name of an event kind ("seq_created", ...). */
const char *devio_event_kind_name(devio_event_kind k);

#endif
