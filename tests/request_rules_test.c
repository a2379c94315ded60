/* request_rules_test.c - service/http/request_rules.h: JSON depth, media types, the bearer token, Allow lists, request ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "service/http/request_rules.h"
#include "service/server.h"

static void test_json_depth(void **state)
{
    (void)state;
    assert_int_equal(devio_http_json_size("{}", 2).depth, 1);
    assert_int_equal(devio_http_json_size("{\"a\":[[1],{\"b\":[]}]}", 20).depth, 4);
    assert_int_equal(devio_http_json_size("\"[[[\\\"[\"", 8).depth, 0); /* brackets in a string */
    assert_int_equal(devio_http_json_size("", 0).depth, 0);
    /* Values and names: commas and colons outside strings, plus one. */
    const char *bias = "{\"1\":-1,\"2\":-2}", *str = "\"a,b:c\"";
    assert_int_equal(devio_http_json_size(bias, strlen(bias)).values, 4);
    assert_int_equal(devio_http_json_size("[1,2,3]", 7).values, 3);
    assert_int_equal(devio_http_json_size(str, strlen(str)).values, 1);
    assert_int_equal(devio_http_json_size("", 0).values, 0);
}

static void test_media_type(void **state)
{
    (void)state;
    devio_error err = {0};
    static const char *const ok[] = {NULL, "application/json", "Application/JSON",
                                     "application/json; charset=utf-8",
                                     "application/problem+json", "application/vnd.x+json;v=2"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        assert_int_equal(devio_http_json_media_type(ok[i], &err), DEVIO_OK);
    static const char *const bad[] = {"text/plain", "application/x-www-form-urlencoded",
                                      "application/jsonx", "application/+json", "", "json"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(devio_http_json_media_type(bad[i], &err), DEVIO_E_MEDIA_TYPE);
        assert_non_null(strstr(err.message, "--json"));
    }
}

/* The body an octet_stream entry takes (a state imported by POST /v1/sequences). */
static void test_octet_stream(void **state)
{
    (void)state;
    static const char *const yes[] = {"application/octet-stream", "Application/Octet-Stream",
                                      "application/octet-stream; charset=binary",
                                      "application/octet-stream\t;x=1"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        assert_true(devio_http_octet_stream(yes[i]));
    static const char *const no[] = {NULL, "", "application/json", "application/octet-streams",
                                     "application/octet", "text/octet-stream"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        assert_false(devio_http_octet_stream(no[i]));
}

static void test_bearer(void **state)
{
    (void)state;
    const char *tok = "s3cret";
    size_t n = strlen(tok);
    assert_true(devio_http_bearer_ok("Bearer s3cret", tok, n));
    assert_true(devio_http_bearer_ok("bearer   s3cret", tok, n));
    assert_true(devio_http_bearer_ok("BEARER s3cret", tok, n));
    assert_false(devio_http_bearer_ok("Bearers3cret", tok, n));
    assert_false(devio_http_bearer_ok("Bearer s3cre", tok, n));
    assert_false(devio_http_bearer_ok("Bearer s3cret2", tok, n));
    assert_false(devio_http_bearer_ok("Basic s3cret", tok, n));
    assert_false(devio_http_bearer_ok("Bearer", tok, n));
    assert_false(devio_http_bearer_ok(NULL, tok, n));
    assert_false(devio_http_bearer_ok("Bearer s3cret", NULL, 0));
}

static void test_allowed(void **state)
{
    (void)state;
    size_t n;
    const devio_route *t = devio_server_routes(&n);
    char buf[48];
    devio_http_allowed_methods(t, n, "/v1/sequences/{id}", buf, sizeof buf);
    assert_string_equal(buf, "GET, HEAD, DELETE");
    devio_http_allowed_methods(t, n, "/v1/launch", buf, sizeof buf);
    assert_string_equal(buf, "POST");
    devio_http_allowed_methods(t, n, "/nowhere", buf, sizeof buf);
    assert_string_equal(buf, "");
    char small[8];
    devio_http_allowed_methods(t, n, "/v1/adapters/{name}", small, sizeof small);
    assert_true(strlen(small) < sizeof small); /* cut whole, never overflowed */
}

static void test_request_id(void **state)
{
    (void)state;
    char out[DEVIO_REQUEST_ID_MAX + 1];
    devio_http_request_id("abc-1.2:3", 7, 9, out, sizeof out);
    assert_string_equal(out, "abc-1.2:3");
    devio_http_request_id(NULL, 0x1f, 0x2a, out, sizeof out);
    assert_string_equal(out, "1f-2a");
    static const char *const bad[] = {"", "a b", "q\"", "back\\slash", "tab\tx", "\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        devio_http_request_id(bad[i], 2, 3, out, sizeof out);
        assert_string_equal(out, "2-3");
    }
    char longest[DEVIO_REQUEST_ID_MAX + 2];
    memset(longest, 'x', sizeof longest - 1);
    longest[DEVIO_REQUEST_ID_MAX] = '\0';
    devio_http_request_id(longest, 2, 3, out, sizeof out);
    assert_string_equal(out, longest);
    longest[DEVIO_REQUEST_ID_MAX] = 'x';
    longest[DEVIO_REQUEST_ID_MAX + 1] = '\0';
    devio_http_request_id(longest, 2, 4, out, sizeof out);
    assert_string_equal(out, "2-4");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_depth), cmocka_unit_test(test_media_type),
        cmocka_unit_test(test_bearer),     cmocka_unit_test(test_allowed),
        cmocka_unit_test(test_request_id), cmocka_unit_test(test_octet_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
