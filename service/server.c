/* server.c - libmicrohttpd plumbing, auth, limits and the routes of DESIGN §7.
 * Every answer goes through reply_error/reply_json; no route computes or touches SQL directly. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "api/codec.h"
#include "api/dispatch.h"
#include "device/backend.h"
#include "ref/ref_backend.h"
#include "device/status.h"
#include "service/http_error.h"
#include "service/server.h"

extern const char devio_openapi_yaml[];
extern const unsigned long devio_openapi_yaml_len;

/* Per-request state, kept in libmicrohttpd's req_cls across calls. */
typedef struct req {
    char *body;
    size_t len, cap;
    bool too_large;
} req;

/* What a route answers. */
typedef struct reply {
    unsigned code;
    char *body; /* malloc'd */
    size_t len;
    const char *ctype;
    const char *route; /* template, for metrics */
    bool close;        /* ask the client to close the connection */
} reply;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- replies ---------------------------------------------------------------- */

static void reply_json(reply *r, unsigned code, json_t *j)
{
    r->code = code;
    r->ctype = "application/json";
    r->body = j ? json_dumps(j, DEVIO_JSON_FLAGS) : NULL;
    json_decref(j);
    if (!r->body) {
        r->code = 500;
        r->body = strdup("{\"error\":{\"code\":\"out_of_memory\",\"message\":\"encoding\","
                         "\"details\":{}}}");
    }
    r->len = r->body ? strlen(r->body) : 0;
}

static void reply_error(reply *r, const devio_error *e)
{
    reply_json(r, devio_http_code(e->status), devio_json_error(e));
}

static void reply_fail(reply *r, devio_status s, const char *fmt, const char *arg)
{
    devio_error e = {0};
    devio_fail(&e, s, fmt, arg);
    reply_error(r, &e);
}

/* ---- helpers ---------------------------------------------------------------- */

/* Nesting depth of a JSON text, counting brackets outside strings. */
static unsigned json_depth(const char *p, size_t n)
{
    unsigned depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max)
                max = depth;
        } else if (c == ']' || c == '}') {
            if (depth)
                depth--;
        }
    }
    return max;
}

static json_t *parse_body(devio_server *s, const req *q, reply *r)
{
    if (q->len == 0) {
        reply_fail(r, DEVIO_E_INVALID, "request body must be JSON%s", "");
        return NULL;
    }
    if (json_depth(q->body, q->len) > s->cfg.max_json_depth) {
        char lim[32];
        snprintf(lim, sizeof lim, "%u", s->cfg.max_json_depth);
        reply_fail(r, DEVIO_E_INVALID, "JSON nested deeper than %s levels", lim);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(q->body, q->len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        devio_error e = {0};
        devio_fail(&e, DEVIO_E_INVALID, "malformed JSON at line %d column %d: %s", je.line,
                   je.column, je.text);
        reply_error(r, &e);
    }
    return j;
}

/* Constant-time comparison of the presented bearer token. */
static bool token_ok(const devio_server *s, const char *header)
{
    static const char prefix[] = "Bearer ";
    if (!header || strncmp(header, prefix, sizeof prefix - 1) != 0)
        return false;
    const char *t = header + sizeof prefix - 1;
    size_t n = strlen(t);
    unsigned char diff = (unsigned char)(n != s->token_len);
    for (size_t i = 0; i < s->token_len; i++)
        diff |= (unsigned char)(s->token[i] ^ (i < n ? t[i] : 0));
    return diff == 0;
}

/* Ids and integer query values: decimal, at most INT64_MAX (JSON integers are signed). */
static bool parse_id(const char *p, size_t n, uint64_t *out)
{
    if (n == 0 || n > 19)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX)
        return false;
    *out = v;
    return true;
}

static bool query_u64(struct MHD_Connection *c, const char *key, uint64_t *out, bool *bad)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    if (!v)
        return false;
    if (!parse_id(v, strlen(v), out))
        *bad = true;
    return true;
}

/* Run `op` on the device under the read lock. */
static devio_status device_call(devio_server *s, const char *op, const json_t *body,
                                json_t **result, devio_error *err)
{
    pthread_rwlock_rdlock(&s->dev_lock);
    devio_status st = s->dev ? devio_api_call(s->dev, op, body, result, err)
                             : devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    pthread_rwlock_unlock(&s->dev_lock);
    return st;
}

