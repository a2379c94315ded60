/* metrics_test.c - service/metrics/metrics.c: histograms, the ticket and token counters, and the rendered exposition.
 * Renders real text and reads it back; process families from this test's own /proc/self. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/version.h"
#include "service/metrics/metrics.h"

/* The value of the sample line that starts with `key` followed by a space;
 * fails the test when there is none. */
static double sample(const char *text, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, key, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    fail_msg("no sample %s", key);
    return 0;
}

static bool has_line_starting(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0)
            return true;
    return false;
}

static devio_metrics_device some_device(void)
{
    return (devio_metrics_device){
        .facts = {.block_size = 16, .blocks_total = 40, .blocks_free = 30, .blocks_shared = 2,
                  .tickets_in_flight = 1, .epoch = 3, .seqs_live = 5, .logits_live = 2},
        .max_seqs = 256, .logits_handles = 64, .memory_total = 80ull << 30,
        .memory_used = 3ull << 30};
}

static void test_hist_bounds(void **state)
{
    (void)state;
    static const double le[] = {1, 2, 4};
    devio_hist h = devio_hist_make(le, 3);
    devio_hist_observe(&h, 0.5);
    devio_hist_observe(&h, 1.0); /* le is inclusive */
    devio_hist_observe(&h, 3.0);
    devio_hist_observe(&h, 4.5);
    assert_int_equal(h.bucket[0], 2);
    assert_int_equal(h.bucket[1], 0);
    assert_int_equal(h.bucket[2], 1);
    assert_int_equal(h.bucket[3], 1); /* above every bound: +Inf */
    assert_int_equal(h.count, 4);
    assert_true(h.sum == 9.0);
}

static void test_tickets_and_tokens(void **state)
{
    (void)state;
    devio_metrics m;
    devio_metrics_init(&m);
    int32_t toks[5] = {1, 2, 3, 4, 5};
    devio_row rows[] = {{.seq = 1, .tokens = toks, .n_tokens = 5},
                        {.seq = 2, .tokens = toks, .n_tokens = 1},
                        {.seq = 3, .tokens = toks, .n_tokens = 1}};
    devio_plan plan = {.rows = rows, .n_rows = 3};
    devio_metrics_launched(&m, &(devio_metrics_pending){.ticket = 11, .prefill = devio_metrics_shape(&plan).prefill, .decode = devio_metrics_shape(&plan).decode});
    devio_metrics_launched(&m, &(devio_metrics_pending){.ticket = 12, .prefill = devio_metrics_shape(&plan).prefill, .decode = devio_metrics_shape(&plan).decode});
    devio_row_result rr[3] = {{.seq = 1, .sampled = true}, {.seq = 2}, {.seq = 3, .sampled = true}};
    devio_step_result r = {.ticket = 11, .n_rows = 3, .rows = rr, .queued_us = 1500,
                           .compute_us = 45000000, .n_tokens = 7};
    devio_metrics_settled(&m, 11, &r);
    devio_metrics_settled(&m, 12, NULL);
    devio_metrics_sampled(&m, 4);
    assert_int_equal(m.tickets_launched, 2);
    assert_int_equal(m.tickets_ok, 1);
    assert_int_equal(m.tickets_failed, 1);
    assert_int_equal(m.tokens_prefill, 5);
    assert_int_equal(m.tokens_decode, 2);
    assert_int_equal(m.tokens_sampled_step, 2);
    assert_int_equal(m.tokens_sampled_effect, 4);
    for (uint32_t i = 0; i < DEVIO_METRICS_PENDING; i++)
        assert_int_equal(m.pending[i].ticket, 0);

    /* Aborted tickets leave nothing pending; one settling anyway (never, in
     * the server) is classified from its result alone. */
    devio_metrics_launched(&m, &(devio_metrics_pending){.ticket = 13, .prefill = devio_metrics_shape(&plan).prefill, .decode = devio_metrics_shape(&plan).decode});
    devio_metrics_aborted(&m, 1);
    assert_int_equal(m.tickets_aborted, 1);
    for (uint32_t i = 0; i < DEVIO_METRICS_PENDING; i++)
        assert_int_equal(m.pending[i].ticket, 0);
    devio_step_result d = {.ticket = 13, .n_rows = 3, .rows = rr, .n_tokens = 3};
    devio_metrics_settled(&m, 13, &d);
    assert_int_equal(m.tokens_decode, 5);

    char *text = devio_metrics_render(&m, NULL, NULL, NULL, false);
    assert_non_null(text);
    assert_true(sample(text, "devio_tickets_launched_total") == 3);
    assert_true(sample(text, "devio_tickets_settled_total{status=\"ok\"}") == 2);
    assert_true(sample(text, "devio_tickets_settled_total{status=\"failed\"}") == 1);
    assert_true(sample(text, "devio_tickets_settled_total{status=\"aborted\"}") == 1);
    assert_true(sample(text, "devio_tokens_processed_total{kind=\"prefill\"}") == 5);
    assert_true(sample(text, "devio_tokens_processed_total{kind=\"decode\"}") == 5);
    assert_true(sample(text, "devio_tokens_sampled_total{source=\"step\"}") == 4);
    assert_true(sample(text, "devio_tokens_sampled_total{source=\"effect\"}") == 4);
    /* A 45 s step lands below 60 s; buckets are cumulative and end at count. */
    assert_true(sample(text, "devio_step_seconds_bucket{le=\"30\"}") == 1); /* the 0 s one */
    assert_true(sample(text, "devio_step_seconds_bucket{le=\"60\"}") == 2);
    assert_true(sample(text, "devio_step_seconds_bucket{le=\"+Inf\"}") == 2);
    assert_true(sample(text, "devio_step_seconds_count") == 2);
    assert_true(sample(text, "devio_step_queue_seconds_bucket{le=\"0.001\"}") == 1);
    assert_true(sample(text, "devio_step_queue_seconds_bucket{le=\"0.0025\"}") == 2);
    assert_true(sample(text, "devio_step_batch_rows_bucket{le=\"2\"}") == 0);
    assert_true(sample(text, "devio_step_batch_rows_bucket{le=\"4\"}") == 2);
    assert_true(sample(text, "devio_step_batch_tokens_bucket{le=\"4\"}") == 1);
    assert_true(sample(text, "devio_step_batch_tokens_bucket{le=\"8\"}") == 2);
    assert_true(sample(text, "devio_step_batch_tokens_sum") == 10);
    /* After teardown: no device gauges, devio_up and devio_ready 0. */
    assert_false(has_line_starting(text, "devio_kv_"));
    assert_false(has_line_starting(text, "devio_adapters_capacity"));
    assert_true(sample(text, "devio_up") == 0);
    assert_true(sample(text, "devio_ready") == 0);
    free(text);
    devio_metrics_fini(&m);
}

