/* http_target.c - the HTTP script target: operations to the routes of docs/http.md, answers back to the in-process target's shapes (inproc.c).
 * One curl handle, one keep-alive connection; it must never retry a request that changes state, nor guess a number. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <jansson.h>

#include "api/adapter_codec.h"
#include "api/codec.h"
#include "common/clock.h"
#include "conform/http_target.h"
#include "device/status.h"

#define URL_MAX 2048

struct devio_http_target {
    devio_http_options opt;
    char base[URL_MAX / 2]; /* server URL without a trailing '/' */
    char *auth_header;      /* "Authorization: Bearer ...", NULL without a token */
    CURL *curl;
    char curl_err[CURL_ERROR_SIZE];
    uint32_t vocab;
    /* The last answer: body bytes, HTTP status, content type. */
    char *buf;
    size_t len, cap;
    bool buf_oom;
    long code;
    char ctype[128];
    bool replayed;          /* the answer carried Idempotent-Replayed: read again from history */
    /* Sticky transport / protocol failure. */
    bool failed;
    char failure[512];
    uint64_t requests, connections;
};

devio_http_options devio_http_options_default(void)
{
    return (devio_http_options){.server = "http://127.0.0.1:8080",
                                .token = NULL,
                                .connect_timeout_s = 10,
                                .request_timeout_s = 600,
                                .await_slice_ms = 60000};
}

/* Mark the target broken: the run cannot go on, and no line may be printed for it. */
static devio_status broken(devio_http_target *h, devio_error *err, const char *fmt, ...)
    DEVIO_PRINTF(3, 4);
static devio_status broken(devio_http_target *h, devio_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->failure, sizeof h->failure, fmt, ap);
    va_end(ap);
    h->failed = true;
    return devio_fail(err, DEVIO_E_IO, "%s", h->failure);
}

/* One header line of the answer: notes Idempotent-Replayed. */
static size_t on_header(char *line, size_t size, size_t n, void *arg)
{
    devio_http_target *h = arg;
    static const char name[] = "idempotent-replayed:";
    size_t len = size * n;
    if (len >= sizeof name - 1 && strncasecmp(line, name, sizeof name - 1) == 0)
        h->replayed = true;
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *cls)
{
    devio_http_target *h = cls;
    size_t k = size * n;
    if (h->buf_oom)
        return 0;
    if (h->len + k + 1 > h->cap) {
        size_t cap = (h->len + k + 1) * 2;
        char *b = realloc(h->buf, cap);
        if (!b) {
            h->buf_oom = true;
            return 0; /* curl aborts the transfer with CURLE_WRITE_ERROR */
        }
        h->buf = b;
        h->cap = cap;
    }
    memcpy(h->buf + h->len, p, k);
    h->len += k;
    h->buf[h->len] = '\0';
    return k;
}

/* A request body: `n` bytes of `type` (NULL: none). */
typedef struct http_body {
    const char *type; /* "application/json", "application/octet-stream" */
    const void *data;
    size_t n;
} http_body;

/* One exchange. DEVIO_OK when an HTTP answer came back, whatever its status
 * (h->code, h->buf/len, h->ctype); otherwise the target is broken. */
