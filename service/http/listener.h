/* listener.h - devio-server's listening socket: accepts connections, refuses those over the limits with a 503, closes those whose headers are late.
 * It never parses HTTP and never calls the device: accepted sockets go to the HTTP loop through `add`; the loop reports back. */
#ifndef DEVIO_LISTENER_H
#define DEVIO_LISTENER_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "device/devio.h"
#include "service/http/listen_addr.h"

typedef struct devio_listener_config {
    uint32_t max_connections;   /* open at once, all addresses together (>= 1) */
    uint32_t max_per_address;   /* open at once from one client address; 0 = no limit */
    uint32_t header_timeout_ms; /* a request's headers must be in within this of the
                                   connection's start or the previous answer; 0 = none */
    bool silent_refusals;       /* close refused connections without the plain-text 503
                                   (under TLS the client could not read it) */
} devio_listener_config;

/* Hands an accepted socket (non-blocking, close-on-exec) to the HTTP loop,
 * which owns it from then on, even when it answers false. */
typedef bool (*devio_listener_add_fn)(void *ctx, int fd, const struct sockaddr *sa,
                                      socklen_t len);

/* One connection counted against the limits. Private to listener.c. */
typedef struct devio_conn devio_conn;

typedef struct devio_listener {
    devio_listener_config cfg;
    devio_listener_add_fn add;
    void *add_ctx;              /* borrowed */
    int fd;                     /* the listening socket; -1 once closed */
    int wake[2];                /* pipe: stop wakes the thread */
    uint16_t port;              /* bound port; 0 for a unix socket */
    char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* socket file made, or "" */
    dev_t unix_dev;             /* that file's identity: removed at close only while it */
    ino_t unix_ino;             /* is still the one bound here */
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    pthread_mutex_t mu;         /* guards slots */
    devio_conn *slots;          /* cfg.max_connections, owned */
    uint32_t n_used;
    int *closing;               /* refused sockets draining before close, owned */
    uint64_t *closing_until;     /* devio_clock_us() time each is closed at */
    uint32_t n_closing;
    char *refusal[2];           /* the 503 answers (total, per address), owned */
    size_t refusal_len[2];
    atomic_uint_least64_t refused_total, refused_address, header_timeouts;
} devio_listener;

/* Bind and listen on `addr`; nothing is accepted until devio_listener_run.
 * IPv4 and IPv6 clients are counted per address (an IPv4 client reaching
 * [::] counts as its IPv4 address); unix-socket clients have none, so only
 * the total applies to them. A unix socket's file is made with mode
 * DEVIO_LISTEN_UNIX_MODE; a file already there is replaced only when it is a
 * socket no server answers on, and the file is removed when listening stops.
 * On failure nothing stays open and err says why. */
devio_status devio_listener_open(devio_listener *l, const devio_listener_config *cfg,
                                 const devio_listen_addr *addr, devio_error *err);
/* Start the thread that accepts, refuses and sweeps; accepted sockets go to add.
 * Once per open: a second call (or one after stop) is refused, DEVIO_E_INVALID. */
devio_status devio_listener_run(devio_listener *l, devio_listener_add_fn add, void *ctx,
                                devio_error *err);
/* Stop the thread and close the listening socket. The table stays valid for
 * the loop's closing reports until devio_listener_free. */
void devio_listener_stop(devio_listener *l);
/* Free the table. No report may come after. */
void devio_listener_free(devio_listener *l);

/* Reports from the HTTP loop, from any of its threads. */
/* A connection handed over by add has started; the returned handle (NULL
 * when it cannot be counted: it is then shut down) is passed to the others. */
devio_conn *devio_listener_started(devio_listener *l, int fd);
/* The connection's socket is about to be closed. */
void devio_listener_closed(devio_listener *l, devio_conn *c);
/* A request's headers are in (true), or its answer is done and the next
 * request's headers are awaited from now (false). */
void devio_listener_headers(devio_listener *l, devio_conn *c, bool in);

#endif
