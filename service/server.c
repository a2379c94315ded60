/* server.c - devio-server's libmicrohttpd plumbing: auth, body limits, framing, draining, routes that may wait sent to workers, metrics labels.
 * Routes live in service/routes/ (the table in service/routes/route_table.c, the handlers in its routes_*.c);
 * this file must never decode a body for a route, touch SQL or compute. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/clock.h"
#include "common/log.h"
#include "device/status.h"
#include "service/http/body_in.h"
#include "service/http/body_out.h"
#include "service/http/framing.h"
#include "service/http/request_rules.h"
#include "service/routes/keys.h"
#include "service/http/request.h"
#include "service/server.h"

/* libmicrohttpd's threading: --http-threads internal threads, each an epoll
 * loop over its share of the connections, with suspend and resume so that an
 * await waiting for its step holds no thread (parked_awaits.h). Chosen for what
 * it bounds, not for speed (docs/http.md, Threads, has the side-by-side
 * figures against a thread per connection). The listening socket is devio's own (listener.h): it answers 503 when a
 * connection limit is reached, where libmicrohttpd would close the socket
 * without a word, and it cuts connections whose headers are late, which
 * libmicrohttpd's idle timeout (restarted by every byte) cannot. */
#define MHD_FLAGS                                                                               \
    (MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | \
     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET)

/* Descriptors kept free beside the connections: the store, the model, the
 * loop's epoll and wake-up descriptors, refused sockets draining. */
#define FD_RESERVE 128

/* Per-request state, kept in libmicrohttpd's req_cls across calls. */
typedef struct req {
    const devio_route *route;   /* the entry for method and path, or NULL */
    const devio_route *on_path; /* the first entry for the path, any method, or NULL */
    devio_route_params params;
    bool keep_body;             /* the route parses a JSON body */
    char *body;
    size_t len, cap;            /* len counts dropped bodies too, for the limit */
    bool too_large;
    bool answered;              /* refused on its headers; the body is not read */
    devio_conn *conn;           /* the listener's count of this connection, or NULL */
    devio_wait wait;            /* an await's place among the parked ones (parked_awaits.h) */
    devio_ticket_op op;         /* the launch or await under way (tickets.h) */
    devio_keyed keyed;          /* its Idempotency-Key (keys.h) */
    /* A streamed body (DEVIO_ROUTE_STREAM_BODY): its sink, and its way there on workers. */
    void *sink;                 /* opened by route->sink on the headers; closed on completion */
    devio_body_in upload;
    char body_digest[65];       /* the body's SHA-256 once it is whole, when keyed */
    bool handled;               /* its handler ran once: a resumed request is never refused
                                   for a drain that began after it was taken */
    bool parked;                /* its connection was set aside at least once */
    /* A route that may wait runs on a worker (offload.h): the job, and what it answered. */
    enum { WORK_NONE, WORK_RUNNING, WORK_DONE } work;
    devio_offload_job job;
    devio_server *s;
    struct MHD_Connection *c;
    devio_reply wreply;
    devio_status wst;
    devio_error werr;
    uint64_t start_us;          /* the first access-handler call, for the latency metric */
    const char *method, *url;   /* libmicrohttpd's, valid until the request completes */
    char request_id[DEVIO_REQUEST_ID_MAX + 1]; /* X-Request-Id as received, or generated */
} req;

/* ---- before a route runs ------------------------------------------------------- */

static devio_status parse_body(const devio_server *s, const req *q, json_t **out,
                               devio_error *err)
{
    *out = NULL;
    if (q->len == 0)
        return devio_fail(err, DEVIO_E_INVALID, "request body must be JSON");
    /* Decoding allocates by the value, far more than the bytes: the work is
     * bounded first, in one pass that allocates nothing. */
    devio_json_size z = devio_http_json_size(q->body, q->len);
    if (z.depth > s->cfg.max_json_depth)
        return devio_fail(err, DEVIO_E_INVALID, "JSON nested deeper than %u levels",
                          s->cfg.max_json_depth);
    if (z.values > s->max_body_values)
        return devio_fail(err, DEVIO_E_TOO_LARGE,
                          "request body holds %llu JSON values and names; at most %llu are taken"
                          " (every token a plan may hold, and logit biases and bans over the"
                          " whole vocabulary a few times over)",
                          (unsigned long long)z.values, (unsigned long long)s->max_body_values);
    json_error_t je;
    *out = json_loadb(q->body, q->len, JSON_REJECT_DUPLICATES, &je);
    if (!*out && json_error_code(&je) == json_error_numeric_overflow)
        return devio_fail(err, DEVIO_E_INVALID,
                          "number out of range at line %d column %d: integers must lie in "
                          "[-9223372036854775808, 9223372036854775807] and other numbers within"
                          " +-1.7976931348623157e308 (%s)",
                          je.line, je.column, je.text);
    if (!*out)
        return devio_fail(err, DEVIO_E_INVALID, "malformed JSON at line %d column %d: %s",
                          je.line, je.column, je.text);
    return DEVIO_OK;
}

