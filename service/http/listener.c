/* listener.c - the accept thread: counts connections per address and in all, answers 503 to those over a limit, and cuts those whose headers are late.
 * Every table change happens under one lock; it never blocks on a client (refused sockets drain in its own poll, bounded in number and time). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "api/codec.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/http/listener.h"

enum { SLOT_FREE = 0, SLOT_PENDING, SLOT_LIVE };

/* How often late headers are looked for, how many sockets one wake takes,
 * how many refused sockets drain at once and for how long. A socket handed
 * to the loop and never reported started (the loop failed it before its
 * start) stops counting after PENDING_US. */
#define SWEEP_MS 50
#define ACCEPT_BATCH 64
#define CLOSING_MAX 64
#define CLOSING_US 1000000
#define BACKOFF_US 100000
#define PENDING_US 5000000

struct devio_conn {
    int fd;
    uint8_t state;
    bool headers_in; /* the current request's headers are in: no deadline */
    bool cut;        /* shut down for late headers */
    bool has_addr;   /* an IP client (a unix-socket client has no address) */
    uint8_t addr[16]; /* IPv6, or IPv4 as ::ffff:a.b.c.d */
    uint64_t since_us;
};

/* ---- the table (lock held) ------------------------------------------------------- */

/* The client's address as 16 bytes, IPv4 mapped into IPv6 so that one
 * client counts once whichever socket family it came through; false for a
 * unix-socket client, which has none. */
static bool address_key(const struct sockaddr *sa, socklen_t len, uint8_t key[16])
{
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        memcpy(key, mapped, sizeof mapped);
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

static uint32_t count_from(const devio_listener *l, const uint8_t addr[16])
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->cfg.max_connections; i++)
        n += l->slots[i].state != SLOT_FREE && l->slots[i].has_addr &&
             memcmp(l->slots[i].addr, addr, 16) == 0;
    return n;
}

static devio_conn *slot_take(devio_listener *l, int fd, const uint8_t *addr, uint8_t state,
                             uint64_t now)
{
    for (uint32_t i = 0; i < l->cfg.max_connections; i++) {
        devio_conn *c = &l->slots[i];
        if (c->state != SLOT_FREE)
            continue;
        *c = (devio_conn){.fd = fd, .state = state, .has_addr = addr != NULL, .since_us = now};
        if (addr)
            memcpy(c->addr, addr, 16);
        l->n_used++;
        return c;
    }
    return NULL;
}

static void slot_free(devio_listener *l, devio_conn *c)
{
    c->state = SLOT_FREE;
    c->fd = -1;
    l->n_used--;
}

static devio_conn *pending_with(devio_listener *l, int fd)
{
    for (uint32_t i = 0; i < l->cfg.max_connections; i++)
        if (l->slots[i].state == SLOT_PENDING && l->slots[i].fd == fd)
            return &l->slots[i];
    return NULL;
}

/* Cut connections whose headers are late; forget pending ones never started.
 * shutdown() (not close) under the lock: the loop reports a close before it
 * closes the descriptor, so the descriptor is still this connection's, and
 * its event loop sees end of stream and closes it. */
static void sweep(devio_listener *l)
{
    uint64_t limit = (uint64_t)l->cfg.header_timeout_ms * 1000;
    pthread_mutex_lock(&l->mu);
    /* Read under the lock: every since_us set before it is not after it. */
    uint64_t now = devio_clock_us();
    for (uint32_t i = 0; i < l->cfg.max_connections; i++) {
        devio_conn *c = &l->slots[i];
        uint64_t age = now >= c->since_us ? now - c->since_us : 0;
        if (c->state == SLOT_PENDING && age > PENDING_US) {
            slot_free(l, c);
        } else if (c->state == SLOT_LIVE && limit && !c->headers_in && !c->cut && age >= limit) {
            shutdown(c->fd, SHUT_RDWR);
            c->cut = true;
            atomic_fetch_add(&l->header_timeouts, 1);
        }
    }
    pthread_mutex_unlock(&l->mu);
}

/* ---- refusals ---------------------------------------------------------------------- */

static void closing_drop(devio_listener *l, uint32_t i)
{
    close(l->closing[i]);
    l->n_closing--;
    l->closing[i] = l->closing[l->n_closing];
    l->closing_until[i] = l->closing_until[l->n_closing];
}

/* Answer the 503 and keep the socket until the client closes (or a second
 * passes), reading what it sent: closing with unread data would reset the
 * connection and could lose the answer on the client's side. */