/* ---- tickets: device + store -------------------------------------------------- */

static char *seqs_text(const json_t *plan)
{
    json_t *a = json_array();
    const json_t *rows = json_object_get(plan, "rows"), *row;
    size_t i;
    json_array_foreach(rows, i, row) json_array_append(a, json_object_get(row, "seq"));
    char *t = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return t;
}

static devio_status launch(devio_server *s, const json_t *plan, uint64_t *ticket,
                           devio_error *err)
{
    json_t *res = NULL;
    devio_status st = device_call(s, "launch", plan, &res, err);
    if (st != DEVIO_OK)
        return st;
    *ticket = (uint64_t)json_integer_value(json_object_get(res, "ticket"));
    json_decref(res);
    devio_metrics_launched(&s->metrics);
    uint32_t tokens = 0;
    const json_t *row;
    size_t i;
    json_array_foreach(json_object_get(plan, "rows"), i, row)
        tokens += (uint32_t)json_array_size(json_object_get(row, "tokens"));
    char *seqs = seqs_text(plan);
    devio_ticket_record rec = {.id = *ticket, .status = "in_flight", .launched_ms = now_ms(),
                               .rows = (uint32_t)json_array_size(json_object_get(plan, "rows")),
                               .tokens = tokens, .seqs = seqs ? seqs : "[]"};
    /* The client sees the id only once its row is committed. The step is
     * queued either way, so a failed history write is logged, not returned:
     * the client must learn the id to await it. */
    devio_error werr = {0};
    if (devio_store_wait(s->store, devio_store_ticket_launched(s->store, &rec), &werr) != DEVIO_OK)
        fprintf(stderr, "devio-server: history write for ticket %llu failed: %s\n",
                (unsigned long long)*ticket, werr.message);
    free(seqs);
    return DEVIO_OK;
}

static devio_status await_ticket(devio_server *s, uint64_t ticket, int64_t timeout_ms,
                                 json_t **result, devio_error *err)
{
    json_t *body = json_pack("{s:I}", "ticket", (json_int_t)ticket);
    if (timeout_ms >= 0)
        json_object_set_new(body, "timeout_ms", json_integer(timeout_ms));
    devio_status st = device_call(s, "await", body, result, err);
    json_decref(body);
    if (st == DEVIO_E_TICKET_PENDING || st == DEVIO_E_TICKET_CONSUMED ||
        st == DEVIO_E_UNKNOWN_TICKET || st == DEVIO_E_TORN_DOWN)
        return st;
    devio_ticket_record rec = {.id = ticket, .settled_ms = now_ms()};
    if (st == DEVIO_OK) {
        const json_t *timing = json_object_get(*result, "timing");
        rec.status = "ok";
        rec.queued_us = (uint64_t)json_integer_value(json_object_get(timing, "queued_us"));
        rec.compute_us = (uint64_t)json_integer_value(json_object_get(timing, "compute_us"));
        devio_metrics_step(&s->metrics, rec.compute_us,
                           (uint32_t)json_integer_value(json_object_get(*result, "tokens")),
                           true);
    } else {
        rec.status = "failed";
        rec.error_code = devio_status_str(st);
        rec.error_message = err->message;
        devio_metrics_step(&s->metrics, 0, 0, false);
    }
    /* The ticket is consumed either way: a failed history write must not
     * take the result from the client, so it is logged and the answer stands. */
    devio_error werr = {0};
    if (devio_store_wait(s->store, devio_store_ticket_settled(s->store, &rec), &werr) != DEVIO_OK)
        fprintf(stderr, "devio-server: history write for ticket %llu failed: %s\n",
                (unsigned long long)ticket, werr.message);
    return st;
}

/* ---- routes ------------------------------------------------------------------- */

static void route_launch(devio_server *s, const json_t *body, reply *r)
{
    uint64_t ticket;
    devio_error err = {0};
    if (launch(s, body, &ticket, &err) != DEVIO_OK)
        return reply_error(r, &err);
    reply_json(r, 202, json_pack("{s:I}", "ticket", (json_int_t)ticket));
}

