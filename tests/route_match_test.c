/* route_match_test.c - the route matcher and devio-server's route table: captures, 404 against 405, labels, auth classes.
 * Pure table lookups; no server is started and no socket opened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "service/http/route_match.h"
#include "service/server.h"

static void test_parse_id(void **state)
{
    (void)state;
    uint64_t v = 1;
    assert_true(devio_route_parse_id("0", 1, &v));
    assert_int_equal(v, 0);
    assert_true(devio_route_parse_id("9223372036854775807", 19, &v));
    assert_int_equal(v, INT64_MAX);
    assert_false(devio_route_parse_id("9223372036854775808", 19, &v)); /* past INT64_MAX */
    assert_false(devio_route_parse_id("12345678901234567890", 20, &v));
    assert_false(devio_route_parse_id("", 0, &v));
    assert_false(devio_route_parse_id("12a", 3, &v));
    assert_false(devio_route_parse_id("-1", 2, &v));
}

static void test_path_match(void **state)
{
    (void)state;
    devio_route_params p;
    assert_true(devio_route_path_match("/v1/tickets/{id}/await", "/v1/tickets/42/await", &p));
    assert_int_equal(p.id, 42);
    /* Repeated and trailing slashes are ignored, as they always were. */
    assert_true(devio_route_path_match("/v1/facts", "//v1//facts/", &p));
    assert_true(devio_route_path_match("/v1/adapters/{name}/pin", "/v1/adapters/sql-r8/pin", &p));
    assert_int_equal(p.name_len, 6);
    assert_memory_equal(p.name, "sql-r8", 6);
    /* A segment in the {id} place that is no id still matches, marked bad (400, not 404). */
    assert_true(devio_route_path_match("/v1/tickets/{id}/await", "/v1/tickets/x/await", &p));
    assert_true(p.id_bad);
    assert_int_equal(p.id_len, 1);
    assert_true(devio_route_path_match("/v1/sequences/{id}", "/v1/sequences/18446744073709551616",
                                       &p));
    assert_true(p.id_bad);
    assert_true(devio_route_path_match("/v1/sequences/{id}", "/v1/sequences/7", &p));
    assert_false(p.id_bad);
    assert_false(devio_route_path_match("/v1/tickets/{id}/await", "/v1/tickets/1", &p));
    assert_false(devio_route_path_match("/v1/tickets/{id}/await", "/v1/tickets/1/await/more",
                                        &p));
    assert_false(devio_route_path_match("/v1/facts", "/v1/factsx", &p));
    assert_false(devio_route_path_match("/v1/facts", "/v1", &p));
    assert_false(devio_route_path_match("/healthz", "/", &p));
}

/* The answer the table gives: 0 found, 404 or 405; *label the route's template. */
static unsigned lookup(const char *method, const char *url, const char **label,
                       const devio_route **found)
{
    size_t n;
    const devio_route *table = devio_server_routes(&n), *on_path;
    devio_route_params p;
    *found = devio_route_find(table, n, method, url, &p, &on_path);
    *label = on_path ? on_path->path : "unknown";
    return *found ? 0 : on_path ? 405 : 404;
}

static void test_table_404_405(void **state)
{
    (void)state;
    const char *label;
    const devio_route *r;
    /* The e2e suite's unknown paths, every one 404 for GET and POST. */
    static const char *const unknown[] = {
        "/", "/v2/facts", "/v1", "/v1/nothing", "/v1/sequences/1/extra",
        "/v1/tickets/1/await/more", "/v1/tickets/1/x", "/healthz/x", "/v1/facts/1",
        "/v1/a/b/c/d/e/f/g"};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        assert_int_equal(lookup("GET", unknown[i], &label, &r), 404);
        assert_int_equal(lookup("POST", unknown[i], &label, &r), 404);
        assert_string_equal(label, "unknown");
    }
    /* Known paths with another method: 405, labelled with the path's template. */
    static const struct {
        const char *method, *url, *label;
    } wrong[] = {
        {"GET", "/v1/launch", "/v1/launch"},
        {"PUT", "/v1/launch", "/v1/launch"},
        {"DELETE", "/v1/facts", "/v1/facts"},
        {"PATCH", "/v1/sequences", "/v1/sequences"},
        {"PUT", "/v1/sequences/1", "/v1/sequences/{id}"},
        {"GET", "/v1/tickets/1/await", "/v1/tickets/{id}/await"},
        {"POST", "/v1/tickets", "/v1/tickets"},
        {"POST", "/v1/tickets/1", "/v1/tickets/{id}"},
        {"DELETE", "/v1/logits/1", "/v1/logits/{id}"},
        {"GET", "/v1/teardown", "/v1/teardown"},
        {"POST", "/v1/openapi.yaml", "/v1/openapi.yaml"},
        {"DELETE", "/v1/adapters", "/v1/adapters"},
        {"PATCH", "/v1/adapters/x", "/v1/adapters/{name}"},
        {"GET", "/v1/adapters/x/unpin", "/v1/adapters/{name}/unpin"},
        {"POST", "/healthz", "/healthz"},
        {"DELETE", "/readyz", "/readyz"},
        {"HEAD", "/metrics", "/metrics"},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        assert_int_equal(lookup(wrong[i].method, wrong[i].url, &label, &r), 405);
        assert_string_equal(label, wrong[i].label);
    }
}

