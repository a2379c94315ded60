/* server.h - devio-server: HTTP routes over one device, one store, one model.
 * HTTP threads never compute and never wait for a step: they decode, call the device (whose worker
 * computes) and encode; an await whose step has not settled parks its connection (parked_awaits.h). */
#ifndef DEVIO_SERVER_H
#define DEVIO_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "device/devio.h"
#include "device/model/model.h"
#include "device/backend/registry.h"
#include "service/adapters.h"
#include "service/tickets/parked_awaits.h"
#include "service/config.h"
#include "service/events.h"
#include "service/tickets/leases.h"
#include "service/http/listener.h"
#include "service/metrics/metrics.h"
#include "service/http/offload.h"
#include "service/routes/keys.h"
#include "service/http/route_match.h"
#include "service/state_cursors.h"
#include "service/store/store.h"
#include "service/tickets/tickets.h"
#include "service/http/tls.h"

typedef struct devio_server {
    devio_server_config cfg;
    devio_model *model;        /* owned */
    devio_registry registry;   /* owned: the backend plugins loaded; closed after teardown */
    devio_device *dev;         /* owned; NULL after teardown */
    pthread_rwlock_t dev_lock; /* readers: every device call; writer: teardown */
    devio_store *store;        /* owned */
    devio_adapters adapters;   /* adapter commands: device table + store rows */
    devio_tickets tickets;     /* steps: device + history rows + metrics */
    devio_metrics metrics;
    devio_waits waits;         /* requests parked until their ticket settles (the device's
                                  on_settled hook) or their history row is written (the
                                  store's on_written hook) */
    devio_keys keys;           /* Idempotency-Keys of requests under way (keys.h) */
    pthread_mutex_t cursors_mu;/* guards cursors */
    devio_state_cursor *cursors; /* state exports and imports under way (state_cursors.h),
                                  closed by a teardown before it frees the device */
    devio_events events;       /* the device's events for GET /v1/events (events.h): started
                                  before the device, stopped after the daemon */
    devio_offload offload;     /* workers running the routes that may wait */
    bool offload_started;
    devio_leases leases;       /* launched tickets until taken; the reaper (abandoned.c) */
    atomic_int launching;      /* launches between their begin and end halves */
    pthread_mutex_t launch_mu; /* guards launches and every end half run from the list */
    devio_ticket_op *launches; /* LAUNCHING ops whose row is being written (launches.c) */
    atomic_bool tearing;       /* a teardown waits for them: new launches refused */
    struct MHD_Daemon *mhd;
    devio_listener listener;   /* accepts, applies the connection limits and the header
                                  deadline; hands sockets to mhd */
    bool listening;            /* listener opened */
    devio_tls tls;             /* certificate and key when serving HTTPS; kept until the
                                  daemon stops */
    char *token;               /* owned copy; NULL = no auth */
    size_t token_len;
    atomic_bool ready;
    atomic_bool draining;      /* SIGTERM seen: launches refused, awaits served */
    atomic_int active;         /* requests being handled, parked awaits included */
    atomic_int awaiting;       /* awaits and steps between their first look at the ticket
                                  and their answer, parked or not */
    uint16_t port;             /* bound port (useful with port 0) */
    uint64_t max_body_values;  /* JSON values and names a body may hold (server.c, parse_body) */
    atomic_uint_fast64_t request_seq; /* the last request id generated in this epoch */
} devio_server;

/* Load the model, open the store and the device, start listening.
 * On failure everything opened so far is closed and err says why. */
devio_status devio_server_start(devio_server *s, const devio_server_config *cfg,
                                devio_error *err);

/* Drain: unready and refusing launches at once, still serving everything
 * else, until no ticket is in flight and no request in progress, or
 * cfg.drain_ms passes. Then stop accepting, tear the device down (tickets
 * still in flight recorded as aborted) and close the store. */
void devio_server_stop(devio_server *s);

/* The device for one call, under the read lock: DEVIO_OK with *dev set and
 * the lock held (end with devio_server_release), or DEVIO_E_TORN_DOWN with
 * nothing held. */
devio_status devio_server_hold(devio_server *s, devio_device **dev, devio_error *err);
void devio_server_release(devio_server *s);

/* The HTTP half of start (server.c): the listener on `sa` and the daemon
 * serving it, accepting; s->port set. On failure what it opened stays for
 * devio_server_http_stop. */
devio_status devio_server_http_start(devio_server *s, const devio_listen_addr *sa,
                                     devio_error *err);
/* Stop accepting, stop the daemon (every connection closed), free the listener. */
void devio_server_http_stop(devio_server *s);
/* How parked requests are suspended and resumed: libmicrohttpd's calls. */
extern const devio_waits_ops devio_server_mhd_waits;

/* The route table: *n entries, static. */
const devio_route *devio_server_routes(size_t *n);

/* Tear the device down under the write lock (the state exports and imports under way
 * closed first), then record its unawaited tickets as aborted with `reason`. Launches
 * half made are let finish first (their rows are being written; new ones are refused
 * meanwhile). False when it was already torn down. */
bool devio_server_teardown(devio_server *s, const char *reason, uint32_t *aborted);

/* ---- launches whose row is being written (launches.c) ------------------------

 * The end half of a launch (commit or cancel) runs on the store's writer
 * thread as soon as its row is written, never on an HTTP thread: a thread
 * blocked in an effect that waits for reserved tickets (devio_apply) could
 * otherwise hold up the very launch it waits for. */

/* op (LAUNCHING) is listed; ended at once when its row is already written. */
void devio_launches_track(devio_server *s, devio_ticket_op *op);
/* Whether op is still listed, its end half not yet run. */
bool devio_launches_pending(devio_server *s, devio_ticket_op *op);
/* op's phase, read under the list's lock: while op is listed the store's
 * writer may be ending it (its phase passes through NONE before AWAITING),
 * so a request reads its own op's phase only through this. */
devio_op_phase devio_launches_phase(devio_server *s, devio_ticket_op *op);
/* Unlist op when it is listed (true): its request ends without it. */
bool devio_launches_untrack(devio_server *s, devio_ticket_op *op);
/* Run the end half of op (LAUNCHING, listed under the list's lock or no
 * longer listed): waits for its row, commits or cancels; the outcome lands in
 * op (phase, st, err) and s->launching drops. */
void devio_launches_end(devio_server *s, devio_ticket_op *op);
/* The store's on_written hook: end every listed launch whose row is done,
 * then resume the requests parked on those writes. */
void devio_server_written(void *s, uint64_t done);

/* ---- tickets nobody will take (abandoned.c) ---------------------------------- */

/* The reaper's ops (leases.h), with the server as ctx. */
extern const devio_leases_ops devio_server_reaper;
/* A request ends (its connection closed, or it was answered) holding `op`:
 * finish what it holds without waiting on this thread. A /v1/step's ticket
 * is reaped once it settles; an await's stays awaitable. */
void devio_server_abandon(devio_server *s, devio_ticket_op *op);
/* The device's on_settled hook: resume the awaits parked on `ticket` and
 * start its lease. */
void devio_server_settled(void *s, uint64_t ticket);

#endif