static bool token_ok(const devio_server *s, const char *header)
{
    return devio_http_bearer_ok(header, s->token, s->token_len);
}

static bool needs_token(const devio_server *s, const devio_route *on_path)
{
    devio_route_auth a = on_path ? on_path->auth : DEVIO_ROUTE_TOKEN;
    return s->token && (a == DEVIO_ROUTE_TOKEN || (a == DEVIO_ROUTE_HEALTH && s->cfg.auth_health));
}

/* The route's own part: its body decoded (415, 400), its Idempotency-Key,
 * its handler. `can_park`: on an HTTP thread, where a handler sets its
 * connection aside to wait; on a worker it waits in place. */
static devio_status run_route(devio_server *s, struct MHD_Connection *c, req *q, bool can_park,
                              devio_reply *r, devio_error *err)
{
    devio_request rq = {.method = q->method, .url = q->url, .params = q->params, .conn = c,
                        .wait = can_park ? &q->wait : NULL, .op = &q->op,
                        .request_id = q->request_id, .keyed = &q->keyed};
    json_t *body = NULL;
    devio_status st = DEVIO_OK;
    if (q->route->body == DEVIO_ROUTE_STREAM_BODY) {
        /* The rest written (this runs on a worker: may_wait). A refusal is the handler's to
         * answer, after the key's lookup: a retry whose first answer is kept gets that. */
        devio_body_in_end(&q->upload, q->body_digest, NULL);
        rq.upload = &q->upload;
        rq.sink = q->sink;
        rq.body_digest = q->body_digest[0] ? q->body_digest : NULL;
    }
    if (q->route->body == DEVIO_ROUTE_JSON_BODY) {
        st = devio_http_json_media_type(
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"), err);
        if (st == DEVIO_OK)
            st = parse_body(s, q, &body, err);
    }
    rq.body = body;
    q->handled = true;
    bool answered = false;
    if (st == DEVIO_OK && q->route->keyed) {
        const char *key = NULL;
        st = devio_http_header_once(c, "Idempotency-Key", &key, err);
        if (st == DEVIO_OK)
            st = devio_keyed_before(s, &rq, key, &q->keyed, r, &answered, err);
    }
    if (st == DEVIO_OK && !answered)
        st = q->route->handler(s, &rq, r, err);
    if (!answered && q->route->keyed)
        devio_keyed_after(s, &rq, &q->keyed, &st, r, err);
    json_decref(body);
    return st;
}

/* A worker runs the route of a request set aside, then brings the
 * connection back to send what it answered. */
static void run_offloaded(devio_offload_job *job)
{
    req *q = (req *)((char *)job - offsetof(req, job));
    q->wst = run_route(q->s, q->c, q, false, &q->wreply, &q->werr);
    q->work = WORK_DONE;
    MHD_resume_connection(q->c);
}

/* Everything between the request and its route's handler, in the order the
 * contract answers: 401, 413, 404, 405, draining 503, malformed body 400.
 * *label is the metrics label of the answer. */
static devio_status dispatch(devio_server *s, struct MHD_Connection *c, const char *url,
                             req *q, devio_reply *r, const char **label, devio_error *err)
{
    if (q->work == WORK_DONE) { /* back from its worker */
        *label = q->route->path;
        *r = q->wreply;
        memset(&q->wreply, 0, sizeof q->wreply);
        if (q->wst != DEVIO_OK)
            *err = q->werr;
        return q->wst;
    }
    *label = "auth";
    if (needs_token(s, q->on_path) &&
        !token_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")))
        return devio_fail(err, DEVIO_E_UNAUTHORIZED, "missing or wrong bearer token");
    *label = "body";
    if (q->too_large)
        return devio_fail(err, DEVIO_E_TOO_LARGE, "request body larger than %u bytes",
                          s->cfg.max_body);
    *label = "unknown";
    if (!q->on_path)
        return devio_fail(err, DEVIO_E_NOT_FOUND, "no route %s", url);
    *label = q->on_path->path;
    if (!q->route) {
        size_t n;
        const devio_route *routes = devio_server_routes(&n);
        devio_http_allowed_methods(routes, n, q->on_path->path, r->allow, sizeof r->allow);
        return devio_fail(err, DEVIO_E_METHOD, "method not allowed on %s (allowed: %s)", url,
                          r->allow);
    }
    *label = q->route->path;
    if (q->params.id_bad)
        return devio_fail(err, DEVIO_E_INVALID,
                          "'%.*s' is not an id: ids are decimal integers from 0 to "
                          "9223372036854775807",
                          (int)(q->params.id_len > 64 ? 64 : q->params.id_len),
                          q->params.id_text);
    devio_status once = devio_http_query_once(c, err);
    if (once != DEVIO_OK)
        return once;
    if (q->route->refused_while_draining && !q->handled && atomic_load(&s->draining)) {
        r->close = true;
        return devio_fail(err, DEVIO_E_NOT_READY, "server is draining; launch elsewhere");
    }
    if (q->route->may_wait && q->work == WORK_NONE) {
        /* Set aside before the job is queued: the worker resumes it. */
        q->work = WORK_RUNNING;
        q->s = s;
        q->c = c;
        q->job.run = run_offloaded;
        MHD_suspend_connection(c);
        r->suspended = true;
        devio_offload_submit(&s->offload, &q->job);
        return DEVIO_OK;
    }
    return run_route(s, c, q, true, r, err);
}

/* ---- libmicrohttpd callbacks ---------------------------------------------------- */

/* Take one piece of an upload: kept for a JSON route, counted for any other. */
static enum MHD_Result take_upload(const devio_server *s, req *q, const char *upload,
                                   size_t size)
{
    if (!q->too_large && q->len + size > s->cfg.max_body) {
        q->too_large = true;
        free(q->body);
        q->body = NULL;
        q->cap = 0;
    }
    if (!q->too_large && q->keep_body) {
        if (q->len + size + 1 > q->cap) {
            size_t cap = (q->len + size + 1) * 2;
            char *b = realloc(q->body, cap);
            if (!b)
                return MHD_NO;
            q->body = b;
            q->cap = cap;
        }
        memcpy(q->body + q->len, upload, size);
        q->body[q->len + size] = '\0';
    }
    q->len += size;
    return MHD_YES;
}

/* Take one piece of a streamed body: to its sink on a worker, never on this thread. A body
 * past --max-state-bytes is one the sink refuses (no state it takes is larger): the connection
 * is closed rather than read on. */
static enum MHD_Result take_stream(const devio_server *s, struct MHD_Connection *c, req *q,
                                   const char *upload, size_t size)
{
    if (q->upload.received + size > s->cfg.max_state_bytes)
        return MHD_NO;
    return devio_body_in_take(&q->upload, c, upload, size) ? MHD_YES : MHD_NO;
}

static enum MHD_Result send_reply(devio_server *s, struct MHD_Connection *c, devio_reply *r,
                                  const char *label, const req *q)
{
    size_t bytes = r->len;
    struct MHD_Response *resp;
    if (r->stream) {
        /* Made on workers as it is sent (body_out.h); the response owns it from here. */
        bytes = (size_t)devio_body_out_total(r->stream);
        resp = devio_body_out_response(r->stream, c);
        r->stream = NULL;
    } else if (r->response) {
        /* Made by its handler (an event stream); queued here, and ours no longer. */
        resp = r->response;
        r->response = NULL;
    } else {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
    }
    if (!resp) {
        devio_reply_free(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", r->ctype);
    if (r->code == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (r->close)
        MHD_add_response_header(resp, "Connection", "close");
    if (r->allow[0])
        MHD_add_response_header(resp, "Allow", r->allow);
    if (r->code == 503 && !r->retry_after_s) /* not ready, draining, store unavailable */
        r->retry_after_s = 1;
    if (r->retry_after_s) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", r->retry_after_s);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (r->replayed)
        MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    MHD_add_response_header(resp, "X-Request-Id", q->request_id);
    enum MHD_Result ret = MHD_queue_response(c, r->code, resp);
    MHD_destroy_response(resp);
    double seconds = (double)(devio_clock_us() - q->start_us) / 1e6;
    devio_metrics_http(&s->metrics, label, r->code, seconds);
    devio_http_log_access(c, q->method, q->url, r->code, bytes, seconds, q->request_id);
    return ret;
}

/* Collects the framing headers for devio_framing_check. */
static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    devio_framing_add(cls, key, value);
    return MHD_YES;
}

/* err as the answer's error body, counted by its code for /metrics. */
static void answer_error(devio_server *s, devio_reply *r, const devio_error *err)
{
    devio_metrics_error(&s->metrics, err->status);
    devio_reply_error(r, err);
}

/* The answer of a request refused on its headers, queued before its body is
 * read; the connection is closed after it. */
static enum MHD_Result answer_early(devio_server *s, struct MHD_Connection *c, req *q,
                                    devio_error *err, const char *label)
{
    devio_reply r = {.code = 500, .close = true};
    answer_error(s, &r, err);
    q->answered = true;
    return send_reply(s, c, &r, label, q);
}

/* A streamed body's sink, opened before any of the body is read; when it cannot be, the
 * request is refused at once (the body unread, the connection closed). Its bytes are hashed
 * only for an Idempotency-Key's digest. */
static enum MHD_Result open_stream(devio_server *s, struct MHD_Connection *c, req *q)
{
    devio_error err = {0};
    if (q->route->sink->open(s, &q->sink, &err) != DEVIO_OK)
        return answer_early(s, c, q, &err, q->route->path);
    bool keyed = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key") != NULL;
    devio_body_in_start(&q->upload, &s->offload, q->route->sink->write, q->sink, keyed);
    return MHD_YES;
}

/* The request's headers are in and none of its body has been read. Refused
 * here, before anything is buffered: framing that two parsers could read two
 * ways, for every method; and for POST and PUT (whose bodies routes keep), a
 * missing token and a declared length over --max-body. libmicrohttpd answers
 * a POST or PUT refused here without reading its body, and closes. */
static enum MHD_Result on_headers(devio_server *s, struct MHD_Connection *c, const char *method,
                                  req *q)
{
    devio_error err = {0};
    bool upload = strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0;
    if (upload && needs_token(s, q->on_path) &&
        !token_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        devio_fail(&err, DEVIO_E_UNAUTHORIZED, "missing or wrong bearer token");
        return answer_early(s, c, q, &err, "auth");
    }
    devio_framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
    if (devio_framing_check(&f, &err) != DEVIO_OK)
        return answer_early(s, c, q, &err, "framing");
    bool stream = q->route && q->route->body == DEVIO_ROUTE_STREAM_BODY;
    uint64_t limit = stream ? s->cfg.max_state_bytes : s->cfg.max_body;
    if (upload && f.n_length == 1 && f.length > limit) {
        devio_fail(&err, DEVIO_E_TOO_LARGE,
                   "request body of %llu bytes is larger than %llu bytes%s",
                   (unsigned long long)f.length, (unsigned long long)limit,
                   stream ? " (--max-state-bytes)" : "");
        return answer_early(s, c, q, &err, "body");
    }
    if (stream)
        return open_stream(s, c, q);
    /* A declared length is the body's size: held once, not grown by doubling
     * (a large body then costs its size, not about three times it). */
    if (q->keep_body && f.n_length == 1 && f.length > 0 && f.length <= s->cfg.max_body) {
        q->body = malloc((size_t)f.length + 1);
        q->cap = q->body ? (size_t)f.length + 1 : 0;
    }
    return MHD_YES;
}

/* Whether the client of a parked request has gone: its end of the connection
 * closed (FIN) or reset. A suspended connection is not watched by the event
 * loop, so a close is seen only here, when the request is resumed. Bytes
 * waiting to be read (a pipelined request) mean it is still there. */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls)
{
    devio_server *s = cls;
    (void)version;
    req *q = *req_cls;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q)
            return MHD_NO;
        q->start_us = devio_clock_us();
        q->method = method;
        q->url = url;
        devio_http_request_id(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id"),
                              s->store ? devio_store_epoch(s->store) : 0,
                              atomic_fetch_add(&s->request_seq, 1) + 1, q->request_id,
                              sizeof q->request_id);
        /* HEAD is GET without the body, which libmicrohttpd leaves out itself. */
        const char *as = strcmp(method, "HEAD") == 0 ? "GET" : method;
        size_t n_routes;
        const devio_route *routes = devio_server_routes(&n_routes);
        q->route = devio_route_find(routes, n_routes, as, url, &q->params, &q->on_path);
        /* One method and path, two bodies: an application/octet-stream body has its own entry. */
        if (q->route && q->route->octet_stream &&
            devio_http_octet_stream(MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                                "Content-Type")))
            q->route = q->route->octet_stream;
        q->keep_body = q->route && q->route->body == DEVIO_ROUTE_JSON_BODY;
        *req_cls = q;
        atomic_fetch_add(&s->active, 1);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        q->conn = ci ? ci->socket_context : NULL;
        devio_listener_headers(&s->listener, q->conn, true);
        return on_headers(s, c, method, q);
    }
    if (q->answered) {
        /* Refused on its headers: a body that still comes is dropped, and
         * more than --max-body of it closes the connection. */
        q->len += *upload_size;
        *upload_size = 0;
        return q->len > s->cfg.max_body ? MHD_NO : MHD_YES;
    }
    if (*upload_size) {
        /* Bodies of reads are ignored, whatever their size. */
        bool read = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
        enum MHD_Result ok = read     ? MHD_YES
                             : q->sink ? take_stream(s, c, q, upload, *upload_size)
                                       : take_upload(s, q, upload, *upload_size);
        *upload_size = 0;
        return ok;
    }
    /* Resumed with nobody to answer: closing here leaves what the request
     * holds to on_completed (a /v1/step's ticket reaped once settled, an
     * await's left awaitable), as if the close had been seen at once. */
    if (q->parked && client_gone(c))
        return MHD_NO;
    devio_reply r = {.code = 500};
    devio_error err = {0};
    const char *label = "unknown";
    if (dispatch(s, c, url, q, &r, &label, &err) != DEVIO_OK) {
        answer_error(s, &r, &err);
    } else if (r.suspended) {
        q->parked = true;
        return MHD_YES; /* parked: this runs again once the connection is resumed */
    }
    if (!r.body && !r.stream && !r.response) {
        /* A handler that answered nothing: an error, never an empty 200. */
        devio_fail(&err, DEVIO_E_NOMEM, "no reply");
        answer_error(s, &r, &err);
    }
    return send_reply(s, c, &r, label, q);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    devio_server *s = cls;
    (void)c;
    (void)toe;
    req *q = *req_cls;
    if (!q)
        return;
    devio_listener_headers(&s->listener, q->conn, false);
    /* A request that ends holding a launch or an await (its client went)
     * leaves no ticket without an owner. */
    devio_keyed_end(s, &q->keyed);
    devio_server_abandon(s, &q->op);
    devio_reply_free(&q->wreply);
    /* An import not finished gives back what it reserved. */
    if (q->sink)
        q->route->sink->close(q->sink);
    devio_body_in_free(&q->upload);
    free(q->body);
    free(q);
    *req_cls = NULL;
    atomic_fetch_sub(&s->active, 1);
}

