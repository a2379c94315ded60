/* log_test.c - common/log.h: JSON lines that parse, text lines, levels, and long or hostile strings cut safely. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

/* Everything logged so far into buf (NUL-terminated), from a temporary file. */
static size_t read_all(FILE *f, char *buf, size_t n)
{
    fflush(f);
    rewind(f);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = '\0';
    return got;
}

static FILE *capture(void)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    devio_log_set_fd(fileno(f));
    return f;
}

static void test_json_lines(void **state)
{
    (void)state;
    FILE *f = capture();
    devio_log_configure("devio-test", DEVIO_LOG_JSON, DEVIO_LOG_INFO);
    devio_log_field fl[] = {DEVIO_LF_S("path", "/v1/\"x\"\n"), DEVIO_LF_U("status", 200),
                            DEVIO_LF_I("delta", -3), DEVIO_LF_F("ms", 0.25),
                            DEVIO_LF_S("request_id", NULL)};
    devio_logf(DEVIO_LOG_INFO, "access", fl, 5, "GET %s", "/v1/facts\t!");
    devio_log(DEVIO_LOG_DEBUG, "hidden", "below the level");
    static char buf[16384];
    read_all(f, buf, sizeof buf);
    assert_non_null(strchr(buf, '\n'));
    assert_null(strchr(strchr(buf, '\n') + 1, '\n')); /* one line: debug was dropped */
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "level")), "info");
    assert_string_equal(json_string_value(json_object_get(j, "logger")), "devio-test");
    assert_string_equal(json_string_value(json_object_get(j, "event")), "access");
    assert_string_equal(json_string_value(json_object_get(j, "msg")), "GET /v1/facts\t!");
    assert_string_equal(json_string_value(json_object_get(j, "path")), "/v1/\"x\"\n");
    assert_int_equal(json_integer_value(json_object_get(j, "status")), 200);
    assert_int_equal(json_integer_value(json_object_get(j, "delta")), -3);
    assert_true(json_real_value(json_object_get(j, "ms")) == 0.25);
    assert_true(json_is_null(json_object_get(j, "request_id")));
    const char *t = json_string_value(json_object_get(j, "time"));
    assert_int_equal(strlen(t), 24); /* 2026-12-03T10:20:50.123Z */
    assert_int_equal(t[23], 'Z');
    json_decref(j);
    fclose(f);
}

/* A message and fields far past the line's size still make one valid JSON line. */
static void test_json_cut(void **state)
{
    (void)state;
    FILE *f = capture();
    devio_log_configure("devio-test", DEVIO_LOG_JSON, DEVIO_LOG_DEBUG);
    static char big[20000];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = "a\"\\\n\x01"[i % 5];
    devio_log_field fl[12];
    for (int i = 0; i < 12; i++)
        fl[i] = DEVIO_LF_S("k", big);
    devio_logf(DEVIO_LOG_ERROR, "cut", fl, 12, "%s", big);
    static char buf[16384];
    size_t n = read_all(f, buf, sizeof buf);
    assert_true(n <= 4096 && n > 1000);
    assert_int_equal(buf[n - 1], '\n');
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "event")), "cut");
    json_decref(j);
    fclose(f);
}

static void test_text_lines(void **state)
{
    (void)state;
    FILE *f = capture();
    devio_log_configure("devio-test", DEVIO_LOG_TEXT, DEVIO_LOG_WARN);
    devio_log(DEVIO_LOG_INFO, "start", "dropped");
    devio_log_field fl[] = {DEVIO_LF_S("file", "/x/y.db"), DEVIO_LF_U("failed", 3)};
    devio_logf(DEVIO_LOG_WARN, "store", fl, 2, "writes failing:\n%s", "disk full");
    static char buf[4096];
    read_all(f, buf, sizeof buf);
    const char *p = strstr(buf, " warn devio-test store: writes failing:\\ndisk full file=/x/y.db failed=3\n");
    assert_non_null(p);
    assert_int_equal(p - buf, 24); /* after the time */
    assert_null(strstr(buf, "dropped"));
    fclose(f);
    devio_log_set_fd(-1);
    devio_log_configure("devio-test", DEVIO_LOG_TEXT, DEVIO_LOG_INFO);
}

/* A pipe nobody reads: lines are dropped at once (never a blocked writer),
 * counted, and the next line that fits says how many were lost. */
static void test_full_pipe_drops(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    devio_log_set_fd(fds[1]);
    devio_log_configure("devio-test", DEVIO_LOG_TEXT, DEVIO_LOG_INFO);
    static char big[3000];
    memset(big, 'x', sizeof big - 1);
    for (int i = 0; i < 200; i++) /* 600 KB into a 64 KB pipe: would block without the check */
        devio_log(DEVIO_LOG_INFO, "fill", "%s", big);
    uint64_t dropped = devio_log_dropped();
    assert_true(dropped > 100);
    /* Drain what the pipe took, then one more line. */
    static char sink[1 << 17];
    ssize_t got = read(fds[0], sink, sizeof sink);
    assert_true(got > 0);
    while (got == (ssize_t)sizeof sink)
        got = read(fds[0], sink, sizeof sink);
    devio_log(DEVIO_LOG_WARN, "after", "drained");
    static char tail[8192];
    ssize_t n = read(fds[0], tail, sizeof tail - 1);
    assert_true(n > 0);
    tail[n] = '\0';
    char want[96];
    snprintf(want, sizeof want, "devio log: %llu lines dropped", (unsigned long long)dropped);
    assert_non_null(strstr(tail, want));
    assert_non_null(strstr(tail, "after: drained"));
    assert_int_equal(devio_log_dropped(), 0);
    devio_log_set_fd(-1);
    close(fds[0]);
    close(fds[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_lines),
        cmocka_unit_test(test_json_cut),
        cmocka_unit_test(test_text_lines),
        cmocka_unit_test(test_full_pipe_drops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