static devio_status exchange_body(devio_http_target *h, const char *method, const char *path,
                                  const http_body *body, const char *accept, long timeout_ms,
                                  devio_error *err)
{
    char url[URL_MAX];
    struct curl_slist *hdrs = NULL, *tmp;
    devio_status s = DEVIO_OK;
    int n = snprintf(url, sizeof url, "%s%s", h->base, path);
    if (n < 0 || (size_t)n >= sizeof url)
        return broken(h, err, "URL too long: %s%s", h->base, path);
    char accept_h[96], ctype_h[96] = "Content-Type:";
    snprintf(accept_h, sizeof accept_h, "Accept: %s", accept);
    if (body->type)
        snprintf(ctype_h, sizeof ctype_h, "Content-Type: %s", body->type);
    /* "Expect:" and an empty Content-Type stop curl adding its own defaults. */
    const char *lines[] = {accept_h, ctype_h, "Expect:", h->auth_header};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        if (!lines[i])
            continue;
        tmp = curl_slist_append(hdrs, lines[i]);
        if (!tmp) {
            s = devio_fail(err, DEVIO_E_NOMEM, "out of memory building headers");
            goto out;
        }
        hdrs = tmp;
    }
    CURL *c = h->curl;
    /* reset keeps the live connection; every option is set again below. */
    curl_easy_reset(c);
    h->len = 0;
    h->buf_oom = false;
    h->curl_err[0] = '\0';
    h->code = 0;
    h->ctype[0] = '\0';
    h->replayed = false;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->curl_err);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "devio-conform");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)h->opt.connect_timeout_s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, h);
    if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        /* Never NULL: curl would read the body from its read callback (stdin) instead. */
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body->type && body->data ? body->data : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                         (curl_off_t)(body->type ? body->n : 0));
        if (strcmp(method, "POST") != 0)
            curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    }
    h->requests++;
    CURLcode rc = curl_easy_perform(c);
    long conns = 0;
    if (curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &conns) == CURLE_OK && conns > 0)
        h->connections += (uint64_t)conns;
    if (rc != CURLE_OK) {
        if (h->buf_oom)
            s = devio_fail(err, DEVIO_E_NOMEM, "out of memory reading the answer to %s %s",
                           method, path);
        else
            s = broken(h, err, "%s %s: %s", method, url,
                       h->curl_err[0] ? h->curl_err : curl_easy_strerror(rc));
        goto out;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &h->code);
    char *ct = NULL;
    if (curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct)
        snprintf(h->ctype, sizeof h->ctype, "%s", ct);
out:
    curl_slist_free_all(hdrs);
    return s;
}

/* One exchange with a JSON body (NULL: none), as exchange_body. */
static devio_status exchange(devio_http_target *h, const char *method, const char *path,
                             const json_t *body, const char *accept, long timeout_ms,
                             devio_error *err)
{
    http_body b = {0};
    char *text = NULL;
    if (body) {
        /* Full double precision: the server must decode the very numbers the script holds. */
        text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the request");
        b = (http_body){.type = "application/json", .data = text, .n = strlen(text)};
    }
    devio_status s = exchange_body(h, method, path, &b, accept, timeout_ms, err);
    free(text);
    return s;
}

/* Turn a non-2xx answer into the device status it names. Answers that are
 * not a devio error, and codes that mean the conversation itself failed
 * (no route, wrong token, a server going away), break the target instead:
 * printing them as results would blame the device for the transport. */
static devio_status answer_error(devio_http_target *h, const char *method, const char *path,
                                 devio_error *err)
{
    json_error_t je;
    json_t *j = h->len ? json_loadb(h->buf, h->len, 0, &je) : NULL;
    const json_t *e = json_object_get(j, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    devio_status s;
    if (!code) {
        s = broken(h, err, "%s %s answered HTTP %ld without a devio error body: %.200s", method,
                   path, h->code, h->len ? h->buf : "(empty)");
        goto out;
    }
    s = devio_status_parse(code);
    if (s == DEVIO_E_DEVICE && strcmp(code, devio_status_str(DEVIO_E_DEVICE)) != 0) {
        s = broken(h, err, "%s %s answered an error code this client does not know: '%s'",
                   method, path, code);
    } else if (s == DEVIO_E_UNAUTHORIZED) {
        s = broken(h, err, "the server refused the bearer token (HTTP %ld); pass --token or "
                           "set DEVIO_TOKEN", h->code);
    } else if (s == DEVIO_E_NOT_FOUND || s == DEVIO_E_METHOD) {
        s = broken(h, err, "%s %s: the server has no such route (%s: %s); is it a devio-server?",
                   method, path, code, msg ? msg : "");
    } else if (s == DEVIO_E_NOT_READY) {
        s = broken(h, err, "%s %s: the server is not serving (%s)", method, path,
                   msg ? msg : code);
    } else {
        devio_fail(err, s, "%s", msg ? msg : code);
        /* Keep the one detail pair, as the device reported it. */
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(e, "details"), k, v) {
            if (json_is_integer(v) && strlen(k) < sizeof err->detail_key) {
                snprintf(err->detail_key, sizeof err->detail_key, "%s", k);
                err->detail_val = json_integer_value(v);
                break;
            }
        }
    }
out:
    json_decref(j);
    return s;
}