static void route_await(devio_server *s, struct MHD_Connection *c, uint64_t ticket, reply *r)
{
    uint64_t t = 0;
    bool bad = false;
    int64_t timeout = -1;
    /* Long polls are capped at one hour; clients retry on ticket_pending. */
    if (query_u64(c, "timeout_ms", &t, &bad))
        timeout = (int64_t)(t > 3600000u ? 3600000u : t);
    if (bad)
        return reply_fail(r, DEVIO_E_INVALID, "timeout_ms must be a non-negative integer%s", "");
    json_t *res = NULL;
    devio_error err = {0};
    if (await_ticket(s, ticket, timeout, &res, &err) != DEVIO_OK)
        return reply_error(r, &err);
    reply_json(r, 200, res);
}

static void route_step(devio_server *s, const json_t *body, reply *r)
{
    uint64_t ticket;
    json_t *res = NULL;
    devio_error err = {0};
    if (launch(s, body, &ticket, &err) != DEVIO_OK ||
        await_ticket(s, ticket, -1, &res, &err) != DEVIO_OK)
        return reply_error(r, &err);
    reply_json(r, 200, res);
}

static void route_simple(devio_server *s, const char *op, const json_t *body, unsigned code,
                         reply *r)
{
    json_t *res = NULL;
    devio_error err = {0};
    if (device_call(s, op, body, &res, &err) != DEVIO_OK)
        return reply_error(r, &err);
    reply_json(r, code, res);
}

static void route_logits(devio_server *s, struct MHD_Connection *c, uint64_t id, reply *r)
{
    devio_error err = {0};
    uint64_t top = 5, row = 0;
    bool bad = false;
    query_u64(c, "top", &top, &bad);
    query_u64(c, "row", &row, &bad);
    if (bad || top > 1000)
        return reply_fail(r, DEVIO_E_INVALID, "top (<= 1000) and row must be integers%s", "");
    const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    bool raw = accept && strstr(accept, "application/octet-stream");
    pthread_rwlock_rdlock(&s->dev_lock);
    uint32_t rows = 0, vocab = s->model->cfg.vocab_size;
    float *data = NULL;
    devio_status st = s->dev ? devio_logits_read(s->dev, id, 0, 0, NULL, &rows, &err)
                             : devio_fail(&err, DEVIO_E_TORN_DOWN, "device torn down");
    if (st == DEVIO_OK) {
        data = malloc((size_t)rows * vocab * sizeof *data + 1);
        st = data ? devio_logits_read(s->dev, id, 0, rows, data, &rows, &err)
                  : devio_fail(&err, DEVIO_E_NOMEM, "out of memory");
    }
    pthread_rwlock_unlock(&s->dev_lock);
    if (st != DEVIO_OK) {
        free(data);
        return reply_error(r, &err);
    }
    if (raw) {
        /* Little-endian f32, the host order of every platform devio runs on. */
        r->code = 200;
        r->ctype = "application/octet-stream";
        r->body = (char *)data;
        r->len = (size_t)rows * vocab * sizeof(float);
        return;
    }
    if (row >= rows) {
        free(data);
        return reply_fail(r, DEVIO_E_INVALID, "row is outside the handle's rows%s", "");
    }
    const float *v = data + (size_t)row * vocab;
    json_t *list = json_array();
    /* Partial selection: top is small, vocab is large. */
    uint32_t k = (uint32_t)(top < vocab ? top : vocab);
    int32_t *best = calloc(k ? k : 1, sizeof *best);
    uint32_t n = 0;
    for (uint32_t i = 0; best && i < vocab; i++) {
        uint32_t pos = n;
        while (pos > 0 && (v[i] > v[best[pos - 1]]))
            pos--;
        if (pos >= k)
            continue;
        uint32_t end = n < k ? n : k - 1;
        memmove(best + pos + 1, best + pos, (end - pos) * sizeof *best);
        best[pos] = (int32_t)i;
        if (n < k)
            n++;
    }
    for (uint32_t i = 0; i < n; i++)
        json_array_append_new(list, json_pack("[i,o]", best[i], devio_json_float(v[best[i]])));
    free(best);
    free(data);
    reply_json(r, 200, json_pack("{s:[i,i],s:I,s:o}", "shape", rows, vocab, "row",
                                 (json_int_t)row, "top", list));
}