static void refuse(devio_listener *l, int fd, int which, uint64_t now)
{
    if (!l->cfg.silent_refusals) {
        ssize_t n = send(fd, l->refusal[which], l->refusal_len[which],
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n; /* a fresh socket's buffer takes it; a client gone gets nothing */
    }
    shutdown(fd, SHUT_WR);
    if (l->n_closing == CLOSING_MAX) {
        uint32_t oldest = 0;
        for (uint32_t i = 1; i < l->n_closing; i++)
            if (l->closing_until[i] < l->closing_until[oldest])
                oldest = i;
        closing_drop(l, oldest);
    }
    l->closing[l->n_closing] = fd;
    l->closing_until[l->n_closing] = now + CLOSING_US;
    l->n_closing++;
    atomic_fetch_add(which == 0 ? &l->refused_total : &l->refused_address, 1);
}

static void closing_poll(devio_listener *l, const struct pollfd *p, uint64_t now)
{
    char buf[4096];
    /* p[i] describes closing[i] as it was before the poll; walk backwards so
     * that dropping i (which moves the last entry into i) leaves the rest in place. */
    for (uint32_t i = l->n_closing; i-- > 0;) {
        bool drop = now >= l->closing_until[i];
        if (!drop && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
            for (int k = 0; k < 16; k++) {
                ssize_t n = recv(l->closing[i], buf, sizeof buf, MSG_DONTWAIT);
                if (n > 0)
                    continue;
                drop = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
                break;
            }
        }
        if (drop)
            closing_drop(l, i);
    }
}

/* ---- accepting ------------------------------------------------------------------- */

static void take(devio_listener *l, int fd, const struct sockaddr *sa, socklen_t len,
                 uint64_t now)
{
    uint8_t key[16];
    const uint8_t *addr = address_key(sa, len, key) ? key : NULL;
    int refused = -1;
    devio_conn *c = NULL;
    pthread_mutex_lock(&l->mu);
    devio_conn *stale = pending_with(l, fd); /* its socket was closed before it started */
    if (stale)
        slot_free(l, stale);
    if (l->n_used >= l->cfg.max_connections)
        refused = 0;
    else if (addr && l->cfg.max_per_address && count_from(l, addr) >= l->cfg.max_per_address)
        refused = 1;
    else
        c = slot_take(l, fd, addr, SLOT_PENDING, now);
    pthread_mutex_unlock(&l->mu);
    if (refused >= 0) {
        refuse(l, fd, refused, now);
        return;
    }
    if (l->add(l->add_ctx, fd, sa, len))
        return;
    /* The loop refused it and closed the socket: it never starts. */
    pthread_mutex_lock(&l->mu);
    if (c->state == SLOT_PENDING && c->fd == fd)
        slot_free(l, c);
    pthread_mutex_unlock(&l->mu);
}

/* Take what the backlog holds; false when accept ran out of descriptors or memory. */
static bool accept_some(devio_listener *l, uint64_t now)
{
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(l->fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
        }
        uint8_t key[16];
        if (sa.ss_family != AF_UNIX && !address_key((struct sockaddr *)&sa, len, key)) {
            close(fd);
            continue;
        }
        take(l, fd, (struct sockaddr *)&sa, len, now);
    }
    return true;
}

/* Close the listening socket and remove its file, if it made one and the
 * file there is still that one (another server may have taken the path). */