static void test_http_latency_by_route(void **state)
{
    (void)state;
    devio_metrics m;
    devio_metrics_init(&m);
    devio_metrics_http(&m, "/v1/step", 200, 0.002);
    devio_metrics_http(&m, "/v1/step", 409, 0.0001);
    devio_metrics_http(&m, "/v1/tickets/{id}/await", 200, 12.0);
    char *text = devio_metrics_render(&m, NULL, NULL, NULL, true);
    assert_non_null(text);
    assert_true(sample(text, "devio_http_requests_total{route=\"/v1/step\",code=\"200\"}") == 1);
    assert_true(sample(text, "devio_http_requests_total{route=\"/v1/step\",code=\"409\"}") == 1);
    assert_true(sample(text, "devio_http_request_duration_seconds_count{route=\"/v1/step\"}") ==
                2);
    assert_true(sample(text, "devio_http_request_duration_seconds_bucket{route=\"/v1/step\","
                             "le=\"0.0005\"}") == 1);
    assert_true(sample(text, "devio_http_request_duration_seconds_bucket{route=\"/v1/tickets/"
                             "{id}/await\",le=\"10\"}") == 0);
    assert_true(sample(text, "devio_http_request_duration_seconds_bucket{route=\"/v1/tickets/"
                             "{id}/await\",le=\"30\"}") == 1);
    assert_true(sample(text, "devio_ready") == 1);
    free(text);
    devio_metrics_fini(&m);
}