static long timeout_of(const devio_http_target *h, long extra_ms)
{
    return (long)h->opt.request_timeout_s * 1000 + extra_ms;
}

/* A JSON exchange: on 2xx *result is the decoded answer (new reference). */
static devio_status request_json(devio_http_target *h, const char *method, const char *path,
                                 const json_t *body, long extra_ms, json_t **result,
                                 devio_error *err)
{
    *result = NULL;
    devio_status s = exchange(h, method, path, body, "application/json", timeout_of(h, extra_ms),
                              err);
    if (s != DEVIO_OK)
        return s;
    if (h->code < 200 || h->code > 299)
        return answer_error(h, method, path, err);
    json_error_t je;
    *result = json_loadb(h->buf ? h->buf : "", h->len, JSON_DECODE_ANY, &je);
    if (!*result)
        return broken(h, err, "%s %s answered HTTP %ld with a body that is not JSON: %s", method,
                      path, h->code, je.text);
    return DEVIO_OK;
}

/* An await's answer as the in-process device gives it: 202 pending is its
 * ticket_pending, an answer the server read again from its history its
 * ticket_consumed (the runner compares what the device did). */
static devio_status consumed_if_replayed(devio_http_target *h, uint64_t id, devio_status s,
                                         json_t **result, devio_error *err)
{
    /* 202 {"status":"pending"}: the in-process device's ticket_pending. */
    if (s == DEVIO_OK && h->code == 202) {
        json_decref(*result);
        *result = NULL;
        return devio_fail_at(err, DEVIO_E_TICKET_PENDING, "ticket", (int64_t)id,
                             "ticket %llu has not settled yet", (unsigned long long)id);
    }
    if (s != DEVIO_OK || !h->replayed)
        return s;
    json_decref(*result);
    *result = NULL;
    return devio_fail_at(err, DEVIO_E_TICKET_CONSUMED, "ticket", (int64_t)id,
                         "ticket %llu was already awaited (the server replayed its answer)",
                         (unsigned long long)id);
}

static devio_status op_await(devio_http_target *h, const json_t *body, json_t **result,
                             devio_error *err)
{
    uint64_t id;
    int64_t t;
    char path[128];
    /* The in-process decoder: a malformed body fails alike, without a request. */
    devio_status s = devio_json_await_decode(body, &id, &t, err);
    if (s != DEVIO_OK)
        return s;
    if (t >= 0) {
        snprintf(path, sizeof path, "/v1/tickets/%llu/await?timeout_ms=%lld",
                 (unsigned long long)id, (long long)t);
        /* The server caps one long poll at an hour; the transfer may take that long. */
        long wait_ms = t > 3600000 ? 3600000 : (long)t;
        return consumed_if_replayed(h, id, request_json(h, "POST", path, NULL, wait_ms, result,
                                                        err),
                                    result, err);
    }
    /* No timeout: wait, as in process, in bounded long polls. */
    snprintf(path, sizeof path, "/v1/tickets/%llu/await?timeout_ms=%u", (unsigned long long)id,
             h->opt.await_slice_ms);
    double deadline = devio_clock_s() + h->opt.request_timeout_s;
    for (;;) {
        s = consumed_if_replayed(
            h, id, request_json(h, "POST", path, NULL, (long)h->opt.await_slice_ms, result, err),
            result, err);
        if (s != DEVIO_E_TICKET_PENDING)
            return s;
        if (devio_clock_s() >= deadline) {
            fprintf(stderr,
                    "devio-conform: ticket %llu still pending after %u s; answering "
                    "ticket_pending\n",
                    (unsigned long long)id, h->opt.request_timeout_s);
            return s;
        }
    }
}

/* Adapter answers carry one record (with "evicted" after a load that
 * evicted) or a list of every recorded adapter. The runner prints the lora
 * result of the in-process path, whose list holds the loaded adapters only:
 * the same decoder and encoder make it here. Takes the reference to x. */
