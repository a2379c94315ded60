/* listener_test.c - service/http/listener.c over real loopback and unix sockets: per-address (IPv4 and IPv6) and total caps answered 503, the header deadline, slots given back, --listen parsing.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "service/http/listen_addr.h"
#include "service/http/listener.h"

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

static void start_at(devio_listener *l, loop *lp, const char *where, uint32_t max, uint32_t per,
                     uint32_t header_ms)
{
    memset(lp, 0, sizeof *lp);
    pthread_mutex_init(&lp->mu, NULL);
    lp->l = l;
    devio_listener_config cfg = {.max_connections = max, .max_per_address = per,
                                 .header_timeout_ms = header_ms};
    devio_listen_addr addr;
    devio_error err = {0};
    assert_int_equal(devio_listen_addr_parse(where, &addr, &err), DEVIO_OK);
    assert_int_equal(devio_listener_open(l, &cfg, &addr, &err), DEVIO_OK);
    assert_true((l->port != 0) == (addr.sa.ss_family != AF_UNIX));
    assert_int_equal(devio_listener_run(l, loop_add, lp, &err), DEVIO_OK);
    /* One accept thread per socket: a second would outlive stop's join. */
    assert_int_equal(devio_listener_run(l, loop_add, lp, &err), DEVIO_E_INVALID);
}

static void start(devio_listener *l, loop *lp, uint32_t max, uint32_t per, uint32_t header_ms)
{
    start_at(l, lp, "127.0.0.1:0", max, per, header_ms);
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

/* A connection from `from` (an IPv4 or IPv6 literal) to the listener's port on `to`. */
static int dial_ip(const devio_listener *l, const char *from, const char *to)
{
    bool v6 = strchr(to, ':') != NULL;
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_storage src = {0}, dst = {0};
    socklen_t len;
    if (v6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&src, *d6 = (struct sockaddr_in6 *)&dst;
        s6->sin6_family = d6->sin6_family = AF_INET6;
        assert_int_equal(inet_pton(AF_INET6, from, &s6->sin6_addr), 1);
        assert_int_equal(inet_pton(AF_INET6, to, &d6->sin6_addr), 1);
        d6->sin6_port = htons(l->port);
        len = sizeof *s6;
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&src, *d4 = (struct sockaddr_in *)&dst;
        s4->sin_family = d4->sin_family = AF_INET;
        assert_int_equal(inet_pton(AF_INET, from, &s4->sin_addr), 1);
        assert_int_equal(inet_pton(AF_INET, to, &d4->sin_addr), 1);
        d4->sin_port = htons(l->port);
        len = sizeof *s4;
    }
    assert_int_equal(bind(fd, (struct sockaddr *)&src, len), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&dst, len), 0);
    return fd;
}

static int dial_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof un.sun_path, "%s", path);
    assert_int_equal(connect(fd, (struct sockaddr *)&un, sizeof un), 0);
    return fd;
}

/* Wait (at most 2 s) for a refusal counter to reach n: the listener counts
 * a refusal after its answer and shutdown, which the client may see first. */
static void wait_counted(atomic_uint_least64_t *counter, uint64_t n)
{
    for (int i = 0; i < 200 && atomic_load(counter) < n; i++)
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    assert_int_equal(atomic_load(counter), n);
}

/* True when this machine has an IPv6 loopback to bind. */
static bool have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
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
    wait_counted(&l.refused_address, 1);
    wait_counted(&l.refused_total, 1);
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

/* ---- --listen ------------------------------------------------------------------- */

static void assert_parses_as(const char *text, const char *formatted, int family)
{
    devio_listen_addr a;
    devio_error err = {0};
    assert_int_equal(devio_listen_addr_parse(text, &a, &err), DEVIO_OK);
    assert_int_equal(a.sa.ss_family, family);
    char buf[160];
    devio_listen_addr_format((struct sockaddr *)&a.sa, a.len, buf, sizeof buf);
    assert_string_equal(buf, formatted);
}

