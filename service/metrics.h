/* metrics.h - counters devio-server exports in Prometheus text format.
 * Thread-safe under one mutex; never touches the device or the store. */
#ifndef DEVIO_METRICS_H
#define DEVIO_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

#define DEVIO_METRICS_ROUTES 32
#define DEVIO_METRICS_BUCKETS 12

typedef struct devio_metrics_http_count {
    const char *route; /* static string, a route template */
    unsigned code;
    uint64_t n;
} devio_metrics_http_count;

typedef struct devio_metrics {
    pthread_mutex_t mu;
    uint64_t tickets_launched, tickets_ok, tickets_failed, tickets_aborted;
    uint64_t tokens;
    uint64_t step_bucket[DEVIO_METRICS_BUCKETS + 1]; /* compute_us histogram, last = +Inf */
    double step_sum_s;
    uint64_t step_count;
    devio_metrics_http_count http[DEVIO_METRICS_ROUTES * 8];
    uint32_t n_http;
} devio_metrics;

void devio_metrics_init(devio_metrics *m);
void devio_metrics_fini(devio_metrics *m);
void devio_metrics_http(devio_metrics *m, const char *route, unsigned code);
void devio_metrics_step(devio_metrics *m, uint64_t compute_us, uint32_t tokens, bool ok);
void devio_metrics_launched(devio_metrics *m);
void devio_metrics_aborted(devio_metrics *m, uint32_t n);

/* The adapter families, read from the device at render time. */
typedef struct devio_metrics_adapters {
    uint32_t capacity;              /* max_loras: devio_adapters_capacity */
    uint32_t n_live;
    const devio_adapter_info *live; /* borrowed: the loaded adapters, for
                                       devio_adapter_rows_served_total{adapter} */
} devio_metrics_adapters;

/* The ticket store's health, read from the store at render time. */
typedef struct devio_metrics_store {
    bool writable;
    uint64_t errors;         /* writes and heartbeats that failed */
    int64_t last_success_ms; /* unix ms of the last commit */
} devio_metrics_store;

/* Render everything plus the device gauges, the adapter families and the
 * store's health (facts and adapters may be NULL after teardown; then those
 * are left out; store may be NULL). Returns a malloc'd NUL-terminated text;
 * caller frees. */
char *devio_metrics_render(devio_metrics *m, const devio_facts *facts,
                           const devio_metrics_adapters *adapters,
                           const devio_metrics_store *store);

#endif