static void route_device(devio_server *s, reply *r)
{
    const devio_model_config *m = &s->model->cfg;
    pthread_rwlock_rdlock(&s->dev_lock);
    if (!s->dev) {
        pthread_rwlock_unlock(&s->dev_lock);
        return reply_fail(r, DEVIO_E_TORN_DOWN, "device torn down%s", "");
    }
    const devio_config *c = devio_config_of(s->dev);
    json_t *j = json_pack(
        "{s:s,s:s,s:{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b},s:i,s:{s:i,s:i,s:i,s:i,s:i,"
        "s:i,s:i,s:i,s:i,s:i},s:i,s:I}",
        "backend", "ref", "numerics", "strict", "model", "architecture", m->architecture,
        "dtype", devio_dtype_str(s->model->layers[0].wq.dtype), "vocab_size", m->vocab_size,
        "hidden_size", m->hidden_size, "intermediate_size", m->intermediate_size, "layers",
        m->n_layers, "heads", m->n_heads, "kv_heads", m->n_kv_heads, "head_dim", m->head_dim,
        "max_position_embeddings", m->max_position_embeddings, "tied_embeddings",
        m->tie_word_embeddings, "max_depth", c->max_depth, "limits", "block_size", c->block_size,
        "kv_blocks", c->kv_blocks, "max_seqs", c->max_seqs, "max_seq_len", c->max_seq_len,
        "max_rows", c->max_rows, "max_batch_tokens", c->max_batch_tokens, "logits_handles",
        c->logits_handles, "logits_rows", c->logits_rows, "max_loras", c->max_loras,
        "max_lora_rank", c->max_lora_rank, "threads", c->threads, "epoch",
        (json_int_t)c->epoch);
    pthread_rwlock_unlock(&s->dev_lock);
    reply_json(r, 200, j);
}

static void route_tickets(devio_server *s, struct MHD_Connection *c, reply *r)
{
    devio_ticket_query q = {.limit = 50};
    uint64_t v;
    bool bad = false;
    if (query_u64(c, "limit", &v, &bad))
        q.limit = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
    if (query_u64(c, "before", &v, &bad))
        q.before_id = v;
    if (query_u64(c, "since_ms", &v, &bad))
        q.since_ms = (int64_t)v;
    if (query_u64(c, "until_ms", &v, &bad))
        q.until_ms = (int64_t)v;
    q.status = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "status");
    if (bad)
        return reply_fail(r, DEVIO_E_INVALID,
                          "limit, before, since_ms and until_ms must be integers%s", "");
    if (q.status && strcmp(q.status, "in_flight") && strcmp(q.status, "ok") &&
        strcmp(q.status, "failed") && strcmp(q.status, "aborted"))
        return reply_fail(r, DEVIO_E_INVALID,
                          "status must be in_flight, ok, failed or aborted, not '%s'", q.status);
    json_t *out = NULL;
    devio_error err = {0};
    if (devio_store_tickets_query(s->store, &q, &out, &err) != DEVIO_OK)
        return reply_error(r, &err);
    reply_json(r, 200, out);
}

static void route_teardown(devio_server *s, reply *r)
{
    pthread_rwlock_wrlock(&s->dev_lock);
    uint32_t aborted = 0;
    bool was_up = s->dev != NULL;
    if (s->dev) {
        devio_teardown(s->dev, &aborted);
        s->dev = NULL;
    }
    pthread_rwlock_unlock(&s->dev_lock);
    if (!was_up)
        return reply_fail(r, DEVIO_E_TORN_DOWN, "device already torn down%s", "");
    atomic_store(&s->ready, false);
    devio_metrics_aborted(&s->metrics, aborted);
    devio_error err = {0};
    devio_store_wait(s->store, devio_store_abort_in_flight(s->store, "device torn down"), &err);
    reply_json(r, 200, json_pack("{s:b,s:i}", "torn_down", 1, "aborted", aborted));
}

/* The adapter routes; `action` is "pin" or "unpin" for POST /v1/adapters/{name}/ACTION.
 * service/adapters.c keeps the device's table and the store's rows in step. */
