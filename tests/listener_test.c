/* listener_test.c - service/listener.c over real loopback sockets: per-address and total caps answered 503, the header deadline, slots given back.
 * The HTTP loop is played by a table that records the sockets handed over; every wait is bounded. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "service/listener.h"

#define MAX_HELD 16

/* The stand-in for libmicrohttpd: holds each socket handed over and reports it started. */
typedef struct loop {
    devio_listener *l;
    pthread_mutex_t mu;
    int fd[MAX_HELD];
    devio_conn *conn[MAX_HELD];
    int n;
} loop;

static bool loop_add(void *ctx, int fd, const struct sockaddr *sa, socklen_t len)
{
    (void)sa;
    (void)len;
    loop *lp = ctx;
    devio_conn *c = devio_listener_started(lp->l, fd);
    pthread_mutex_lock(&lp->mu);
    assert_true(lp->n < MAX_HELD);
    lp->fd[lp->n] = fd;
    lp->conn[lp->n] = c;
    lp->n++;
    pthread_mutex_unlock(&lp->mu);
    return true;
}

static int loop_count(loop *lp)
{
    pthread_mutex_lock(&lp->mu);
    int n = lp->n;
    pthread_mutex_unlock(&lp->mu);
    return n;
}

/* Wait (at most 3 s) until n sockets were handed over. */
static void loop_wait(loop *lp, int n)
{
    for (int i = 0; i < 300 && loop_count(lp) < n; i++)
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    assert_int_equal(loop_count(lp), n);
}

/* The loop closes socket i, reporting it first as libmicrohttpd does. */
static void loop_close(loop *lp, int i)
{
    devio_listener_closed(lp->l, lp->conn[i]);
    close(lp->fd[i]);
    lp->fd[i] = -1;
}

static void start(devio_listener *l, loop *lp, uint32_t max, uint32_t per, uint32_t header_ms)
{
    memset(lp, 0, sizeof *lp);
    pthread_mutex_init(&lp->mu, NULL);
    lp->l = l;
    devio_listener_config cfg = {.max_connections = max, .max_per_address = per,
                                 .header_timeout_ms = header_ms};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    devio_error err = {0};
    assert_int_equal(devio_listener_open(l, &cfg, &sa, &err), DEVIO_OK);
    assert_true(l->port != 0);
    assert_int_equal(devio_listener_run(l, loop_add, lp, &err), DEVIO_OK);
}

static void finish(devio_listener *l, loop *lp)
{
    devio_listener_stop(l);
    for (int i = 0; i < lp->n; i++)
        if (lp->fd[i] >= 0)
            loop_close(lp, i);
    devio_listener_free(l);
    pthread_mutex_destroy(&lp->mu);
}

static int dial(const devio_listener *l, const char *from)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &src.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof src), 0);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(l->port)};
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&dst, sizeof dst), 0);
    return fd;
}

/* What fd reads until end of stream, at most limit_ms; *ms is how long that took.
 * Returns the byte count, or -1 when the stream did not end in time. */
static int read_to_end(int fd, char *buf, size_t cap, int limit_ms, uint64_t *ms)
{
    uint64_t t0 = devio_clock_us();
    size_t n = 0;
    for (;;) {
        int left = limit_ms - (int)((devio_clock_us() - t0) / 1000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) != 1)
            return -1;
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    if (ms)
        *ms = (devio_clock_us() - t0) / 1000;
    return (int)n;
}

static void test_caps_answer_503(void **state)
{
    (void)state;
    devio_listener l;
    loop lp;
    start(&l, &lp, 4, 2, 0);
    int a1 = dial(&l, "127.0.0.1"), a2 = dial(&l, "127.0.0.1");
    loop_wait(&lp, 2);
    /* A third from the same address: answered and closed, never handed over. */
    char buf[2048];
    int c3 = dial(&l, "127.0.0.1");
    assert_true(read_to_end(c3, buf, sizeof buf, 2000, NULL) > 0);
    assert_non_null(strstr(buf, "HTTP/1.1 503 Service Unavailable\r\n"));
    assert_non_null(strstr(buf, "Connection: close\r\n"));
    assert_non_null(strstr(buf, "\"code\":\"too_many_connections\""));
    assert_non_null(strstr(buf, "\"details\":{\"max_per_address\":2}"));
    close(c3);
    /* Other addresses fill the total; the next is refused for the total. */
    int b1 = dial(&l, "127.0.0.2"), b2 = dial(&l, "127.0.0.3");
    loop_wait(&lp, 4);
    int c5 = dial(&l, "127.0.0.4");
    assert_true(read_to_end(c5, buf, sizeof buf, 2000, NULL) > 0);
    assert_non_null(strstr(buf, "\"details\":{\"max_connections\":4}"));
    close(c5);
    assert_int_equal(atomic_load(&l.refused_address), 1);
    assert_int_equal(atomic_load(&l.refused_total), 1);
    /* A connection closed by the loop gives its slot back, to its address too. */
    loop_close(&lp, 0);
    int a3 = dial(&l, "127.0.0.1");
    loop_wait(&lp, 5);
    assert_int_equal(loop_count(&lp), 5);
    finish(&l, &lp);
    int fds[] = {a1, a2, b1, b2, a3};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
        close(fds[i]);
}

static void test_header_deadline(void **state)
{
    (void)state;
    devio_listener l;
    loop lp;
    start(&l, &lp, 8, 0, 300);
    int late = dial(&l, "127.0.0.1"), in = dial(&l, "127.0.0.1");
    loop_wait(&lp, 2);
    const int i_in = 1; /* handed over in the order dialled: late, then in */
    devio_listener_headers(&l, lp.conn[i_in], true);
    /* The silent one is cut at 300 ms (the sweep runs every 50 ms); the other stays. */
    char buf[256];
    uint64_t ms = 0;
    assert_int_equal(read_to_end(late, buf, sizeof buf, 2000, &ms), 0);
    assert_true(ms >= 200 && ms < 1500);
    assert_int_equal(read_to_end(in, buf, sizeof buf, 500, NULL), -1);
    assert_int_equal(atomic_load(&l.header_timeouts), 1);
    /* Its answer done, the next request's headers have 300 ms from now. */
    devio_listener_headers(&l, lp.conn[i_in], false);
    assert_int_equal(read_to_end(in, buf, sizeof buf, 2000, &ms), 0);
    assert_true(ms >= 200 && ms < 1500);
    finish(&l, &lp);
    close(late);
    close(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps_answer_503),
        cmocka_unit_test(test_header_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