static void close_listening(devio_listener *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    struct stat st;
    if (l->unix_path[0] && lstat(l->unix_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
        st.st_dev == l->unix_dev && st.st_ino == l->unix_ino)
        unlink(l->unix_path);
    l->unix_path[0] = '\0';
}

static void *listener_main(void *arg)
{
    devio_listener *l = arg;
    struct pollfd p[2 + CLOSING_MAX];
    uint64_t next_sweep = 0, backoff_until = 0;
    while (!atomic_load(&l->stop)) {
        uint64_t now = devio_clock_us();
        nfds_t n = 0;
        for (uint32_t i = 0; i < l->n_closing; i++)
            p[n++] = (struct pollfd){.fd = l->closing[i], .events = POLLIN};
        nfds_t at_wake = n;
        p[n++] = (struct pollfd){.fd = l->wake[0], .events = POLLIN};
        bool listening = l->fd >= 0 && now >= backoff_until;
        if (listening)
            p[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
        int rc = poll(p, n, SWEEP_MS);
        now = devio_clock_us();
        if (rc > 0 && (p[at_wake].revents & POLLIN)) {
            char b[64];
            while (read(l->wake[0], b, sizeof b) > 0) {
            }
        }
        /* The refused sockets first: p[i] is closing[i] only until accepting refuses more. */
        closing_poll(l, p, now);
        if (rc > 0 && listening && (p[at_wake + 1].revents & POLLIN) &&
            !accept_some(l, now))
            backoff_until = now + BACKOFF_US;
        if (now >= next_sweep) {
            sweep(l);
            next_sweep = now + SWEEP_MS * 1000;
        }
    }
    while (l->n_closing)
        closing_drop(l, l->n_closing - 1);
    return NULL;
}

/* ---- start and stop ---------------------------------------------------------------- */

static char *refusal_text(unsigned limit, bool per_address, size_t *len)
{
    devio_error e = {0};
    if (per_address)
        devio_fail_at(&e, DEVIO_E_TOO_MANY_CONNECTIONS, "max_per_address", limit,
                      "%u connections from this address are open; close one and retry", limit);
    else
        devio_fail_at(&e, DEVIO_E_TOO_MANY_CONNECTIONS, "max_connections", limit,
                      "the server has %u connections open; retry later", limit);
    json_t *j = devio_json_error(&e);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body)
        return NULL;
    char *text = NULL;
    int n = asprintf(&text,
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s",
                     strlen(body), body);
    free(body);
    if (n < 0)
        return NULL;
    *len = (size_t)n;
    return text;
}

/* A socket file at path: none, or a stale socket (no server answers on it)
 * that is removed; anything else is refused, never removed. */
static devio_status unix_clear(const char *path, devio_error *err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? DEVIO_OK
                               : devio_fail(err, DEVIO_E_IO, "cannot listen on unix:%s: %s", path,
                                            strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return devio_fail(err, DEVIO_E_IO,
                          "cannot listen on unix:%s: the path exists and is not a socket; "
                          "it is left as it is", path);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    memcpy(un.sun_path, path, strlen(path) + 1);
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0)
        return devio_fail(err, DEVIO_E_IO, "cannot listen on unix:%s: %s", path, strerror(errno));
    int rc = connect(probe, (struct sockaddr *)&un, sizeof un);
    int e = errno;
    close(probe);
    if (rc == 0)
        return devio_fail(err, DEVIO_E_IO,
                          "cannot listen on unix:%s: a server is answering on that socket", path);
    if (e != ECONNREFUSED)
        return devio_fail(err, DEVIO_E_IO, "cannot listen on unix:%s: %s", path, strerror(e));
    if (unlink(path) != 0 && errno != ENOENT)
        return devio_fail(err, DEVIO_E_IO, "cannot remove the stale socket unix:%s: %s", path,
                          strerror(errno));
    return DEVIO_OK;
}

static bool is_any_ipv6(const devio_listen_addr *a)
{
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->sa;
    return a->sa.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
}

/* Bind and listen, recording the port (IP) or the socket file made (unix). */
static devio_status open_socket(devio_listener *l, const devio_listen_addr *addr,
                                devio_error *err)
{
    char where[128];
    devio_listen_addr_format((const struct sockaddr *)&addr->sa, addr->len, where, sizeof where);
    const char *path = devio_listen_addr_path(addr);
    if (path) {
        devio_status st = unix_clear(path, err);
        if (st != DEVIO_OK)
            return st;
    }
    int one = 1, zero = 0;
    l->fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || pipe2(l->wake, O_NONBLOCK | O_CLOEXEC) != 0)
        goto fail;
    if (!path && setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
        goto fail;
    /* [::] takes IPv4 clients too, whatever the system's bindv6only says. */
    if (is_any_ipv6(addr) && setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0)
        goto fail;
    if (bind(l->fd, (const struct sockaddr *)&addr->sa, addr->len) != 0)
        goto fail;
    if (path) {
        /* Before listen: no client can connect while the mode is still umask's. */
        struct stat st;
        if (lstat(path, &st) != 0)
            goto fail;
        snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
        l->unix_dev = st.st_dev;
        l->unix_ino = st.st_ino;
        if (chmod(path, DEVIO_LISTEN_UNIX_MODE) != 0)
            goto fail;
    }
    if (listen(l->fd, SOMAXCONN) != 0)
        goto fail;
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (!path && getsockname(l->fd, (struct sockaddr *)&bound, &blen) == 0)
        l->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    return DEVIO_OK;
fail:;
    int e = errno;
    return devio_fail(err, DEVIO_E_IO, "cannot listen on %s: %s", where, strerror(e));
}

devio_status devio_listener_open(devio_listener *l, const devio_listener_config *cfg,
                                 const devio_listen_addr *addr, devio_error *err)
{
    memset(l, 0, sizeof *l);
    l->fd = l->wake[0] = l->wake[1] = -1;
    l->cfg = *cfg;
    if (l->cfg.max_connections == 0)
        return devio_fail(err, DEVIO_E_INVALID, "--max-connections must be at least 1");
    pthread_mutex_init(&l->mu, NULL);
    l->slots = calloc(cfg->max_connections, sizeof *l->slots);
    l->closing = calloc(CLOSING_MAX, sizeof *l->closing);
    l->closing_until = calloc(CLOSING_MAX, sizeof *l->closing_until);
    l->refusal[0] = refusal_text(cfg->max_connections, false, &l->refusal_len[0]);
    l->refusal[1] = refusal_text(cfg->max_per_address, true, &l->refusal_len[1]);
    if (!l->slots || !l->closing || !l->closing_until || !l->refusal[0] || !l->refusal[1]) {
        devio_listener_free(l);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the connection table");
    }
    for (uint32_t i = 0; i < cfg->max_connections; i++)
        l->slots[i].fd = -1;
    devio_status st = open_socket(l, addr, err);
    if (st != DEVIO_OK)
        devio_listener_free(l);
    return st;
}

devio_status devio_listener_run(devio_listener *l, devio_listener_add_fn add, void *ctx,
                                devio_error *err)
{
    if (l->thread_started || l->fd < 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the accept thread is already running or the socket is closed");
    l->add = add;
    l->add_ctx = ctx;
    if (pthread_create(&l->thread, NULL, listener_main, l) != 0)
        return devio_fail(err, DEVIO_E_NOMEM, "cannot start the accept thread");
    l->thread_started = true;
    return DEVIO_OK;
}

static void wake_thread(devio_listener *l)
{
    if (l->wake[1] >= 0) {
        ssize_t n = write(l->wake[1], "w", 1);
        (void)n; /* a full pipe already wakes it */
    }
}

void devio_listener_stop(devio_listener *l)
{
    atomic_store(&l->stop, true);
    if (l->thread_started) {
        wake_thread(l);
        pthread_join(l->thread, NULL);
        l->thread_started = false;
    }
    close_listening(l);
}

void devio_listener_free(devio_listener *l)
{
    devio_listener_stop(l);
    for (int i = 0; i < 2; i++) {
        if (l->wake[i] >= 0)
            close(l->wake[i]);
        l->wake[i] = -1;
        free(l->refusal[i]);
        l->refusal[i] = NULL;
    }
    free(l->slots);
    free(l->closing);
    free(l->closing_until);
    l->slots = NULL;
    l->closing = NULL;
    l->closing_until = NULL;
    if (l->cfg.max_connections)
        pthread_mutex_destroy(&l->mu);
    l->cfg.max_connections = 0;
}

/* ---- reports from the HTTP loop ----------------------------------------------------- */

devio_conn *devio_listener_started(devio_listener *l, int fd)
{
    pthread_mutex_lock(&l->mu);
    devio_conn *c = pending_with(l, fd);
    if (c) {
        c->state = SLOT_LIVE;
    } else {
        /* Forgotten while pending (the loop was slow to start it): count it again. */
        struct sockaddr_storage sa = {0};
        socklen_t len = sizeof sa;
        uint8_t key[16];
        bool known = getpeername(fd, (struct sockaddr *)&sa, &len) == 0 &&
                     address_key((struct sockaddr *)&sa, len, key);
        c = slot_take(l, fd, known ? key : NULL, SLOT_LIVE, devio_clock_us());
    }
    pthread_mutex_unlock(&l->mu);
    if (!c)
        shutdown(fd, SHUT_RDWR);
    return c;
}

void devio_listener_closed(devio_listener *l, devio_conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&l->mu);
    if (c->state != SLOT_FREE)
        slot_free(l, c);
    pthread_mutex_unlock(&l->mu);
}

void devio_listener_headers(devio_listener *l, devio_conn *c, bool in)
{
    if (!c)
        return;
    pthread_mutex_lock(&l->mu);
    c->headers_in = in;
    if (!in)
        c->since_us = devio_clock_us();
    pthread_mutex_unlock(&l->mu);
}