/* A connection starts or ends: counted by the listener, which watches its
 * header deadline. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what)
{
    devio_server *s = cls;
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? devio_listener_started(&s->listener, ci->connect_fd) : NULL;
    } else {
        devio_listener_closed(&s->listener, *socket_context);
        *socket_context = NULL;
    }
}

/* The listener's hand-over: libmicrohttpd owns the socket from here, and
 * closes it when it cannot take it. */
static bool add_connection(void *ctx, int fd, const struct sockaddr *sa, socklen_t len)
{
    devio_server *s = ctx;
    return MHD_add_connection(s->mhd, fd, sa, len) == MHD_YES;
}

/* Raise the soft descriptor limit to the hard one; lower --max-connections
 * (saying so) when even that cannot hold them. */
static void fit_descriptors(devio_server_config *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)cfg->max_connections + FD_RESERVE)
        return;
    uint32_t fit = rl.rlim_cur > 2 * FD_RESERVE ? (uint32_t)(rl.rlim_cur - FD_RESERVE) : FD_RESERVE;
    devio_log(DEVIO_LOG_WARN, "start",
              "--max-connections %u lowered to %u: the descriptor limit (RLIMIT_NOFILE) is %llu",
              cfg->max_connections, fit, (unsigned long long)rl.rlim_cur);
    cfg->max_connections = fit;
}