static void assert_refused(const char *text, const char *says)
{
    devio_listen_addr a;
    devio_error err = {0};
    assert_int_equal(devio_listen_addr_parse(text, &a, &err), DEVIO_E_INVALID);
    if (!strstr(err.message, says))
        fail_msg("'%s': message '%s' lacks '%s'", text, err.message, says);
}

static void test_listen_parse(void **state)
{
    (void)state;
    assert_parses_as("127.0.0.1:8080", "127.0.0.1:8080", AF_INET);
    assert_parses_as("0.0.0.0:0", "0.0.0.0:0", AF_INET);
    assert_parses_as("localhost:65535", "127.0.0.1:65535", AF_INET);
    assert_parses_as("[::1]:8080", "[::1]:8080", AF_INET6);
    assert_parses_as("[::]:0", "[::]:0", AF_INET6);
    assert_parses_as("[fe80::1:2]:443", "[fe80::1:2]:443", AF_INET6);
    assert_parses_as("[::ffff:10.0.0.1]:1", "[::ffff:10.0.0.1]:1", AF_INET6);
    assert_parses_as("unix:/run/devio/devio.sock", "unix:/run/devio/devio.sock", AF_UNIX);
    devio_listen_addr a;
    devio_error err = {0};
    assert_int_equal(devio_listen_addr_parse("unix:/tmp/x.sock", &a, &err), DEVIO_OK);
    assert_string_equal(devio_listen_addr_path(&a), "/tmp/x.sock");
    assert_int_equal(devio_listen_addr_parse("[::1]:1", &a, &err), DEVIO_OK);
    assert_null(devio_listen_addr_path(&a));

    const char *shape = "must be HOST:PORT, [IPV6]:PORT or unix:PATH";
    assert_refused("", shape);
    assert_refused("8080", shape);
    assert_refused("::1:8080", shape);     /* IPv6 needs its brackets */
    assert_refused("[::1]", shape);
    assert_refused("[::1]8080", shape);
    assert_refused("[::1:8080", shape);
    assert_refused("[nope]:80", "IPv6 address");
    assert_refused("[127.0.0.1]:80", "IPv6 address");
    assert_refused("example.com:80", "IPv4 address");
    assert_refused("1.2.3.4:", "bad port");
    assert_refused("1.2.3.4:65536", "bad port");
    assert_refused("1.2.3.4:-1", "bad port");
    assert_refused("1.2.3.4:+80", "bad port");
    assert_refused("1.2.3.4:80x", "bad port");
    assert_refused("[::1]:000080", "bad port");
    assert_refused("unix:", "absolute path");
    assert_refused("unix:relative.sock", "absolute path");
    char longpath[200] = "unix:/";
    memset(longpath + 6, 'a', 120);
    longpath[126] = '\0';
    assert_refused(longpath, "at most 107 fit");
}

/* ---- IPv6 and unix sockets ---------------------------------------------------------- */

static void test_ipv6_per_address(void **state)
{
    (void)state;
    if (!have_ipv6_loopback())
        skip(); /* no IPv6 loopback on this machine */
    devio_listener l;
    loop lp;
    /* [::] takes IPv4 clients too; each counts as its own address. */
    start_at(&l, &lp, "[::]:0", 8, 2, 0);
    int a1 = dial_ip(&l, "::1", "::1"), a2 = dial_ip(&l, "::1", "::1");
    int b1 = dial_ip(&l, "127.0.0.1", "127.0.0.1"), b2 = dial_ip(&l, "127.0.0.1", "127.0.0.1");
    loop_wait(&lp, 4);
    char buf[2048];
    int a3 = dial_ip(&l, "::1", "::1");
    assert_true(read_to_end(a3, buf, sizeof buf, 2000, NULL) > 0);
    assert_non_null(strstr(buf, "\"details\":{\"max_per_address\":2}"));
    int b3 = dial_ip(&l, "127.0.0.1", "127.0.0.1");
    assert_true(read_to_end(b3, buf, sizeof buf, 2000, NULL) > 0);
    assert_non_null(strstr(buf, "\"details\":{\"max_per_address\":2}"));
    wait_counted(&l.refused_address, 2);
    /* Another IPv4 address is another client. */
    int c1 = dial_ip(&l, "127.0.0.2", "127.0.0.1");
    loop_wait(&lp, 5);
    /* A slot given back is the address's again. */
    loop_close(&lp, 0);
    int a4 = dial_ip(&l, "::1", "::1");
    loop_wait(&lp, 6);
    finish(&l, &lp);
    int fds[] = {a1, a2, b1, b2, a3, b3, c1, a4};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
        close(fds[i]);
}