static void route_adapters(devio_server *s, const char *method, const char *name,
                           const char *action, const json_t *body, reply *r)
{
    const char *path = NULL;
    bool pin = false;
    if (body) {
        if (!json_is_object(body))
            return reply_fail(r, DEVIO_E_INVALID, "adapter body must be a JSON object%s", "");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)body, k, v) if (strcmp(k, "path") && strcmp(k, "pin"))
            return reply_fail(r, DEVIO_E_INVALID, "unknown field '%s' in the adapter body", k);
        const json_t *jp = json_object_get(body, "pin");
        path = json_string_value(json_object_get(body, "path"));
        if (!path || !path[0])
            return reply_fail(r, DEVIO_E_INVALID, "load needs a non-empty string 'path'%s", "");
        if (jp && !json_is_boolean(jp))
            return reply_fail(r, DEVIO_E_INVALID, "'pin' must be a boolean%s", "");
        pin = json_is_true(jp);
    }
    json_t *out = NULL;
    devio_error err = {0};
    devio_status st;
    pthread_rwlock_rdlock(&s->dev_lock);
    if (!s->dev)
        st = devio_fail(&err, DEVIO_E_TORN_DOWN, "device torn down");
    else if (!name)
        st = devio_adapters_list(&s->adapters, s->dev, &out, &err);
    else if (action)
        st = devio_adapters_pin(&s->adapters, s->dev, name, strcmp(action, "pin") == 0, &out,
                                &err);
    else if (strcmp(method, "PUT") == 0)
        st = devio_adapters_load(&s->adapters, s->dev, name, path, pin, &out, &err);
    else if (strcmp(method, "DELETE") == 0)
        st = devio_adapters_unload(&s->adapters, s->dev, name, &out, &err);
    else
        st = devio_adapters_get(&s->adapters, s->dev, name, &out, &err);
    pthread_rwlock_unlock(&s->dev_lock);
    if (st != DEVIO_OK)
        return reply_error(r, &err);
    reply_json(r, 200, out);
}

/* ---- dispatch by path ---------------------------------------------------------- */

static bool is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* Split "/v1/x/123/await" into up to 5 segments. */
static int split(const char *url, const char *seg[5], size_t len[5])
{
    int n = 0;
    const char *p = url;
    while (*p == '/')
        p++;
    while (*p && n < 5) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        seg[n] = p;
        len[n++] = l;
        p += l;
        while (*p == '/')
            p++;
    }
    return *p ? -1 : n;
}

static bool seg_is(const char *seg, size_t len, const char *lit)
{
    return strlen(lit) == len && strncmp(seg, lit, len) == 0;
}