static void test_device_gauges_build_info_and_names(void **state)
{
    (void)state;
    devio_metrics m;
    devio_metrics_init(&m);
    devio_metrics_set_backend(&m, "re\"f");
    devio_metrics_device f = some_device();
    devio_adapter_record live[1] = {{.name = "a", .rows_served = 7}};
    devio_metrics_adapters ad = {.capacity = 4, .n_live = 1, .live = live};
    devio_metrics_store st = {.writable = false, .errors = 5, .last_success_ms = 1500};
    char *text = devio_metrics_render(&m, &f, &ad, &st, true);
    assert_non_null(text);
    assert_non_null(strstr(text, "devio_build_info{version=\"" DEVIO_VERSION
                                 "\",backend=\"re\\\"f\"} 1\n"));
    assert_true(sample(text, "devio_kv_blocks_capacity") == 40);
    assert_true(sample(text, "devio_kv_blocks_free") == 30);
    assert_true(sample(text, "devio_kv_usage_ratio") == 0.25);
    assert_true(sample(text, "devio_tickets_in_flight") == 1);
    assert_true(sample(text, "devio_epoch") == 3);
    assert_true(sample(text, "devio_sequences_live") == 5);
    assert_true(sample(text, "devio_sequences_capacity") == 256);
    assert_true(sample(text, "devio_logits_live") == 2);
    assert_true(sample(text, "devio_logits_capacity") == 64);
    assert_true(sample(text, "devio_device_memory_total_bytes") == (double)(80ull << 30));
    assert_true(sample(text, "devio_device_memory_used_bytes") == (double)(3ull << 30));
    assert_true(sample(text, "devio_adapters_capacity") == 4);
    assert_true(sample(text, "devio_adapter_rows_served_total{adapter=\"a\"}") == 7);
    assert_true(sample(text, "devio_up") == 1);
    assert_true(sample(text, "devio_store_errors_total") == 5);
    assert_true(sample(text, "devio_store_writable") == 0);
    assert_true(sample(text, "devio_store_last_success_timestamp_seconds") == 1.5);

    /* Prometheus's naming rule: counters end in _total, nothing else does. */
    int families = 0;
    for (const char *p = strstr(text, "# TYPE "); p; p = strstr(p + 1, "# TYPE ")) {
        char name[128], type[32];
        assert_int_equal(sscanf(p, "# TYPE %127s %31s", name, type), 2);
        size_t n = strlen(name);
        bool total = n > 6 && strcmp(name + n - 6, "_total") == 0;
        assert_true(total == (strcmp(type, "counter") == 0));
        families++;
    }
    assert_true(families > 30);
    free(text);
    devio_metrics_fini(&m);
}

/* Error answers by code: every code exported from 0, the listener's refusals
 * added to too_many_connections, nothing counted for DEVIO_OK or a value
 * outside the enum; after teardown (no device) the device families go. */
static void test_errors_by_code(void **state)
{
    (void)state;
    devio_metrics m;
    devio_metrics_init(&m);
    char *text = devio_metrics_render(&m, NULL, NULL, NULL, true);
    assert_non_null(text);
    for (int c = DEVIO_OK + 1; c < DEVIO_STATUS_COUNT; c++) {
        char key[96];
        snprintf(key, sizeof key, "devio_http_errors_total{code=\"%s\"}",
                 devio_status_str((devio_status)c));
        assert_true(sample(text, key) == 0);
    }
    assert_false(has_line_starting(text, "devio_sequences_live"));
    assert_false(has_line_starting(text, "devio_device_memory_used_bytes"));
    free(text);
    devio_metrics_error(&m, DEVIO_E_OUT_OF_KV_BLOCKS);
    devio_metrics_error(&m, DEVIO_E_OUT_OF_KV_BLOCKS);
    devio_metrics_error(&m, DEVIO_E_NOT_READY);
    devio_metrics_error(&m, DEVIO_E_TOO_MANY_CONNECTIONS);
    devio_metrics_error(&m, DEVIO_OK);
    devio_metrics_error(&m, DEVIO_STATUS_COUNT);
    devio_metrics_set_connections_refused(&m, 4);
    devio_metrics_set_connections_refused(&m, 6); /* a total, not an increment */
    text = devio_metrics_render(&m, NULL, NULL, NULL, true);
    assert_non_null(text);
    assert_true(sample(text, "devio_http_errors_total{code=\"out_of_kv_blocks\"}") == 2);
    assert_true(sample(text, "devio_http_errors_total{code=\"not_ready\"}") == 1);
    assert_true(sample(text, "devio_http_errors_total{code=\"too_many_connections\"}") == 7);
    assert_true(sample(text, "devio_http_errors_total{code=\"seq_busy\"}") == 0);
    assert_non_null(strstr(text, "# TYPE devio_http_errors_total counter\n"));
    free(text);
    devio_metrics_fini(&m);
}

static void test_process_families(void **state)
{
    (void)state;
    devio_metrics m;
    devio_metrics_init(&m);
    char *text = devio_metrics_render(&m, NULL, NULL, NULL, true);
    assert_non_null(text);
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur != RLIM_INFINITY)
        assert_true(sample(text, "process_max_fds") == (double)rl.rlim_cur);
    assert_true(sample(text, "process_open_fds") >= 3);
    assert_true(sample(text, "process_resident_memory_bytes") > 0);
    assert_true(sample(text, "process_virtual_memory_bytes") >=
                sample(text, "process_resident_memory_bytes"));
    assert_true(sample(text, "process_cpu_seconds_total") >= 0);
    double start = sample(text, "process_start_time_seconds");
    double now = (double)time(NULL);
    assert_true(start <= now + 1 && start > now - 3600);
    free(text);
    devio_metrics_fini(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hist_bounds),
        cmocka_unit_test(test_tickets_and_tokens),
        cmocka_unit_test(test_http_latency_by_route),
        cmocka_unit_test(test_device_gauges_build_info_and_names),
        cmocka_unit_test(test_errors_by_code),
        cmocka_unit_test(test_process_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