static void temp_socket_path(char *buf, size_t cap, const char *name)
{
    char dir[] = "/tmp/devio-listener-XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void remove_temp(const char *path)
{
    unlink(path);
    char dir[128];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    assert_int_equal(rmdir(dir), 0);
}

static void test_unix_socket(void **state)
{
    (void)state;
    char path[128], where[160];
    temp_socket_path(path, sizeof path, "s.sock");
    snprintf(where, sizeof where, "unix:%s", path);
    devio_listener l;
    loop lp;
    /* A unix client has no address: the per-address limit of 1 does not apply, the total does. */
    start_at(&l, &lp, where, 3, 1, 0);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, DEVIO_LISTEN_UNIX_MODE);
    int c[3];
    for (int i = 0; i < 3; i++)
        c[i] = dial_unix(path);
    loop_wait(&lp, 3);
    char buf[2048];
    int over = dial_unix(path);
    assert_true(read_to_end(over, buf, sizeof buf, 2000, NULL) > 0);
    assert_non_null(strstr(buf, "\"details\":{\"max_connections\":3}"));
    wait_counted(&l.refused_total, 1);
    assert_int_equal(atomic_load(&l.refused_address), 0);
    /* A second listener on a path a server answers on is refused; the file stays. */
    devio_listener other;
    devio_listen_addr addr;
    devio_error err = {0};
    devio_listener_config cfg = {.max_connections = 1};
    assert_int_equal(devio_listen_addr_parse(where, &addr, &err), DEVIO_OK);
    assert_int_equal(devio_listener_open(&other, &cfg, &addr, &err), DEVIO_E_IO);
    assert_non_null(strstr(err.message, "a server is answering on that socket"));
    assert_int_equal(lstat(path, &st), 0);
    /* Stopping removes the file. */
    finish(&l, &lp);
    assert_int_equal(lstat(path, &st), -1);
    for (int i = 0; i < 3; i++)
        close(c[i]);
    close(over);
    remove_temp(path);
}

static void test_unix_socket_file_left_behind(void **state)
{
    (void)state;
    char path[128], where[160];
    temp_socket_path(path, sizeof path, "s.sock");
    snprintf(where, sizeof where, "unix:%s", path);
    devio_listen_addr addr;
    devio_error err = {0};
    devio_listener_config cfg = {.max_connections = 2};
    assert_int_equal(devio_listen_addr_parse(where, &addr, &err), DEVIO_OK);
    /* A stale socket (its server gone without removing it) is replaced. */
    int dead = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(dead, (struct sockaddr *)&addr.sa, addr.len), 0);
    close(dead);
    devio_listener l;
    assert_int_equal(devio_listener_open(&l, &cfg, &addr, &err), DEVIO_OK);
    close(dial_unix(path)); /* the new socket answers (the backlog takes it) */
    devio_listener_free(&l);
    struct stat st;
    assert_int_equal(lstat(path, &st), -1);
    /* Anything else at the path is left alone. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("keep me\n", f);
    fclose(f);
    assert_int_equal(devio_listener_open(&l, &cfg, &addr, &err), DEVIO_E_IO);
    assert_non_null(strstr(err.message, "exists and is not a socket"));
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    /* A file put in the socket's place while serving is not removed at stop. */
    unlink(path);
    assert_int_equal(devio_listener_open(&l, &cfg, &addr, &err), DEVIO_OK);
    unlink(path);
    f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    devio_listener_free(&l);
    assert_int_equal(lstat(path, &st), 0);
    remove_temp(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps_answer_503),
        cmocka_unit_test(test_header_deadline),
        cmocka_unit_test(test_listen_parse),
        cmocka_unit_test(test_ipv6_per_address),
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_unix_socket_file_left_behind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