static devio_status adapter_result(devio_http_target *h, const char *path, json_t *x,
                                   json_t **result, devio_error *err)
{
    bool list = json_is_array(x);
    size_t n = list ? json_array_size(x) : 1, kept = 0;
    devio_adapter_record *recs = calloc(n + 1, sizeof *recs);
    devio_status s = recs ? DEVIO_OK : devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    for (size_t i = 0; s == DEVIO_OK && i < n; i++) {
        s = devio_json_adapter_record_decode(list ? json_array_get(x, i) : x, &recs[kept], err);
        if (s != DEVIO_OK)
            s = broken(h, err, "%s answered an adapter record that is not one: %s", path,
                       err ? err->message : "");
        else if (!list || recs[kept].state == DEVIO_ADAPTER_LOADED)
            kept++;
    }
    if (s == DEVIO_OK) {
        *result = devio_json_adapter_ack(recs, (uint32_t)kept,
                                         list ? NULL
                                              : json_string_value(json_object_get(x, "evicted")));
        if (!*result)
            s = devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the adapter result");
    }
    free(recs);
    json_decref(x);
    return s;
}

static devio_status op_lora(devio_http_target *h, const json_t *body, json_t **result,
                            devio_error *err)
{
    devio_adapter_cmd cmd;
    json_t *x = NULL, *put = NULL;
    char path[URL_MAX / 2];
    /* The shared decoder gives a malformed command the in-process answer;
     * the routes below could not even express most of them. */
    devio_status s = devio_json_adapter_cmd_decode(body, &cmd, err);
    if (s != DEVIO_OK)
        return s;
    if (cmd.kind == DEVIO_ADAPTER_CMD_LIST) {
        s = request_json(h, "GET", "/v1/adapters", NULL, 0, &x, err);
        return s == DEVIO_OK ? adapter_result(h, "GET /v1/adapters", x, result, err) : s;
    }
    if (!cmd.name[0])
        return devio_fail(err, DEVIO_E_INVALID, "adapter command needs a name");
    if (strchr(cmd.name, '/'))
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter name '%s' cannot be a URL path segment", cmd.name);
    char *esc = curl_easy_escape(h->curl, cmd.name, 0);
    if (!esc)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory escaping the adapter name");
    int n = snprintf(path, sizeof path, "/v1/adapters/%s", esc);
    curl_free(esc);
    if (n < 0 || (size_t)n >= sizeof path)
        return devio_fail(err, DEVIO_E_INVALID, "adapter name too long");
    if (cmd.kind == DEVIO_ADAPTER_CMD_LOAD) {
        put = json_pack("{s:s,s:b}", "path", cmd.path, "pin", cmd.pin);
        if (!put)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        s = request_json(h, "PUT", path, put, 0, &x, err);
        json_decref(put);
    } else if (cmd.kind == DEVIO_ADAPTER_CMD_PIN || cmd.kind == DEVIO_ADAPTER_CMD_UNPIN) {
        strncat(path, cmd.kind == DEVIO_ADAPTER_CMD_PIN ? "/pin" : "/unpin",
                sizeof path - strlen(path) - 1);
        s = request_json(h, "POST", path, NULL, 0, &x, err);
    } else {
        s = request_json(h, "DELETE", path, NULL, 0, &x, err);
    }
    return s == DEVIO_OK ? adapter_result(h, path, x, result, err) : s;
}

static devio_status http_call(void *ctx, const char *op, const json_t *body, json_t **result,
                              devio_error *err)
{
    devio_http_target *h = ctx;
    *result = NULL;
    if (h->failed)
        return devio_fail(err, DEVIO_E_IO, "%s", h->failure);
    if (strcmp(op, "create") == 0)
        return request_json(h, "POST", "/v1/sequences", NULL, 0, result, err);
    if (strcmp(op, "seq") == 0) {
        uint64_t id;
        char path[64];
        devio_status s = devio_json_id_decode(body, "seq", &id, err);
        if (s != DEVIO_OK)
            return s;
        snprintf(path, sizeof path, "/v1/sequences/%llu", (unsigned long long)id);
        return request_json(h, "GET", path, NULL, 0, result, err);
    }
    if (strcmp(op, "launch") == 0)
        return request_json(h, "POST", "/v1/launch", body, 0, result, err);
    if (strcmp(op, "step") == 0)
        return request_json(h, "POST", "/v1/step", body, 0, result, err);
    if (strcmp(op, "apply") == 0)
        return request_json(h, "POST", "/v1/effects", body, 0, result, err);
    if (strcmp(op, "facts") == 0)
        return request_json(h, "GET", "/v1/facts", NULL, 0, result, err);
    if (strcmp(op, "await") == 0)
        return op_await(h, body, result, err);
    if (strcmp(op, "lora") == 0)
        return op_lora(h, body, result, err);
    return devio_fail(err, DEVIO_E_INVALID, "unknown operation '%s'", op);
}

