/* metrics.h - counters and histograms devio-server exports in Prometheus text format.
 * Thread-safe under one mutex; never touches the device or the store. */
#ifndef DEVIO_METRICS_H
#define DEVIO_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/hist.h" /* every histogram of the server is a devio_hist */
#include "device/devio.h"

#define DEVIO_METRICS_ROUTES 32
#define DEVIO_METRICS_PENDING 64 /* the core's largest max_depth: tickets launched, not awaited */

typedef struct devio_metrics_http_count {
    const char *route; /* static string, a route template */
    unsigned code;
    uint64_t n;
} devio_metrics_http_count;

typedef struct devio_metrics_http_route {
    const char *route; /* static string, a route template */
    devio_hist seconds;
} devio_metrics_http_route;

/* A launched ticket's tokens by row shape, kept until it settles. */
typedef struct devio_metrics_pending {
    uint64_t ticket; /* 0 = free */
    uint64_t prefill, decode;
} devio_metrics_pending;

typedef struct devio_metrics {
    pthread_mutex_t mu;
    uint64_t tickets_launched, tickets_ok, tickets_failed, tickets_aborted;
    uint64_t reaped_lease, reaped_closed; /* tickets the server settled for nobody */
    uint64_t tokens_prefill, tokens_decode;              /* of steps settled ok */
    uint64_t tokens_sampled_step, tokens_sampled_effect; /* sampled tokens handed out */
    devio_hist step_seconds;  /* compute_us of steps settled ok */
    devio_hist queue_seconds; /* queued_us of steps settled ok */
    devio_hist batch_rows;    /* rows per step settled ok */
    devio_hist batch_tokens;  /* tokens per step settled ok */
    devio_metrics_pending pending[DEVIO_METRICS_PENDING];
    devio_metrics_http_count http[DEVIO_METRICS_ROUTES * 8];
    uint32_t n_http;
    devio_metrics_http_route http_route[DEVIO_METRICS_ROUTES];
    uint32_t n_http_route;
    char backend[32]; /* devio_build_info's backend label; "" until set */
    uint64_t errors[DEVIO_STATUS_COUNT]; /* error answers by status (errors[0] unused) */
    uint64_t connections_refused; /* the listener's 503 too_many_connections, as last read */
    uint32_t event_subscribers;   /* GET /v1/events streams open, as last read */
} devio_metrics;

void devio_metrics_init(devio_metrics *m);
void devio_metrics_fini(devio_metrics *m);
/* The backend running (devio_device_info.backend), for devio_build_info. */
void devio_metrics_set_backend(devio_metrics *m, const char *backend);
/* One answer: its route label, status code and the seconds from the
 * request's first access-handler call to its response being queued. */
void devio_metrics_http(devio_metrics *m, const char *route, unsigned code, double seconds);
/* A plan's tokens by row shape: a row of one token is decode, a longer row
 * prefill (ticket 0: the caller sets it). */
devio_metrics_pending devio_metrics_shape(const devio_plan *plan);
/* A launch the device took (p->ticket): counts it and keeps its shape until
 * it settles. */
void devio_metrics_launched(devio_metrics *m, const devio_metrics_pending *p);
/* An await that settled `ticket`: r is the result when it settled ok, NULL
 * when it failed. */
void devio_metrics_settled(devio_metrics *m, uint64_t ticket, const devio_step_result *r);
/* The server settled `ticket` for nobody: its lease ran out (closed false)
 * or the connection of its /v1/step closed before the answer (closed true). */
void devio_metrics_reaped(devio_metrics *m, uint64_t ticket, bool closed);
/* n tickets aborted at teardown: every ticket in flight. */
void devio_metrics_aborted(devio_metrics *m, uint32_t n);
/* n tokens sampled by a sample effect. */
void devio_metrics_sampled(devio_metrics *m, uint32_t n);
/* One error answer of the HTTP layer, counted by its code
 * (devio_http_errors_total{code}); DEVIO_OK and values outside the enum are
 * ignored. */
void devio_metrics_error(devio_metrics *m, devio_status s);
/* The connections the accept thread has refused with 503
 * too_many_connections so far (it counts them itself, before any HTTP):
 * added to that code's count at render. */
void devio_metrics_set_connections_refused(devio_metrics *m, uint64_t n);
/* GET /v1/events streams open now (service/events.h), for devio_event_subscribers. */
void devio_metrics_set_event_subscribers(devio_metrics *m, uint32_t n);

/* The device's limits and memory, read from it at render time beside its
 * facts. */
typedef struct devio_metrics_device {
    devio_facts facts;
    uint32_t max_seqs;       /* the sequence table's size (--max-seqs) */
    uint32_t logits_handles; /* live logits handles allowed (--logits-handles) */
    uint64_t memory_total;   /* devio_device_info's: bytes of device memory, 0 on a CPU */
    uint64_t memory_used;    /* bytes the backend holds */
} devio_metrics_device;

/* The adapter families, read from the device at render time. */
typedef struct devio_metrics_adapters {
    uint32_t capacity;              /* max_loras: devio_adapters_capacity */
    uint32_t n_live;
    const devio_adapter_record *live; /* borrowed: the loaded adapters, for
                                       devio_adapter_rows_served_total{adapter} */
} devio_metrics_adapters;

/* The ticket store's health, read from the store at render time. */
typedef struct devio_metrics_store {
    bool writable;
    uint64_t errors;         /* writes and heartbeats that failed */
    int64_t last_success_ms; /* unix ms of the last commit */
    devio_hist commit_seconds; /* the store's transactions by duration */
} devio_metrics_store;

/* Render everything plus the device gauges, the adapter families, the store's
 * health, the process families and devio_ready (what /readyz answers:
 * `ready`). The device and adapters may be NULL after teardown; then those are
 * left out; store may be NULL. Returns a malloc'd NUL-terminated text; caller
 * frees. */
char *devio_metrics_render(devio_metrics *m, const devio_metrics_device *device,
                           const devio_metrics_adapters *adapters,
                           const devio_metrics_store *store, bool ready);

#endif
