/* route_match.h - the types of devio-server's route table (the table is route_table.c's): its entry type, what a handler gets and gives, and the one matcher.
 * Types and matching only; it never reads a socket, a device or the store. */
#ifndef DEVIO_ROUTE_MATCH_H
#define DEVIO_ROUTE_MATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"

struct MHD_Response;

typedef struct devio_server devio_server; /* service/server.h */
typedef struct devio_wait devio_wait;     /* service/tickets/parked_awaits.h */
typedef struct devio_ticket_op devio_ticket_op; /* service/tickets/tickets.h */
typedef struct devio_body_in devio_body_in;     /* service/http/body_in.h */
typedef struct devio_body_out devio_body_out;   /* service/http/body_out.h */

/* Who may call a route. */
typedef enum devio_route_auth {
    DEVIO_ROUTE_OPEN = 0, /* anyone */
    DEVIO_ROUTE_TOKEN,    /* the bearer token, when the server has one */
    DEVIO_ROUTE_HEALTH,   /* anyone, unless --auth-health asks for the token */
} devio_route_auth;

/* What a route does with a request body. A body larger than --max-body is answered 413
 * before the route runs, except a streamed one (bounded by --max-state-bytes instead); bodies
 * of GET are ignored. */
typedef enum devio_route_body {
    DEVIO_ROUTE_NO_BODY = 0, /* a body is counted and dropped */
    DEVIO_ROUTE_JSON_BODY,   /* a JSON body is required: parsed and depth-limited first */
    DEVIO_ROUTE_STREAM_BODY, /* bytes written to the route's sink as they arrive (body_in.h),
                                never held whole; the handler runs once the body is in */
} devio_route_body;

/* Where a DEVIO_ROUTE_STREAM_BODY route's body goes: a sink opened on the request's headers
 * (before any of the body is read), written on workers as the body arrives, and closed when
 * the request ends, whatever its answer. */
typedef struct devio_route_sink {
    /* DEVIO_OK with *sink set, or the status the request is refused with at once. */
    devio_status (*open)(devio_server *s, void **sink, devio_error *err);
    /* The next bytes, on a worker (devio_body_sink_write). */
    devio_status (*write)(void *sink, const void *buf, size_t n, devio_error *err);
    /* Give back whatever the sink still holds and free it. */
    void (*close)(void *sink);
} devio_route_sink;

/* Longest X-Request-Id taken from a client; longer ones are replaced by a generated id. */
#define DEVIO_REQUEST_ID_MAX 128

/* The values a path template captured. */
typedef struct devio_route_params {
    uint64_t id;      /* {id}: a decimal integer, at most INT64_MAX */
    bool id_bad;      /* the {id} segment is not such an integer (answered 400, not 404) */
    const char *id_text; /* {id}: the segment as sent, borrowed, NOT NUL-terminated */
    size_t id_len;
    const char *name; /* {name}: one path segment, borrowed from the URL, NOT NUL-terminated */
    size_t name_len;
} devio_route_params;

/* What a handler reads. Everything is borrowed for the call. */
typedef struct devio_request {
    const char *method, *url;
    devio_route_params params;
    const json_t *body; /* the parsed body of a DEVIO_ROUTE_JSON_BODY route, else NULL */
    const char *request_id; /* X-Request-Id as received or generated; never NULL from the server */
    void *conn;         /* libmicrohttpd's connection: read it with service/http/request.h */
    devio_wait *wait;   /* the request's place among parked awaits, kept across the calls of
                           its handler (zeroed before the first); owned by the server.
                           NULL: the handler may not suspend */
    devio_ticket_op *op; /* the launch or await under way, kept like wait; the server
                            finishes what it holds when the connection ends first */
    struct devio_keyed *keyed; /* its Idempotency-Key (service/routes/keys.h), kept like wait;
                            a launch writes the key's row with its ticket's */
    devio_body_in *upload; /* a streamed body (DEVIO_ROUTE_STREAM_BODY), written whole to its
                              sink before the handler runs (its outcome: body_in.h); else NULL */
    void *sink;            /* that body's sink, opened by the route's devio_route_sink */
    const char *body_digest; /* hex SHA-256 of a streamed body when the request has an
                                Idempotency-Key (keys.h), else NULL */
} devio_request;

/* What a handler answers on success. */
typedef struct devio_reply {
    unsigned code;
    char *body;        /* malloc'd, owned by the reply (devio_reply_free) */
    size_t len;
    devio_body_out *stream; /* instead of body: a body made as it is sent (body_out.h),
                               owned by the reply until it is sent */
    struct MHD_Response *response; /* instead of body: a response the handler made (an event
                               stream), owned by the reply until it is queued */
    const char *ctype; /* static */
    bool close;        /* ask the client to close the connection */
    char allow[48];    /* a 405's Allow header ("GET, HEAD"), or "" */
    bool suspended;    /* no answer yet: the handler parked the connection (rq->wait) and
                          runs again, with the same rq->wait, once it is resumed */
    bool replayed;     /* an answer read again from the history: Idempotent-Replayed */
    unsigned retry_after_s; /* > 0: a Retry-After header (every 503 has 1) */
} devio_reply;

/* A route handler (a function type, so that handlers are declared with it):
 * DEVIO_OK with *out filled, or a status with err filled (the server answers
 * it as an error body; *out is then discarded). `s` and `rq` are borrowed. */
typedef devio_status devio_route_handler(devio_server *s, const devio_request *rq,
                                         devio_reply *out, devio_error *err);

/* One entry of the table. */
typedef struct devio_route {
    const char *method;   /* "GET", "POST", "PUT", "DELETE" */
    const char *path;     /* template, e.g. "/v1/tickets/{id}/await": literal segments, {id},
                             {name}; also the route's metrics label */
    devio_route_handler *handler;
    devio_route_auth auth;
    devio_route_body body;
    bool refused_while_draining; /* 503 not_ready, connection closed, once SIGTERM is seen */
    bool keyed;           /* takes an Idempotency-Key: a retry gets the first answer (keys.h) */
    bool may_wait;        /* may wait on the device or SQLite: runs on a worker (offload.h),
                             never on an HTTP thread */
    const devio_route_sink *sink; /* a DEVIO_ROUTE_STREAM_BODY route's sink, else NULL */
    const struct devio_route *octet_stream; /* the entry that serves this method and path
                             instead when the body is application/octet-stream (kept out of
                             the table, whose entries are one per method and path), or NULL */
} devio_route;

/* Decimal id: 1 to 19 digits, at most INT64_MAX (JSON integers are signed). */
bool devio_route_parse_id(const char *p, size_t n, uint64_t *out);

/* Does `url` (its path; repeated and trailing '/' are ignored) fit `tmpl`?
 * On a match p receives the captures. */
bool devio_route_path_match(const char *tmpl, const char *url, devio_route_params *p);

/* The entry of table[0..n) for method and url, with its captures in *p; NULL
 * when none. *on_path is then the first entry whose path fits (the method is
 * wrong: 405), or NULL (no such path: 404). */
const devio_route *devio_route_find(const devio_route *table, size_t n, const char *method,
                                    const char *url, devio_route_params *p,
                                    const devio_route **on_path);

#endif