/* GET path asking for application/octet-stream: its bytes in h->buf, h->len. */
static devio_status get_octets(devio_http_target *h, const char *path, devio_error *err)
{
    devio_status s = exchange(h, "GET", path, NULL, "application/octet-stream",
                              timeout_of(h, 0), err);
    if (s != DEVIO_OK)
        return s;
    if (h->code < 200 || h->code > 299)
        return answer_error(h, "GET", path, err);
    if (strncmp(h->ctype, "application/octet-stream", 24) != 0)
        return broken(h, err, "GET %s answered '%s', not application/octet-stream", path,
                      h->ctype);
    return DEVIO_OK;
}

static devio_status http_logits(void *ctx, uint64_t id, float **data, uint32_t *n_rows,
                                uint32_t *vocab, devio_error *err)
{
    devio_http_target *h = ctx;
    char path[64];
    *data = NULL;
    if (h->failed)
        return devio_fail(err, DEVIO_E_IO, "%s", h->failure);
    /* Ids above INT64_MAX cannot be spelled in a route; no handle has one. */
    if (id > (uint64_t)INT64_MAX)
        return devio_fail(err, DEVIO_E_UNKNOWN_LOGITS, "no logits handle %llu",
                          (unsigned long long)id);
    snprintf(path, sizeof path, "/v1/logits/%llu", (unsigned long long)id);
    devio_status s = get_octets(h, path, err);
    if (s != DEVIO_OK)
        return s;
    size_t row_bytes = (size_t)h->vocab * 4;
    if (h->len % row_bytes != 0)
        return broken(h, err, "GET %s answered %zu bytes, not whole rows of %u floats", path,
                      h->len, h->vocab);
    size_t n = h->len / 4;
    float *v = malloc(n * sizeof *v + 1);
    if (!v)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading logits");
    const unsigned char *b = (const unsigned char *)h->buf;
    for (size_t i = 0; i < n; i++) {
        /* The wire is little-endian binary32 whatever this host is. */
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
        memcpy(&v[i], &u, 4);
    }
    *data = v;
    *n_rows = (uint32_t)(h->len / row_bytes);
    *vocab = h->vocab;
    return DEVIO_OK;
}

/* GET /v1/sequences/{id}/state: the state's bytes, taken from the answer's buffer. */
static devio_status http_state_export(void *ctx, uint64_t seq, bool snapshots, uint8_t **data,
                                      size_t *n, devio_error *err)
{
    devio_http_target *h = ctx;
    char path[96];
    *data = NULL;
    *n = 0;
    if (h->failed)
        return devio_fail(err, DEVIO_E_IO, "%s", h->failure);
    if (seq > (uint64_t)INT64_MAX)
        return devio_fail(err, DEVIO_E_UNKNOWN_SEQ, "no sequence %llu", (unsigned long long)seq);
    snprintf(path, sizeof path, "/v1/sequences/%llu/state?snapshots=%s",
             (unsigned long long)seq, snapshots ? "true" : "false");
    devio_status s = get_octets(h, path, err);
    if (s != DEVIO_OK)
        return s;
    if (!h->buf) {
        /* An empty answer (no state is): a buffer of its own all the same. */
        h->buf = malloc(1);
        if (!h->buf)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading a state");
    }
    /* The answer's buffer is the caller's now; the next exchange makes another. */
    *data = (uint8_t *)h->buf;
    *n = h->len;
    h->buf = NULL;
    h->len = h->cap = 0;
    return DEVIO_OK;
}