/* Called under the waits table's lock; neither calls back into devio code. */
static void conn_suspend(void *c)
{
    MHD_suspend_connection(c);
}

static void conn_resume(void *c)
{
    MHD_resume_connection(c);
}

/* libmicrohttpd's own messages (a connection it closed on an error, ...) go
 * through devio's log: the chosen format, never blocking on stderr. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    devio_log(DEVIO_LOG_WARN, "http", "%s", msg);
}

/* ---- the HTTP half of start and stop (server_life.c does the rest) ------------- */

const devio_waits_ops devio_server_mhd_waits = {.suspend = conn_suspend, .resume = conn_resume};

devio_status devio_server_http_start(devio_server *s, const devio_listen_addr *sa,
                                     devio_error *err)
{
    devio_status st = DEVIO_OK;
    {
        fit_descriptors(&s->cfg);
        devio_listener_config lc = {.max_connections = s->cfg.max_connections,
                                    .max_per_address = s->cfg.max_per_address,
                                    .header_timeout_ms = s->cfg.header_timeout_ms,
                                    .silent_refusals = s->tls.cert != NULL};
        st = devio_listener_open(&s->listener, &lc, sa, err);
        s->listening = st == DEVIO_OK;
    }
    if (st == DEVIO_OK) {
        /* The listener caps connections first; libmicrohttpd's own cap (split
         * among its threads) is set above it so that it never refuses one. */
        unsigned mhd_cap = s->cfg.max_connections + 16 * s->cfg.http_threads;
        /* HTTPS: every connection handed over by add_connection gets a TLS
         * session (GnuTLS) from the daemon. */
        struct MHD_OptionItem tls_opts[] = {
            {MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls.cert},
            {MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls.key},
            {MHD_OPTION_END, 0, NULL},
        };
        bool tls = s->tls.cert != NULL;
        s->mhd = MHD_start_daemon(MHD_FLAGS | (tls ? MHD_USE_TLS : 0), 0, NULL, NULL,
                                  on_request, s,
                                  MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                  MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                  MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                  MHD_OPTION_CONNECTION_LIMIT, mhd_cap,
                                  MHD_OPTION_CONNECTION_TIMEOUT,
                                  (unsigned)s->cfg.connection_timeout_s,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
                                  MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads,
                                  MHD_OPTION_ARRAY, tls ? tls_opts : tls_opts + 2,
                                  MHD_OPTION_END);
        if (!s->mhd && tls)
            st = devio_fail(err, DEVIO_E_INVALID,
                            "cannot serve HTTPS with --tls-cert %s and --tls-key %s: the key does "
                            "not match the certificate or a PEM block is damaged (libmicrohttpd's "
                            "message is above)", s->cfg.tls_cert, s->cfg.tls_key);
        else if (!s->mhd)
            st = devio_fail(err, DEVIO_E_IO, "cannot start the HTTP loop for %s", s->cfg.listen);
    }
    if (st == DEVIO_OK)
        st = devio_listener_run(&s->listener, add_connection, s, err);
    if (st == DEVIO_OK)
        s->port = s->listener.port;
    return st;
}

void devio_server_http_stop(devio_server *s)
{
    /* The accept thread hands sockets to the daemon: it stops first. The
     * table stays until the daemon has reported every connection closed. */
    if (s->listening)
        devio_listener_stop(&s->listener);
    if (s->mhd)
        MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    devio_tls_free(&s->tls);
    if (s->listening)
        devio_listener_free(&s->listener);
    s->listening = false;
}
