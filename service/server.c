/* server.c - devio-server's libmicrohttpd plumbing and its route table: auth, body limits, draining, metrics labels.
 * Routes live in routes_*.c; this file must never decode a body for a route, touch SQL or compute. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/clock.h"
#include "common/log.h"
#include "device/backend.h"
#include "device/status.h"
#include "ref/builtin.h"
#include "service/framing.h"
#include "service/request_rules.h"
#include "service/route_handlers.h" /* devio_step_answer_text */
#include "service/keys.h"
#include "service/request.h"
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
    if (devio_http_json_depth(q->body, q->len) > s->cfg.max_json_depth)
        return devio_fail(err, DEVIO_E_INVALID, "JSON nested deeper than %u levels",
                          s->cfg.max_json_depth);
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

/* Everything between the request and its route's handler, in the order the
 * contract answers: 401, 413, 404, 405, draining 503, malformed body 400.
 * *label is the metrics label of the answer. */
static devio_status dispatch(devio_server *s, struct MHD_Connection *c, const char *url,
                             const char *method, req *q, devio_reply *r,
                             const char **label, devio_error *err)
{
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
    if (q->route->refused_while_draining && atomic_load(&s->draining)) {
        r->close = true;
        return devio_fail(err, DEVIO_E_NOT_READY, "server is draining; launch elsewhere");
    }
    devio_request rq = {.method = method, .url = url, .params = q->params, .conn = c,
                        .wait = &q->wait, .op = &q->op, .request_id = q->request_id};
    json_t *body = NULL;
    devio_status st = DEVIO_OK;
    if (q->route->body == DEVIO_ROUTE_JSON_BODY) {
        st = devio_http_json_media_type(
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"), err);
        if (st == DEVIO_OK)
            st = parse_body(s, q, &body, err);
    }
    rq.body = body;
    bool answered = false;
    if (st == DEVIO_OK && q->route->keyed)
        st = devio_keyed_before(s, &rq,
                                MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key"),
                                &q->keyed, r, &answered, err);
    if (st == DEVIO_OK && !answered)
        st = q->route->handler(s, &rq, r, err);
    if (!answered && q->route->keyed)
        devio_keyed_after(s, &rq, &q->keyed, st, r);
    json_decref(body);
    return st;
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

static enum MHD_Result send_reply(devio_server *s, struct MHD_Connection *c, devio_reply *r,
                                  const char *label, const req *q)
{
    size_t bytes = r->len;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
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
    if (upload && f.n_length == 1 && f.length > s->cfg.max_body) {
        devio_fail(&err, DEVIO_E_TOO_LARGE, "request body of %llu bytes is larger than %u bytes",
                   (unsigned long long)f.length, s->cfg.max_body);
        return answer_early(s, c, q, &err, "body");
    }
    return MHD_YES;
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
        enum MHD_Result ok = read ? MHD_YES : take_upload(s, q, upload, *upload_size);
        *upload_size = 0;
        return ok;
    }
    devio_reply r = {.code = 500};
    devio_error err = {0};
    const char *label = "unknown";
    if (dispatch(s, c, url, method, q, &r, &label, &err) != DEVIO_OK)
        answer_error(s, &r, &err);
    else if (r.suspended)
        return MHD_YES; /* parked: this runs again once the connection is resumed */
    if (!r.body) {
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
    devio_keyed_end(s, &q->keyed, &q->op);
    devio_server_abandon(s, &q->op);
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

static const devio_waits_ops mhd_waits = {.suspend = conn_suspend, .resume = conn_resume};

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

/* ---- start and stop ------------------------------------------------------------- */

static devio_status read_token(devio_server *s, devio_error *err)
{
    const char *tok = s->cfg.token;
    char buf[4096];
    if (s->cfg.token_file) {
        FILE *f = fopen(s->cfg.token_file, "r");
        if (!f)
            return devio_fail(err, DEVIO_E_IO, "cannot read token file %s: %s",
                              s->cfg.token_file, strerror(errno));
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
            n--;
        buf[n] = '\0';
        if (n == 0)
            return devio_fail(err, DEVIO_E_INVALID, "token file %s is empty", s->cfg.token_file);
        tok = buf;
    }
    if (tok) {
        s->token = strdup(tok);
        s->token_len = strlen(tok);
        if (!s->token)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    }
    return DEVIO_OK;
}

devio_status devio_server_start(devio_server *s, const devio_server_config *cfg,
                                devio_error *err)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    pthread_rwlock_init(&s->dev_lock, NULL);
    pthread_mutex_init(&s->launch_mu, NULL);
    devio_metrics_init(&s->metrics);
    devio_adapters_init(&s->adapters);
    devio_keys_init(&s->keys);
    s->tickets.metrics = &s->metrics;
    s->tickets.answer = devio_step_answer_text;
    devio_listen_addr sa;
    devio_status st = devio_listen_addr_parse(cfg->listen, &sa, err);
    if (st == DEVIO_OK)
        st = devio_tls_load(&s->tls, cfg->tls_cert, cfg->tls_key, err);
    devio_config dc = cfg->device;
    const devio_backend_ops *ops = NULL;
    devio_registry_builtin(&s->registry, cfg->backend_path);
    if (st == DEVIO_OK)
        st = devio_registry_find(&s->registry, cfg->backend, &ops, err);
    if (st == DEVIO_OK && s->registry.note[0])
        devio_log(DEVIO_LOG_INFO, "backend", "backend auto passed over %s", s->registry.note);
    if (st == DEVIO_OK)
        st = read_token(s, err);
    devio_model_params mp = devio_model_params_default();
    mp.skip_weight_scan = cfg->device.skip_weight_scan;
    if (st == DEVIO_OK)
        st = devio_model_load_with(cfg->model, &mp, &s->model, err);
    if (st == DEVIO_OK)
        st = devio_waits_start(&s->waits, &mhd_waits, err);
    if (st == DEVIO_OK)
        st = devio_leases_start(&s->leases, cfg->ticket_lease_ms, &devio_server_reaper, s, err);
    s->tickets.leases = &s->leases;
    devio_store_options so = devio_store_options_default();
    so.retention = cfg->retention;
    so.on_written = devio_server_written;
    so.on_written_ctx = s;
    if (st == DEVIO_OK)
        st = devio_store_open(cfg->db, &so, &s->store, err);
    s->tickets.store = s->store;
    if (st == DEVIO_OK) {
        dc.epoch = devio_store_epoch(s->store);
        dc.first_ticket_id = devio_store_next_ticket_id(s->store);
        dc.use_worker_thread = true;
        dc.on_settled = devio_server_settled;
        dc.on_settled_ctx = s;
        st = devio_adapters_root(cfg->adapters, cfg->adapters_given, &dc.adapters_root, err);
    }
    if (st == DEVIO_OK) {
        st = devio_open(s->model, ops, &dc, &s->dev, err);
    }
    /* A backend that copied the weights (CUDA) never reads the host's again. */
    if (st == DEVIO_OK && ops->copies_weights) {
        devio_model_release_weights(s->model);
        devio_log(DEVIO_LOG_INFO, "start",
                  "backend '%s' holds the weights; their host memory was released", ops->name);
    }
    if (st == DEVIO_OK) {
        devio_device_info di = {0};
        devio_device_info_get(s->dev, &di);
        devio_metrics_set_backend(&s->metrics, di.backend);
    }
    /* Before listening: the adapters recorded as loaded are loaded again, so
     * the first request sees the same table the last process had. */
    if (st == DEVIO_OK)
        st = devio_adapters_start(&s->adapters, s->store, s->dev, NULL, err);
    if (st == DEVIO_OK) {
        fit_descriptors(&s->cfg);
        devio_listener_config lc = {.max_connections = s->cfg.max_connections,
                                    .max_per_address = s->cfg.max_per_address,
                                    .header_timeout_ms = s->cfg.header_timeout_ms,
                                    .silent_refusals = s->tls.cert != NULL};
        st = devio_listener_open(&s->listener, &lc, &sa, err);
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
                                  (unsigned)cfg->connection_timeout_s,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
                                  MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->http_threads,
                                  MHD_OPTION_ARRAY, tls ? tls_opts : tls_opts + 2,
                                  MHD_OPTION_END);
        if (!s->mhd && tls)
            st = devio_fail(err, DEVIO_E_INVALID,
                            "cannot serve HTTPS with --tls-cert %s and --tls-key %s: the key does "
                            "not match the certificate or a PEM block is damaged (libmicrohttpd's "
                            "message is above)", cfg->tls_cert, cfg->tls_key);
        else if (!s->mhd)
            st = devio_fail(err, DEVIO_E_IO, "cannot start the HTTP loop for %s", cfg->listen);
    }
    if (st == DEVIO_OK)
        st = devio_listener_run(&s->listener, add_connection, s, err);
    if (st != DEVIO_OK) {
        devio_server_stop(s);
        return st;
    }
    s->port = s->listener.port;
    atomic_store(&s->ready, true);
    return DEVIO_OK;
}

/* Tickets launched and not yet awaited; 0 after teardown. */
static uint32_t tickets_in_flight(devio_server *s)
{
    devio_device *dev;
    if (devio_server_hold(s, &dev, NULL) != DEVIO_OK)
        return 0;
    uint32_t n = devio_facts_get(dev).tickets_in_flight;
    devio_server_release(s);
    return n;
}

void devio_server_stop(devio_server *s)
{
    atomic_store(&s->ready, false);
    atomic_store(&s->draining, true);
    if (s->mhd) {
        /* Drain for a bounded time: /readyz answers 503 and launches are
         * refused (not_ready), but the listener stays open, so that clients,
         * new connections included, still await what they launched and read
         * facts, history and metrics; requests in progress finish. */
        for (uint32_t waited = 0; waited < s->cfg.drain_ms &&
                                  (tickets_in_flight(s) > 0 || atomic_load(&s->active) > 0);
             waited += 10)
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    }
    uint32_t aborted = 0;
    devio_server_teardown(s, "server stopped", &aborted);
    /* Teardown settled every step, which resumed the awaits parked on them;
     * none may stay suspended when the daemon stops. */
    if (s->waits.timer_started)
        devio_waits_close(&s->waits);
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
    /* The daemon's last completions may have queued jobs for the reaper,
     * which find the device gone; the store's last batches resume nothing
     * (no connection is left), then the table stops. */
    devio_leases_stop(&s->leases);
    devio_store_close(s->store);
    s->store = NULL;
    devio_waits_stop(&s->waits);
    devio_registry_close(&s->registry);
    devio_model_free(s->model);
    s->model = NULL;
    free(s->token);
    s->token = NULL;
    devio_adapters_fini(&s->adapters);
    devio_keys_destroy(&s->keys);
    devio_metrics_fini(&s->metrics);
    pthread_rwlock_destroy(&s->dev_lock);
    pthread_mutex_destroy(&s->launch_mu);
}