static void test_table_routes(void **state)
{
    (void)state;
    const char *label;
    const devio_route *r;
    assert_int_equal(lookup("DELETE", "/v1/sequences/7", &label, &r), 0);
    assert_string_equal(r->path, "/v1/sequences/{id}");
    assert_int_equal(r->body, DEVIO_ROUTE_NO_BODY);
    assert_int_equal(lookup("PUT", "/v1/adapters/sql", &label, &r), 0);
    assert_int_equal(r->body, DEVIO_ROUTE_JSON_BODY);
    assert_int_equal(lookup("POST", "/v1/adapters/sql/unpin", &label, &r), 0);
    assert_string_equal(r->path, "/v1/adapters/{name}/unpin");
    /* Only launch and step are refused while draining. */
    size_t n;
    const devio_route *t = devio_server_routes(&n);
    unsigned draining = 0, health = 0;
    for (size_t i = 0; i < n; i++) {
        assert_non_null(t[i].handler);
        draining += t[i].refused_while_draining;
        health += t[i].auth == DEVIO_ROUTE_HEALTH;
        if (t[i].refused_while_draining)
            assert_true(strcmp(t[i].path, "/v1/launch") == 0 ||
                        strcmp(t[i].path, "/v1/step") == 0);
        if (t[i].auth != DEVIO_ROUTE_HEALTH)
            assert_int_equal(t[i].auth, DEVIO_ROUTE_TOKEN);
        /* No two entries for one method and path. */
        for (size_t j = i + 1; j < n; j++)
            assert_false(strcmp(t[i].method, t[j].method) == 0 &&
                         strcmp(t[i].path, t[j].path) == 0);
    }
    assert_int_equal(draining, 2);
    assert_int_equal(health, 3);
    /* One path, two bodies: POST /v1/sequences creates, or (application/octet-stream) imports
     * a state streamed to its sink, on a worker, keyed like the create. Only it has a second. */
    assert_int_equal(lookup("POST", "/v1/sequences", &label, &r), 0);
    const devio_route *imp = r->octet_stream;
    assert_non_null(imp);
    assert_string_equal(imp->method, "POST");
    assert_string_equal(imp->path, "/v1/sequences");
    assert_int_equal(imp->body, DEVIO_ROUTE_STREAM_BODY);
    assert_true(imp->keyed && imp->may_wait && imp->sink && imp->sink->open && imp->sink->write &&
                imp->sink->close);
    assert_null(imp->octet_stream);
    for (size_t i = 0; i < n; i++) {
        assert_true(!t[i].octet_stream || &t[i] == r);
        assert_true(t[i].body != DEVIO_ROUTE_STREAM_BODY && !t[i].sink);
    }
    assert_int_equal(lookup("GET", "/v1/sequences/3/state", &label, &r), 0);
    assert_string_equal(r->path, "/v1/sequences/{id}/state");
    assert_false(r->may_wait); /* opens at once; its bytes are made on workers (body_out.h) */
    assert_int_equal(lookup("POST", "/v1/sequences/3/state", &label, &r), 405);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_id),
        cmocka_unit_test(test_path_match),
        cmocka_unit_test(test_table_404_405),
        cmocka_unit_test(test_table_routes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
