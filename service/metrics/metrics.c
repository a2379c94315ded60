/* metrics.c - Prometheus counters, histograms, device gauges and process families in text format 0.0.4.
 * Only counts and prints; it must never block on anything but its own mutex. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"
#include "service/metrics/metrics.h"
#include "service/metrics/process_metrics.h"

/* Upper bounds of the step and HTTP seconds histograms (compute, queue, request):
 * 0.5 ms to 60 s, so that a slow step on a big model still lands in a bucket.
 * The store's commit histogram has its own, finer ones (store_health.c). */
static const double seconds_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                    0.25,   0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
/* Rows per step: powers of two up to 1024 (--max-rows is 64 by default). */
static const double rows_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
/* Tokens per step: powers of two up to 32768 (--max-batch-tokens is 2048 by default). */
static const double tokens_le[] = {1,   2,   4,    8,    16,   32,   64,    128,
                                   256, 512, 1024, 2048, 4096, 8192, 16384, 32768};

#define N_OF(a) ((uint32_t)(sizeof(a) / sizeof *(a)))

_Static_assert(N_OF(seconds_le) <= DEVIO_HIST_MAX, "seconds_le fits a devio_hist");
_Static_assert(N_OF(rows_le) <= DEVIO_HIST_MAX, "rows_le fits a devio_hist");
_Static_assert(N_OF(tokens_le) <= DEVIO_HIST_MAX, "tokens_le fits a devio_hist");

void devio_metrics_init(devio_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->step_seconds = devio_hist_make(seconds_le, N_OF(seconds_le));
    m->queue_seconds = devio_hist_make(seconds_le, N_OF(seconds_le));
    m->batch_rows = devio_hist_make(rows_le, N_OF(rows_le));
    m->batch_tokens = devio_hist_make(tokens_le, N_OF(tokens_le));
}

void devio_metrics_fini(devio_metrics *m) { pthread_mutex_destroy(&m->mu); }