static void handle(devio_server *s, struct MHD_Connection *c, const char *url,
                   const char *method, req *q, reply *r)
{
    const char *seg[5];
    size_t len[5];
    int n = split(url, seg, len);
    bool get = is(method, "GET"), post = is(method, "POST"), del = is(method, "DELETE"),
         put = is(method, "PUT");
    uint64_t id = 0;

    /* Open routes: health, readiness, metrics (unless --auth-health). */
    bool open_route = n == 1 && (seg_is(seg[0], len[0], "healthz") ||
                                 seg_is(seg[0], len[0], "readyz") ||
                                 seg_is(seg[0], len[0], "metrics"));
    if (s->token && (!open_route || s->cfg.auth_health) &&
        !token_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        r->route = "auth";
        return reply_fail(r, DEVIO_E_UNAUTHORIZED, "missing or wrong bearer token%s", "");
    }
    if (q->too_large) {
        r->route = "body";
        char lim[32];
        snprintf(lim, sizeof lim, "%u", s->cfg.max_body);
        return reply_fail(r, DEVIO_E_TOO_LARGE, "request body larger than %s bytes", lim);
    }
    if (open_route) {
        if (!get) {
            r->route = "health";
            return reply_fail(r, DEVIO_E_METHOD, "use GET%s", "");
        }
        if (seg_is(seg[0], len[0], "healthz")) {
            r->route = "/healthz";
            return reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
        }
        if (seg_is(seg[0], len[0], "readyz")) {
            r->route = "/readyz";
            if (!atomic_load(&s->ready))
                return reply_fail(r, DEVIO_E_NOT_READY, "not serving%s", "");
            return reply_json(r, 200, json_pack("{s:s}", "status", "ready"));
        }
        r->route = "/metrics";
        pthread_rwlock_rdlock(&s->dev_lock);
        devio_facts f;
        devio_lora_ack live = {0};
        devio_metrics_adapters ma = {0};
        bool up = s->dev != NULL;
        if (up) {
            f = devio_facts_get(s->dev);
            /* rows_served per adapter comes from the device's table as it is now. */
            devio_lora_cmd list = {.kind = DEVIO_LORA_LIST};
            if (devio_lora(s->dev, &list, &live, NULL) == DEVIO_OK) {
                ma.live = live.adapters;
                ma.n_live = live.n_adapters;
            }
            ma.capacity = devio_config_of(s->dev)->max_loras;
        }
        pthread_rwlock_unlock(&s->dev_lock);
        r->code = 200;
        r->ctype = "text/plain; version=0.0.4";
        r->body = devio_metrics_render(&s->metrics, up ? &f : NULL, up ? &ma : NULL);
        devio_lora_ack_free(&live);
        r->len = r->body ? strlen(r->body) : 0;
        return;
    }
    if (n < 2 || !seg_is(seg[0], len[0], "v1")) {
        r->route = "unknown";
        return reply_fail(r, DEVIO_E_NOT_FOUND, "no route %s", url);
    }
    const char *res = seg[1];
    size_t rl = len[1];
    bool has_id = n >= 3 && parse_id(seg[2], len[2], &id);
    json_t *body = NULL;
#define BODY()                                                                                  \
    do {                                                                                        \
        body = parse_body(s, q, r);                                                             \
        if (!body)                                                                              \
            return;                                                                             \
    } while (0)
#define ROUTE(tmpl, cond)                                                                       \
    if ((r->route = tmpl, cond))
#define METHOD_ERR() return reply_fail(r, DEVIO_E_METHOD, "method not allowed on %s", url)

    if (seg_is(res, rl, "sequences") && n == 2) {
        r->route = "/v1/sequences";
        if (!post)
            METHOD_ERR();
        return route_simple(s, "create", NULL, 201, r);
    }
    if (seg_is(res, rl, "sequences") && n == 3 && has_id) {
        r->route = "/v1/sequences/{id}";
        json_t *b = json_pack("{s:I}", "seq", (json_int_t)id);
        if (get)
            route_simple(s, "seq", b, 200, r);
        else if (del) {
            json_object_set_new(b, "kind", json_string("free"));
            route_simple(s, "apply", b, 200, r);
        } else
            reply_fail(r, DEVIO_E_METHOD, "method not allowed on %s", url);
        json_decref(b);
        return;
    }
    if ((seg_is(res, rl, "launch") || seg_is(res, rl, "step")) && n == 2 && post &&
        atomic_load(&s->draining)) {
        r->route = seg_is(res, rl, "launch") ? "/v1/launch" : "/v1/step";
        r->close = true;
        return reply_fail(r, DEVIO_E_NOT_READY, "server is draining; launch elsewhere%s", "");
    }
    ROUTE("/v1/launch", seg_is(res, rl, "launch") && n == 2)
    {
        if (!post)
            METHOD_ERR();
        BODY();
        route_launch(s, body, r);
        json_decref(body);
        return;
    }
    ROUTE("/v1/step", seg_is(res, rl, "step") && n == 2)
    {
        if (!post)
            METHOD_ERR();
        BODY();
        route_step(s, body, r);
        json_decref(body);
        return;
    }
    ROUTE("/v1/tickets/{id}/await",
          seg_is(res, rl, "tickets") && n == 4 && has_id && seg_is(seg[3], len[3], "await"))
    {
        if (!post)
            METHOD_ERR();
        return route_await(s, c, id, r);
    }
    ROUTE("/v1/tickets", seg_is(res, rl, "tickets") && n == 2)
    {
        if (!get)
            METHOD_ERR();
        return route_tickets(s, c, r);
    }
    ROUTE("/v1/effects", seg_is(res, rl, "effects") && n == 2)
    {
        if (!post)
            METHOD_ERR();
        BODY();
        route_simple(s, "apply", body, 200, r);
        json_decref(body);
        return;
    }
    ROUTE("/v1/logits/{id}", seg_is(res, rl, "logits") && n == 3 && has_id)
    {
        if (!get)
            METHOD_ERR();
        return route_logits(s, c, id, r);
    }
    ROUTE("/v1/facts", seg_is(res, rl, "facts") && n == 2)
    {
        if (!get)
            METHOD_ERR();
        return route_simple(s, "facts", NULL, 200, r);
    }
    ROUTE("/v1/device", seg_is(res, rl, "device") && n == 2)
    {
        if (!get)
            METHOD_ERR();
        return route_device(s, r);
    }
    ROUTE("/v1/teardown", seg_is(res, rl, "teardown") && n == 2)
    {
        if (!post)
            METHOD_ERR();
        return route_teardown(s, r);
    }
    ROUTE("/v1/openapi.yaml", seg_is(res, rl, "openapi.yaml") && n == 2)
    {
        if (!get)
            METHOD_ERR();
        r->code = 200;
        r->ctype = "application/yaml";
        r->body = malloc(devio_openapi_yaml_len + 1);
        if (r->body)
            memcpy(r->body, devio_openapi_yaml, devio_openapi_yaml_len);
        r->len = r->body ? devio_openapi_yaml_len : 0;
        return;
    }
    ROUTE("/v1/adapters", seg_is(res, rl, "adapters") && n == 2)
    {
        if (!get)
            METHOD_ERR();
        return route_adapters(s, method, NULL, NULL, NULL, r);
    }
    ROUTE("/v1/adapters/{name}", seg_is(res, rl, "adapters") && n == 3)
    {
        char name[64];
        if (len[2] >= sizeof name)
            return reply_fail(r, DEVIO_E_INVALID, "adapter name too long%s", "");
        memcpy(name, seg[2], len[2]);
        name[len[2]] = '\0';
        if (put) {
            BODY();
        } else if (!get && !del) {
            METHOD_ERR();
        }
        route_adapters(s, method, name, NULL, body, r);
        json_decref(body);
        return;
    }
    ROUTE("/v1/adapters/{name}/pin",
          seg_is(res, rl, "adapters") && n == 4 &&
              (seg_is(seg[3], len[3], "pin") || seg_is(seg[3], len[3], "unpin")))
    {
        char name[64];
        bool pin = seg_is(seg[3], len[3], "pin");
        if (!pin)
            r->route = "/v1/adapters/{name}/unpin";
        if (!post)
            METHOD_ERR();
        if (len[2] >= sizeof name)
            return reply_fail(r, DEVIO_E_INVALID, "adapter name too long%s", "");
        memcpy(name, seg[2], len[2]);
        name[len[2]] = '\0';
        return route_adapters(s, method, name, pin ? "pin" : "unpin", NULL, r);
    }
    r->route = "unknown";
    reply_fail(r, DEVIO_E_NOT_FOUND, "no route %s", url);
#undef BODY
#undef ROUTE
#undef METHOD_ERR
}

