/* metrics.c - Prometheus counters, a step latency histogram and device gauges.
 * Only counts and prints; it must never block on anything but its own mutex. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/metrics.h"

/* Upper bounds of the step latency buckets, seconds. */
static const double bucket_le[DEVIO_METRICS_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                        0.025,  0.05,  0.1,    0.25,  0.5,
                                                        1.0,    2.5};

void devio_metrics_init(devio_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void devio_metrics_fini(devio_metrics *m) { pthread_mutex_destroy(&m->mu); }

void devio_metrics_http(devio_metrics *m, const char *route, unsigned code)
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
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_step(devio_metrics *m, uint64_t compute_us, uint32_t tokens, bool ok)
{
    double s = (double)compute_us / 1e6;
    pthread_mutex_lock(&m->mu);
    if (ok) {
        m->tickets_ok++;
        m->tokens += tokens;
        int b = 0;
        while (b < DEVIO_METRICS_BUCKETS && s > bucket_le[b])
            b++;
        m->step_bucket[b]++;
        m->step_sum_s += s;
        m->step_count++;
    } else {
        m->tickets_failed++;
    }
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_launched(devio_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->tickets_launched++;
    pthread_mutex_unlock(&m->mu);
}

void devio_metrics_aborted(devio_metrics *m, uint32_t n)
{
    pthread_mutex_lock(&m->mu);
    m->tickets_aborted += n;
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

char *devio_metrics_render(devio_metrics *m, const devio_facts *f,
                           const devio_metrics_adapters *ad, const devio_metrics_store *st)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    if (!o)
        return NULL;
    pthread_mutex_lock(&m->mu);
    fprintf(o, "# HELP devio_tickets_total Tickets by final status (launched counts every launch).\n"
               "# TYPE devio_tickets_total counter\n");
    fprintf(o, "devio_tickets_total{status=\"launched\"} %llu\n",
            (unsigned long long)m->tickets_launched);
    fprintf(o, "devio_tickets_total{status=\"ok\"} %llu\n", (unsigned long long)m->tickets_ok);
    fprintf(o, "devio_tickets_total{status=\"failed\"} %llu\n",
            (unsigned long long)m->tickets_failed);
    fprintf(o, "devio_tickets_total{status=\"aborted\"} %llu\n",
            (unsigned long long)m->tickets_aborted);
    fprintf(o, "# HELP devio_tokens_processed_total Tokens computed by settled steps.\n"
               "# TYPE devio_tokens_processed_total counter\n"
               "devio_tokens_processed_total %llu\n",
            (unsigned long long)m->tokens);
    fprintf(o, "# HELP devio_step_seconds Compute time of settled steps.\n"
               "# TYPE devio_step_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < DEVIO_METRICS_BUCKETS; b++) {
        cum += m->step_bucket[b];
        fprintf(o, "devio_step_seconds_bucket{le=\"%g\"} %llu\n", bucket_le[b],
                (unsigned long long)cum);
    }
    cum += m->step_bucket[DEVIO_METRICS_BUCKETS];
    fprintf(o, "devio_step_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    fprintf(o, "devio_step_seconds_sum %.6f\ndevio_step_seconds_count %llu\n", m->step_sum_s,
            (unsigned long long)m->step_count);
    fprintf(o, "# HELP devio_http_requests_total HTTP requests by route and status code.\n"
               "# TYPE devio_http_requests_total counter\n");
    for (uint32_t i = 0; i < m->n_http; i++)
        fprintf(o, "devio_http_requests_total{route=\"%s\",code=\"%u\"} %llu\n", m->http[i].route,
                m->http[i].code, (unsigned long long)m->http[i].n);
    pthread_mutex_unlock(&m->mu);
    if (f) {
        struct {
            const char *name, *help;
            uint64_t v;
        } g[] = {
            {"devio_kv_blocks_total", "KV cache blocks.", f->blocks_total},
            {"devio_kv_blocks_free", "Free KV cache blocks.", f->blocks_free},
            {"devio_kv_blocks_shared", "KV blocks held by more than one sequence.",
             f->blocks_shared},
            {"devio_ssm_slots_total", "SSM state slots.", f->ssm_slots_total},
            {"devio_ssm_slots_used", "SSM state slots in use.", f->ssm_slots_used},
            {"devio_ssm_snapshots_total", "SSM snapshot slots.", f->ssm_snapshots_total},
            {"devio_ssm_snapshots_used", "SSM snapshot slots in use.", f->ssm_snapshots_used},
            {"devio_tickets_in_flight", "Tickets launched and not yet awaited.",
             f->tickets_in_flight},
            {"devio_logits_live", "Live logits handles.", f->logits_live},
            {"devio_adapters_loaded", "LoRA adapters loaded.", f->adapters_loaded},
            {"devio_epoch", "Process epoch (bumped per start).", f->epoch},
        };
        for (size_t i = 0; i < sizeof g / sizeof *g; i++)
            fprintf(o, "# HELP %s %s\n# TYPE %s gauge\n%s %llu\n", g[i].name, g[i].help,
                    g[i].name, g[i].name, (unsigned long long)g[i].v);
    }
    if (ad) {
        fprintf(o, "# HELP devio_adapters_capacity LoRA adapters that fit at once (max_loras).\n"
                   "# TYPE devio_adapters_capacity gauge\ndevio_adapters_capacity %u\n",
                ad->capacity);
        /* A count of the adapter's current load: it starts again from 0 when the
         * adapter is loaded again, which Prometheus reads as a counter reset. */
        fprintf(o, "# HELP devio_adapter_rows_served_total Plan rows launched with a loaded "
                   "adapter since it was loaded.\n"
                   "# TYPE devio_adapter_rows_served_total counter\n");
        for (uint32_t i = 0; i < ad->n_live; i++) {
            fputs("devio_adapter_rows_served_total{adapter=\"", o);
            put_label(o, ad->live[i].name);
            fprintf(o, "\"} %llu\n", (unsigned long long)ad->live[i].rows_served);
        }
    }
    if (st)
        fprintf(o, "# HELP devio_store_errors_total Ticket store writes that failed.\n"
                   "# TYPE devio_store_errors_total counter\ndevio_store_errors_total %llu\n"
                   "# HELP devio_store_last_success_timestamp_seconds Unix time of the ticket "
                   "store's last commit.\n"
                   "# TYPE devio_store_last_success_timestamp_seconds gauge\n"
                   "devio_store_last_success_timestamp_seconds %.3f\n"
                   "# HELP devio_store_writable 1 while the ticket store commits writes, 0 while "
                   "they fail.\n"
                   "# TYPE devio_store_writable gauge\ndevio_store_writable %d\n",
                (unsigned long long)st->errors, (double)st->last_success_ms / 1000.0,
                st->writable ? 1 : 0);
    fprintf(o, "# HELP devio_up 1 while the device serves, 0 after teardown.\n"
               "# TYPE devio_up gauge\ndevio_up %d\n",
            f ? 1 : 0);
    fclose(o);
    return buf;
}