void devio_metrics_set_backend(devio_metrics *m, const char *backend)
{
    pthread_mutex_lock(&m->mu);
    snprintf(m->backend, sizeof m->backend, "%s", backend ? backend : "");
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_http(devio_metrics *m, const char *route, unsigned code, double seconds)
{
    pthread_mutex_lock(&m->mu);
    uint32_t i = 0;
    for (; i < m->n_http; i++)
        if (m->http[i].code == code && strcmp(m->http[i].route, route) == 0)
            break;
    if (i == m->n_http && m->n_http < sizeof m->http / sizeof *m->http)
        m->http[m->n_http++] = (devio_metrics_http_count){.route = route, .code = code};
    if (i < m->n_http)
        m->http[i].n++;
    uint32_t r = 0;
    for (; r < m->n_http_route; r++)
        if (strcmp(m->http_route[r].route, route) == 0)
            break;
    if (r == m->n_http_route && r < DEVIO_METRICS_ROUTES)
        m->http_route[m->n_http_route++] = (devio_metrics_http_route){
            .route = route, .seconds = devio_hist_make(seconds_le, N_OF(seconds_le))};
    if (r < m->n_http_route)
        devio_hist_observe(&m->http_route[r].seconds, seconds);
    pthread_mutex_unlock(&m->mu);
}

devio_metrics_pending devio_metrics_shape(const devio_plan *plan)
{
    devio_metrics_pending p = {0};
    for (uint32_t i = 0; i < plan->n_rows; i++) {
        if (plan->rows[i].n_tokens == 1)
            p.decode++;
        else
            p.prefill += plan->rows[i].n_tokens;
    }
    return p;
}

void devio_metrics_launched(devio_metrics *m, const devio_metrics_pending *shape)
{
    devio_metrics_pending p = *shape;
    pthread_mutex_lock(&m->mu);
    m->tickets_launched++;
    /* A free slot always exists while tickets in flight stay within the
     * core's max_depth (at most DEVIO_METRICS_PENDING); were none free, the
     * ticket is classified from its result when it settles. */
    for (uint32_t i = 0; i < DEVIO_METRICS_PENDING; i++)
        if (m->pending[i].ticket == 0) {
            m->pending[i] = p;
            break;
        }
    pthread_mutex_unlock(&m->mu);
}

/* Take the pending entry of `ticket`; false when there is none. Under mu. */
static bool take_pending(devio_metrics *m, uint64_t ticket, devio_metrics_pending *out)
{
    for (uint32_t i = 0; i < DEVIO_METRICS_PENDING; i++)
        if (ticket != 0 && m->pending[i].ticket == ticket) {
            *out = m->pending[i];
            m->pending[i] = (devio_metrics_pending){0};
            return true;
        }
    return false;
}

void devio_metrics_reaped(devio_metrics *m, uint64_t ticket, bool closed)
{
    pthread_mutex_lock(&m->mu);
    devio_metrics_pending p;
    take_pending(m, ticket, &p);
    if (closed)
        m->reaped_closed++;
    else
        m->reaped_lease++;
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_settled(devio_metrics *m, uint64_t ticket, const devio_step_result *r)
{
    pthread_mutex_lock(&m->mu);
    devio_metrics_pending p;
    bool known = take_pending(m, ticket, &p);
    if (!r) {
        m->tickets_failed++;
        pthread_mutex_unlock(&m->mu);
        return;
    }
    m->tickets_ok++;
    if (!known) {
        bool all_decode = r->n_tokens == r->n_rows;
        p.decode = all_decode ? r->n_tokens : 0;
        p.prefill = all_decode ? 0 : r->n_tokens;
    }
    m->tokens_prefill += p.prefill;
    m->tokens_decode += p.decode;
    for (uint32_t i = 0; i < r->n_rows; i++)
        m->tokens_sampled_step += r->rows[i].sampled ? 1u : 0u;
    devio_hist_observe(&m->step_seconds, (double)r->compute_us / 1e6);
    devio_hist_observe(&m->queue_seconds, (double)r->queued_us / 1e6);
    devio_hist_observe(&m->batch_rows, (double)r->n_rows);
    devio_hist_observe(&m->batch_tokens, (double)r->n_tokens);
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_aborted(devio_metrics *m, uint32_t n)
{
    pthread_mutex_lock(&m->mu);
    m->tickets_aborted += n;
    /* Teardown aborts every ticket in flight: none of them settles. */
    memset(m->pending, 0, sizeof m->pending);
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_sampled(devio_metrics *m, uint32_t n)
{
    pthread_mutex_lock(&m->mu);
    m->tokens_sampled_effect += n;
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_error(devio_metrics *m, devio_status s)
{
    if (s <= DEVIO_OK || s >= DEVIO_STATUS_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->errors[s]++;
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_set_connections_refused(devio_metrics *m, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    m->connections_refused = n;
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_set_event_subscribers(devio_metrics *m, uint32_t n)
{
    pthread_mutex_lock(&m->mu);
    m->event_subscribers = n;
    pthread_mutex_unlock(&m->mu);
}

/* A label value in the exposition format: backslash, quote and newline escaped. */
static void put_label(FILE *o, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(o, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", o);
        else
            fputc(*v, o);
    }
}

static void family(FILE *o, const char *name, const char *type, const char *help)
{
    fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram's samples. `label` is "" or `name="value"` (already escaped),
 * put before le in every bucket and on _sum and _count. */
static void put_hist(FILE *o, const char *name, const char *label, const devio_hist *h)
{
    const char *sep = label[0] ? "," : "";
    uint64_t cum = 0;
    for (uint32_t b = 0; b < h->n_le; b++) {
        cum += h->bucket[b];
        fprintf(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, label, sep, h->le[b],
                (unsigned long long)cum);
    }
    cum += h->bucket[h->n_le];
    fprintf(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, label, sep, (unsigned long long)cum);
    const char *open = label[0] ? "{" : "", *close = label[0] ? "}" : "";
    fprintf(o, "%s_sum%s%s%s %.6f\n%s_count%s%s%s %llu\n", name, open, label, close, h->sum,
            name, open, label, close, (unsigned long long)h->count);
}

static void put_counter(FILE *o, const char *name, const char *label, uint64_t v)
{
    fprintf(o, "%s%s%s%s %llu\n", name, label[0] ? "{" : "", label, label[0] ? "}" : "",
            (unsigned long long)v);
}

/* The families the server counts itself. Under mu. */
static void put_counted(FILE *o, const devio_metrics *m)
{
    family(o, "devio_build_info", "gauge", "Always 1; labels name the version and the backend.");
    fprintf(o, "devio_build_info{version=\"%s\",backend=\"", DEVIO_VERSION);
    put_label(o, m->backend);
    fputs("\"} 1\n", o);

    family(o, "devio_tickets_launched_total", "counter", "Tickets the device took at launch.");
    put_counter(o, "devio_tickets_launched_total", "", m->tickets_launched);
    family(o, "devio_tickets_settled_total", "counter",
           "Tickets by how they ended: ok, failed (awaited with an error), aborted (teardown),"
           " reaped (settled by the server for nobody).");
    put_counter(o, "devio_tickets_settled_total", "status=\"ok\"", m->tickets_ok);
    put_counter(o, "devio_tickets_settled_total", "status=\"failed\"", m->tickets_failed);
    put_counter(o, "devio_tickets_settled_total", "status=\"aborted\"", m->tickets_aborted);
    put_counter(o, "devio_tickets_settled_total", "status=\"reaped\"",
                m->reaped_lease + m->reaped_closed);
    family(o, "devio_tickets_reaped_total", "counter",
           "Tickets the server settled for nobody, by why: lease (not awaited within"
           " --ticket-lease-ms of settling), closed (the /v1/step connection closed first).");
    put_counter(o, "devio_tickets_reaped_total", "reason=\"lease\"", m->reaped_lease);
    put_counter(o, "devio_tickets_reaped_total", "reason=\"closed\"", m->reaped_closed);

    family(o, "devio_tokens_processed_total", "counter",
           "Tokens computed by steps settled ok, by row shape: prefill (rows of two or more "
           "tokens) or decode (rows of one token).");
    put_counter(o, "devio_tokens_processed_total", "kind=\"prefill\"", m->tokens_prefill);
    put_counter(o, "devio_tokens_processed_total", "kind=\"decode\"", m->tokens_decode);
    family(o, "devio_tokens_sampled_total", "counter",
           "Tokens sampled: in a step's row (source step) or by a sample effect (source effect).");
    put_counter(o, "devio_tokens_sampled_total", "source=\"step\"", m->tokens_sampled_step);
    put_counter(o, "devio_tokens_sampled_total", "source=\"effect\"", m->tokens_sampled_effect);

    family(o, "devio_step_seconds", "histogram", "Compute time of steps settled ok.");
    put_hist(o, "devio_step_seconds", "", &m->step_seconds);
    family(o, "devio_step_queue_seconds", "histogram",
           "Time from launch to the start of compute of steps settled ok.");
    put_hist(o, "devio_step_queue_seconds", "", &m->queue_seconds);
    family(o, "devio_step_batch_rows", "histogram", "Plan rows per step settled ok.");
    put_hist(o, "devio_step_batch_rows", "", &m->batch_rows);
    family(o, "devio_step_batch_tokens", "histogram", "Plan tokens per step settled ok.");
    put_hist(o, "devio_step_batch_tokens", "", &m->batch_tokens);

    family(o, "devio_http_requests_total", "counter", "HTTP requests by route and status code.");
    for (uint32_t i = 0; i < m->n_http; i++)
        fprintf(o, "devio_http_requests_total{route=\"%s\",code=\"%u\"} %llu\n", m->http[i].route,
                m->http[i].code, (unsigned long long)m->http[i].n);
    /* Every code, 0 included, so that a rate over one exists before its first error. */
    family(o, "devio_http_errors_total", "counter",
           "HTTP answers that were errors, by the error body's code.");
    for (int c = DEVIO_OK + 1; c < DEVIO_STATUS_COUNT; c++) {
        uint64_t n = m->errors[c];
        if (c == DEVIO_E_TOO_MANY_CONNECTIONS)
            n += m->connections_refused;
        fprintf(o, "devio_http_errors_total{code=\"%s\"} %llu\n",
                devio_status_str((devio_status)c), (unsigned long long)n);
    }
    family(o, "devio_http_request_duration_seconds", "histogram",
           "HTTP requests by route: time from the request's arrival to its response being "
           "queued.");
    for (uint32_t i = 0; i < m->n_http_route; i++) {
        char label[160];
        snprintf(label, sizeof label, "route=\"%s\"", m->http_route[i].route);
        put_hist(o, "devio_http_request_duration_seconds", label, &m->http_route[i].seconds);
    }
}

static void put_facts(FILE *o, const devio_metrics_device *dev)
{
    const devio_facts *f = &dev->facts;
    struct {
        const char *name, *help;
        uint64_t v;
    } g[] = {
        {"devio_kv_blocks_capacity", "KV cache blocks in the pool.", f->blocks_total},
        {"devio_kv_blocks_free", "Free KV cache blocks.", f->blocks_free},
        {"devio_kv_blocks_shared", "KV blocks held by more than one sequence.",
         f->blocks_shared},
        {"devio_ssm_slots_capacity", "SSM state slots.", f->ssm_slots_total},
        {"devio_ssm_slots_used", "SSM state slots in use.", f->ssm_slots_used},
        {"devio_ssm_snapshots_capacity", "SSM snapshot slots.", f->ssm_snapshots_total},
        {"devio_ssm_snapshots_used", "SSM snapshot slots in use.", f->ssm_snapshots_used},
        {"devio_tickets_in_flight", "Tickets launched and not yet awaited.",
         f->tickets_in_flight},
        {"devio_logits_live", "Live logits handles.", f->logits_live},
        {"devio_logits_rows_live", "Logits positions held by live handles.",
         f->logits_rows_live},
        {"devio_logits_capacity", "Live logits handles allowed at once (logits_handles).",
         dev->logits_handles},
        {"devio_sequences_live", "Sequences created and not yet freed.", f->seqs_live},
        {"devio_sequences_parked", "Sequences parked in host memory (the park effect).",
         f->seqs_parked},
        {"devio_parked_bytes", "Host bytes the parked sequences' states take (--park-memory).",
         f->parked_bytes},
        {"devio_sequences_capacity", "Sequences that may live at once (max_seqs).",
         dev->max_seqs},
        {"devio_device_memory_total_bytes",
         "Bytes of device memory (GET /v1/device's memory_total); 0 on a CPU backend.",
         dev->memory_total},
        {"devio_device_memory_used_bytes",
         "Bytes of device memory the backend holds: KV pool, buffers, weight copies.",
         dev->memory_used},
        {"devio_adapters_loaded", "LoRA adapters loaded.", f->adapters_loaded},
        {"devio_epoch", "Process epoch (bumped per start).", f->epoch},
    };
    for (size_t i = 0; i < sizeof g / sizeof *g; i++) {
        family(o, g[i].name, "gauge", g[i].help);
        fprintf(o, "%s %llu\n", g[i].name, (unsigned long long)g[i].v);
    }
    double used = f->blocks_total ? (double)(f->blocks_total - f->blocks_free) /
                                        (double)f->blocks_total
                                  : 0.0;
    family(o, "devio_kv_usage_ratio", "gauge",
           "KV cache blocks in use over blocks in the pool, 0 to 1.");
    fprintf(o, "devio_kv_usage_ratio %.6g\n", used);
}

static void put_adapters(FILE *o, const devio_metrics_adapters *ad)
{
    family(o, "devio_adapters_capacity", "gauge", "LoRA adapters that fit at once (max_loras).");
    fprintf(o, "devio_adapters_capacity %u\n", ad->capacity);
    /* A count of the adapter's current load: it starts again from 0 when the
     * adapter is loaded again, which Prometheus reads as a counter reset. */
    family(o, "devio_adapter_rows_served_total", "counter",
           "Plan rows launched with a loaded adapter since it was loaded.");
    for (uint32_t i = 0; i < ad->n_live; i++) {
        fputs("devio_adapter_rows_served_total{adapter=\"", o);
        put_label(o, ad->live[i].name);
        fprintf(o, "\"} %llu\n", (unsigned long long)ad->live[i].rows_served);
    }
}

static void put_store(FILE *o, const devio_metrics_store *st)
{
    family(o, "devio_store_errors_total", "counter",
           "Ticket store writes (and recovery heartbeats) that failed.");
    put_counter(o, "devio_store_errors_total", "", st->errors);
    family(o, "devio_store_last_success_timestamp_seconds", "gauge",
           "Unix time of the ticket store's last commit.");
    fprintf(o, "devio_store_last_success_timestamp_seconds %.3f\n",
            (double)st->last_success_ms / 1000.0);
    family(o, "devio_store_writable", "gauge",
           "1 while the ticket store commits writes, 0 while they fail.");
    fprintf(o, "devio_store_writable %d\n", st->writable ? 1 : 0);
    family(o, "devio_store_commit_seconds", "histogram",
           "Ticket store transactions that committed (one per group commit), BEGIN to COMMIT.");
    put_hist(o, "devio_store_commit_seconds", "", &st->commit_seconds);
}

char *devio_metrics_render(devio_metrics *m, const devio_metrics_device *f,
                           const devio_metrics_adapters *ad, const devio_metrics_store *st,
                           bool ready)
{
    devio_process_stats ps;
    devio_process_stats_read(&ps);
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    if (!o)
        return NULL;
    pthread_mutex_lock(&m->mu);
    put_counted(o, m);
    uint32_t subscribers = m->event_subscribers;
    pthread_mutex_unlock(&m->mu);
    if (f)
        put_facts(o, f);
    if (ad)
        put_adapters(o, ad);
    if (st)
        put_store(o, st);
    family(o, "devio_up", "gauge", "1 while the device serves, 0 after teardown.");
    fprintf(o, "devio_up %d\n", f ? 1 : 0);
    family(o, "devio_ready", "gauge", "1 while GET /readyz answers 200, else 0.");
    fprintf(o, "devio_ready %d\n", ready ? 1 : 0);
    family(o, "devio_event_subscribers", "gauge", "GET /v1/events streams open.");
    fprintf(o, "devio_event_subscribers %u\n", subscribers);
    devio_process_stats_write(o, &ps);
    if (fclose(o) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
