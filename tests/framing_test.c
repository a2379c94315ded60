/* framing_test.c - Content-Length and Transfer-Encoding rules of service/http/framing.c: one reading or a refusal.
 * Pure: headers are fed as name/value pairs; no socket is opened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "service/http/framing.h"

/* Check the headers given as name, value, ..., NULL. */
static devio_status check(devio_framing *f, devio_error *err, ...)
{
    memset(f, 0, sizeof *f);
    memset(err, 0, sizeof *err);
    va_list ap;
    va_start(ap, err);
    for (const char *name; (name = va_arg(ap, const char *));)
        devio_framing_add(f, name, va_arg(ap, const char *));
    va_end(ap);
    return devio_framing_check(f, err);
}

static void test_one_reading_accepted(void **state)
{
    (void)state;
    devio_framing f;
    devio_error e;
    assert_int_equal(check(&f, &e, NULL), DEVIO_OK);
    assert_int_equal(check(&f, &e, "Host", "x", "content-length", "42", NULL), DEVIO_OK);
    assert_int_equal(f.n_length, 1);
    assert_int_equal(f.length, 42);
    assert_int_equal(check(&f, &e, "Content-Length", "18446744073709551615", NULL), DEVIO_OK);
    assert_true(f.length == UINT64_MAX);
    assert_int_equal(check(&f, &e, "TRANSFER-ENCODING", "Chunked", NULL), DEVIO_OK);
    assert_int_equal(f.n_encoding, 1);
}

static void test_two_lengths_refused(void **state)
{
    (void)state;
    devio_framing f;
    devio_error e;
    assert_int_equal(check(&f, &e, "Content-Length", "5", "Content-Length", "40", NULL),
                     DEVIO_E_BAD_FRAMING);
    assert_string_equal(e.detail_key, "content_length_headers");
    assert_int_equal(e.detail_val, 2);
    /* Equal values too: the rule is one header, not one value. */
    assert_int_equal(check(&f, &e, "Content-Length", "5", "content-length", "5", NULL),
                     DEVIO_E_BAD_FRAMING);
    assert_non_null(strstr(e.message, "Content-Length"));
}

static void test_length_with_encoding_refused(void **state)
{
    (void)state;
    devio_framing f;
    devio_error e;
    assert_int_equal(check(&f, &e, "Content-Length", "5", "Transfer-Encoding", "chunked", NULL),
                     DEVIO_E_BAD_FRAMING);
    assert_non_null(strstr(e.message, "together"));
    assert_int_equal(check(&f, &e, "Transfer-Encoding", "chunked", "Content-Length", "0", NULL),
                     DEVIO_E_BAD_FRAMING);
}

static void test_other_encodings_refused(void **state)
{
    (void)state;
    devio_framing f;
    devio_error e;
    const char *bad[] = {"gzip", "chunked, chunked", "gzip, chunked", "chunked ", "", "identity"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(check(&f, &e, "Transfer-Encoding", bad[i], NULL), DEVIO_E_BAD_FRAMING);
        assert_non_null(strstr(e.message, "only chunked"));
    }
    assert_int_equal(check(&f, &e, "Transfer-Encoding", "chunked", "Transfer-Encoding", "chunked",
                           NULL),
                     DEVIO_E_BAD_FRAMING);
    assert_string_equal(e.detail_key, "transfer_encoding_headers");
}

static void test_malformed_length_refused(void **state)
{
    (void)state;
    devio_framing f;
    devio_error e;
    const char *bad[] = {"", "-1", "+5", "5 ", "0x10", "5,5", "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(check(&f, &e, "Content-Length", bad[i], NULL), DEVIO_E_BAD_FRAMING);
}

/* Names as libmicrohttpd hands them over: "Transfer-Encoding : chunked"
 * keeps its space, a folded line is joined onto the name. */
static void test_bad_names_refused(void **state)
{
    (void)state;
    devio_framing f;
    devio_error e;
    const char *bad[] = {"Transfer-Encoding ", "Transfer-Encoding\t", "Content-Length ",
                         "X-Request-Id ", "Transfer-Encodingchunked", "content-lengthfoo", "",
                         "a:b", "X\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(check(&f, &e, bad[i], "chunked", NULL), DEVIO_E_BAD_FRAMING);
    assert_non_null(strstr(e.message, "not a token"));
    assert_int_equal(check(&f, &e, "X-Custom_Header.1~", "v", "Content-Length", "3", NULL),
                     DEVIO_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_reading_accepted),
        cmocka_unit_test(test_two_lengths_refused),
        cmocka_unit_test(test_length_with_encoding_refused),
        cmocka_unit_test(test_other_encodings_refused),
        cmocka_unit_test(test_malformed_length_refused),
        cmocka_unit_test(test_bad_names_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