/* POST /v1/sequences with the state as an application/octet-stream body: the new sequence. */
static devio_status http_state_import(void *ctx, const uint8_t *data, size_t n, uint64_t *seq,
                                      devio_error *err)
{
    devio_http_target *h = ctx;
    const char *path = "/v1/sequences";
    if (h->failed)
        return devio_fail(err, DEVIO_E_IO, "%s", h->failure);
    http_body b = {.type = "application/octet-stream", .data = data, .n = n};
    devio_status s = exchange_body(h, "POST", path, &b, "application/json", timeout_of(h, 0),
                                   err);
    if (s != DEVIO_OK)
        return s;
    if (h->code < 200 || h->code > 299)
        return answer_error(h, "POST", path, err);
    json_error_t je;
    json_t *j = json_loadb(h->buf ? h->buf : "", h->len, 0, &je);
    if (!j)
        return broken(h, err, "POST %s answered HTTP %ld with a body that is not JSON: %s", path,
                      h->code, je.text);
    devio_error why = {0};
    s = devio_json_id_decode(j, "seq", seq, &why);
    json_decref(j);
    if (s != DEVIO_OK)
        return broken(h, err, "POST %s answered no sequence id: %s", path, why.message);
    return DEVIO_OK;
}

devio_status devio_http_target_open(const devio_http_options *opt, devio_http_target **out,
                                    devio_error *err)
{
    *out = NULL;
    if (!opt->server || !opt->server[0])
        return devio_fail(err, DEVIO_E_INVALID, "no server URL");
    size_t n = strlen(opt->server);
    while (n > 0 && opt->server[n - 1] == '/')
        n--;
    devio_http_target *h = calloc(1, sizeof *h);
    if (!h)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    devio_status s = DEVIO_OK;
    h->opt = *opt;
    if (n >= sizeof h->base) {
        s = devio_fail(err, DEVIO_E_INVALID, "server URL longer than %zu bytes",
                       sizeof h->base - 1);
        goto out_free;
    }
    memcpy(h->base, opt->server, n);
    h->base[n] = '\0';
    /* Both strings live on in base and auth_header; the caller's may go. */
    h->opt.server = h->base;
    h->opt.token = NULL;
    if (opt->token && opt->token[0]) {
        size_t k = strlen(opt->token) + 32;
        h->auth_header = malloc(k);
        if (!h->auth_header) {
            s = devio_fail(err, DEVIO_E_NOMEM, "out of memory");
            goto out_free;
        }
        snprintf(h->auth_header, k, "Authorization: Bearer %s", opt->token);
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        s = devio_fail(err, DEVIO_E_IO, "libcurl failed to initialise");
        goto out_free;
    }
    h->curl = curl_easy_init();
    if (!h->curl) {
        s = devio_fail(err, DEVIO_E_IO, "libcurl failed to make a handle");
        goto out_global;
    }
    json_t *dev = NULL;
    s = request_json(h, "GET", "/v1/device", NULL, 0, &dev, err);
    if (s == DEVIO_OK) {
        const json_t *vs = json_object_get(json_object_get(dev, "model"), "vocab_size");
        if (!json_is_integer(vs) || json_integer_value(vs) <= 0 ||
            json_integer_value(vs) > 0x3fffffff)
            s = broken(h, err, "GET /v1/device has no usable model.vocab_size");
        else
            h->vocab = (uint32_t)json_integer_value(vs);
    } else if (!h->failed && s != DEVIO_E_NOMEM) {
        /* A device answer at this point (torn_down) also stops the run. */
        s = broken(h, err, "GET /v1/device: %s: %s", devio_status_str(err->status),
                   err->message);
    }
    json_decref(dev);
    if (s != DEVIO_OK)
        goto out_curl;
    *out = h;
    return DEVIO_OK;
out_curl:
    curl_easy_cleanup(h->curl);
out_global:
    curl_global_cleanup();
out_free:
    free(h->auth_header);
    free(h->buf);
    free(h);
    return s;
}

void devio_http_target_free(devio_http_target *h)
{
    if (!h)
        return;
    curl_easy_cleanup(h->curl);
    curl_global_cleanup();
    free(h->auth_header);
    free(h->buf);
    free(h);
}

void devio_http_target_fill(devio_http_target *h, devio_script_target *t)
{
    t->ctx = h;
    t->call = http_call;
    t->logits = http_logits;
    t->state_export = http_state_export;
    t->state_import = http_state_import;
}

const char *devio_http_target_failure(const devio_http_target *h)
{
    return h->failed ? h->failure : NULL;
}

void devio_http_target_counts(const devio_http_target *h, uint64_t *requests,
                              uint64_t *connections)
{
    *requests = h->requests;
    *connections = h->connections;
}