/* ---- libmicrohttpd callbacks ---------------------------------------------------- */

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
        *req_cls = q;
        atomic_fetch_add(&s->active, 1);
        return MHD_YES;
    }
    if (*upload_size && (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)) {
        *upload_size = 0; /* bodies of reads are ignored, whatever their size */
        return MHD_YES;
    }
    if (*upload_size) {
        if (!q->too_large && q->len + *upload_size > s->cfg.max_body) {
            q->too_large = true;
            free(q->body);
            q->body = NULL;
            q->len = q->cap = 0;
        }
        if (!q->too_large) {
            if (q->len + *upload_size + 1 > q->cap) {
                size_t cap = (q->len + *upload_size + 1) * 2;
                char *b = realloc(q->body, cap);
                if (!b)
                    return MHD_NO;
                q->body = b;
                q->cap = cap;
            }
            memcpy(q->body + q->len, upload, *upload_size);
            q->len += *upload_size;
            q->body[q->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    reply r = {.code = 500, .route = "unknown"};
    handle(s, c, url, method, q, &r);
    if (!r.body) {
        r.code = 500;
        r.body = strdup("{\"error\":{\"code\":\"out_of_memory\",\"message\":\"no reply\","
                        "\"details\":{}}}");
        r.len = r.body ? strlen(r.body) : 0;
        r.ctype = "application/json";
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r.len, r.body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(r.body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", r.ctype);
    if (r.code == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (r.close)
        MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, r.code, resp);
    MHD_destroy_response(resp);
    devio_metrics_http(&s->metrics, r.route, r.code);
    return ret;
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
    free(q->body);
    free(q);
    *req_cls = NULL;
    atomic_fetch_sub(&s->active, 1);
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

static devio_status parse_listen(const char *listen, struct sockaddr_in *sa, devio_error *err)
{
    char host[64];
    const char *colon = strrchr(listen, ':');
    if (!colon || (size_t)(colon - listen) >= sizeof host)
        return devio_fail(err, DEVIO_E_INVALID, "--listen must be HOST:PORT, not '%s'", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return devio_fail(err, DEVIO_E_INVALID, "bad port in --listen '%s'", listen);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return devio_fail(err, DEVIO_E_INVALID, "--listen host must be an IPv4 address, not '%s'",
                          host);
    return DEVIO_OK;
}

devio_status devio_server_start(devio_server *s, const devio_server_config *cfg,
                                devio_error *err)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    pthread_rwlock_init(&s->dev_lock, NULL);
    devio_metrics_init(&s->metrics);
    devio_adapters_init(&s->adapters);
    struct sockaddr_in sa;
    devio_status st = parse_listen(cfg->listen, &sa, err);
    if (st == DEVIO_OK && strcmp(cfg->backend, "auto") && strcmp(cfg->backend, "ref"))
        st = devio_fail(err, DEVIO_E_UNSUPPORTED,
                        "backend '%s' is not available in this build (use ref or auto)",
                        cfg->backend);
    if (st == DEVIO_OK && strcmp(cfg->numerics, "strict"))
        st = devio_fail(err, DEVIO_E_UNSUPPORTED,
                        "numerics '%s' needs the CUDA backend; the reference is strict",
                        cfg->numerics);
    if (st == DEVIO_OK)
        st = read_token(s, err);
    if (st == DEVIO_OK)
        st = devio_model_load(cfg->model, &s->model, err);
    devio_store_options so = devio_store_options_default();
    so.retention = cfg->retention;
    if (st == DEVIO_OK)
        st = devio_store_open(cfg->db, &so, &s->store, err);
    if (st == DEVIO_OK) {
        devio_config dc = cfg->device;
        dc.epoch = devio_store_epoch(s->store);
        dc.first_ticket_id = devio_store_next_ticket_id(s->store);
        dc.use_worker_thread = true;
        dc.adapters_root = cfg->adapters;
        st = devio_open(s->model, &devio_ref_backend, &dc, &s->dev, err);
    }
    /* Before listening: the adapters recorded as loaded are loaded again, so
     * the first request sees the same table the last process had. */
    if (st == DEVIO_OK)
        st = devio_adapters_start(&s->adapters, s->store, s->dev, stderr, NULL, err);
    if (st == DEVIO_OK) {
        s->mhd = MHD_start_daemon(
            MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC |
                MHD_USE_ERROR_LOG,
            0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
            (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)cfg->connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
            (size_t)64 * 1024, MHD_OPTION_END);
        if (!s->mhd)
            st = devio_fail(err, DEVIO_E_IO, "cannot listen on %s", cfg->listen);
    }
    if (st != DEVIO_OK) {
        devio_server_stop(s);
        return st;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : ntohs(sa.sin_port);
    atomic_store(&s->ready, true);
    return DEVIO_OK;
}

/* Tickets launched and not yet awaited; 0 after teardown. */
static uint32_t tickets_in_flight(devio_server *s)
{
    pthread_rwlock_rdlock(&s->dev_lock);
    uint32_t n = s->dev ? devio_facts_get(s->dev).tickets_in_flight : 0;
    pthread_rwlock_unlock(&s->dev_lock);
    return n;
}

void devio_server_stop(devio_server *s)
{
    atomic_store(&s->ready, false);
    atomic_store(&s->draining, true);
    if (s->mhd) {
        MHD_socket fd = MHD_quiesce_daemon(s->mhd);
        if (fd != MHD_INVALID_SOCKET)
            close(fd);
        /* Drain for a bounded time: no new launches are taken, clients may
         * still await what they launched, and requests in progress finish. */
        for (uint32_t waited = 0; waited < s->cfg.drain_ms &&
                                  (tickets_in_flight(s) > 0 || atomic_load(&s->active) > 0);
             waited += 10)
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    }
    pthread_rwlock_wrlock(&s->dev_lock);
    uint32_t aborted = 0;
    if (s->dev)
        devio_teardown(s->dev, &aborted);
    s->dev = NULL;
    pthread_rwlock_unlock(&s->dev_lock);
    if (s->mhd)
        MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    if (s->store) {
        devio_error err = {0};
        devio_store_wait(s->store, devio_store_abort_in_flight(s->store, "server stopped"), &err);
        devio_store_close(s->store);
    }
    s->store = NULL;
    devio_model_free(s->model);
    s->model = NULL;
    free(s->token);
    s->token = NULL;
    devio_adapters_fini(&s->adapters);
    devio_metrics_fini(&s->metrics);
    pthread_rwlock_destroy(&s->dev_lock);
}
