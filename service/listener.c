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
#include <unistd.h>

#include <jansson.h>

#include "api/codec.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/listener.h"

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
    uint32_t addr;   /* IPv4, network order */
    uint64_t since_us;
};

/* ---- the table (lock held) ------------------------------------------------------- */

static uint32_t count_from(const devio_listener *l, uint32_t addr)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->cfg.max_connections; i++)
        n += l->slots[i].state != SLOT_FREE && l->slots[i].addr == addr;
    return n;
}

static devio_conn *slot_take(devio_listener *l, int fd, uint32_t addr, uint8_t state,
                             uint64_t now)
{
    for (uint32_t i = 0; i < l->cfg.max_connections; i++) {
        devio_conn *c = &l->slots[i];
        if (c->state != SLOT_FREE)
            continue;
        *c = (devio_conn){.fd = fd, .state = state, .addr = addr, .since_us = now};
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
    ssize_t n = send(fd, l->refusal[which], l->refusal_len[which], MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n; /* a fresh socket's buffer takes it; a client gone gets nothing */
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

static void take(devio_listener *l, int fd, const struct sockaddr_in *sa, uint64_t now)
{
    uint32_t addr = sa->sin_addr.s_addr;
    int refused = -1;
    devio_conn *c = NULL;
    pthread_mutex_lock(&l->mu);
    devio_conn *stale = pending_with(l, fd); /* its socket was closed before it started */
    if (stale)
        slot_free(l, stale);
    if (l->n_used >= l->cfg.max_connections)
        refused = 0;
    else if (l->cfg.max_per_address && count_from(l, addr) >= l->cfg.max_per_address)
        refused = 1;
    else
        c = slot_take(l, fd, addr, SLOT_PENDING, now);
    pthread_mutex_unlock(&l->mu);
    if (refused >= 0) {
        refuse(l, fd, refused, now);
        return;
    }
    if (l->add(l->add_ctx, fd, (const struct sockaddr *)sa, sizeof *sa))
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
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        int fd = accept4(l->fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
        }
        if (sa.sin_family != AF_INET || len < sizeof sa) {
            close(fd);
            continue;
        }
        take(l, fd, &sa, now);
    }
    return true;
}

static void *listener_main(void *arg)
{
    devio_listener *l = arg;
    struct pollfd p[2 + CLOSING_MAX];
    uint64_t next_sweep = 0, backoff_until = 0;
    while (!atomic_load(&l->stop)) {
        if (atomic_load(&l->quiesce) && l->fd >= 0) {
            close(l->fd);
            l->fd = -1;
        }
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

devio_status devio_listener_open(devio_listener *l, const devio_listener_config *cfg,
                                 const struct sockaddr_in *sa, devio_error *err)
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
    char where[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, where, sizeof where);
    int one = 1;
    l->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || pipe2(l->wake, O_NONBLOCK | O_CLOEXEC) != 0 ||
        setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(l->fd, (const struct sockaddr *)sa, sizeof *sa) != 0 ||
        listen(l->fd, SOMAXCONN) != 0) {
        int e = errno;
        devio_listener_free(l);
        return devio_fail(err, DEVIO_E_IO, "cannot listen on %s:%u: %s", where,
                          ntohs(sa->sin_port), strerror(e));
    }
    struct sockaddr_in bound;
    socklen_t blen = sizeof bound;
    l->port = getsockname(l->fd, (struct sockaddr *)&bound, &blen) == 0 ? ntohs(bound.sin_port)
                                                                          : ntohs(sa->sin_port);
    return DEVIO_OK;
}

devio_status devio_listener_run(devio_listener *l, devio_listener_add_fn add, void *ctx,
                                devio_error *err)
{
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

void devio_listener_quiesce(devio_listener *l)
{
    atomic_store(&l->quiesce, true);
    if (l->thread_started) {
        wake_thread(l);
        return;
    }
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

void devio_listener_stop(devio_listener *l)
{
    atomic_store(&l->stop, true);
    if (l->thread_started) {
        wake_thread(l);
        pthread_join(l->thread, NULL);
        l->thread_started = false;
    }
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
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
        struct sockaddr_in sa = {0};
        socklen_t len = sizeof sa;
        getpeername(fd, (struct sockaddr *)&sa, &len);
        c = slot_take(l, fd, sa.sin_addr.s_addr, SLOT_LIVE, devio_clock_us());
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
