/* request_rules.c - the rules every request meets outside its handler (request_rules.h).
 * Each function is small and stands alone; none keeps state. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "device/status.h"
#include "service/http/request_rules.h"

devio_json_size devio_http_json_size(const char *p, size_t n)
{
    devio_json_size z = {.depth = 0, .values = n ? 1 : 0};
    unsigned depth = 0;
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
            if (++depth > z.depth)
                z.depth = depth;
        } else if (c == ']' || c == '}') {
            if (depth)
                depth--;
        } else if (c == ',' || c == ':') {
            z.values++;
        }
    }
    return z;
}

bool devio_http_bearer_ok(const char *header, const char *token, size_t token_len)
{
    static const char scheme[] = "Bearer";
    if (!header || !token || strncasecmp(header, scheme, sizeof scheme - 1) != 0 ||
        header[sizeof scheme - 1] != ' ')
        return false;
    const char *t = header + sizeof scheme - 1;
    while (*t == ' ')
        t++;
    size_t n = strlen(t);
    unsigned char diff = (unsigned char)(n != token_len);
    for (size_t i = 0; i < token_len; i++)
        diff |= (unsigned char)(token[i] ^ (i < n ? t[i] : 0));
    return diff == 0;
}

void devio_http_allowed_methods(const devio_route *table, size_t n, const char *path, char *buf,
                                size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (strcmp(table[i].path, path) != 0)
            continue;
        bool get = strcmp(table[i].method, "GET") == 0;
        int w = snprintf(buf + at, len - at, "%s%s%s", at ? ", " : "", table[i].method,
                         get ? ", HEAD" : "");
        if (w < 0 || (size_t)w >= len - at)
            break;
        at += (size_t)w;
    }
}

devio_status devio_http_json_media_type(const char *ctype, devio_error *err)
{
    if (!ctype)
        return DEVIO_OK;
    size_t n = strcspn(ctype, "; \t");
    static const char json[] = "application/json", app[] = "application/", plus[] = "+json";
    if ((n == sizeof json - 1 && strncasecmp(ctype, json, n) == 0) ||
        (n > sizeof app - 1 + sizeof plus - 1 && strncasecmp(ctype, app, sizeof app - 1) == 0 &&
         strncasecmp(ctype + n - (sizeof plus - 1), plus, sizeof plus - 1) == 0))
        return DEVIO_OK;
    return devio_fail(err, DEVIO_E_MEDIA_TYPE,
                      "request body must be JSON (Content-Type: application/json), not '%.*s'"
                      " (curl: use --json, or -H 'Content-Type: application/json')",
                      (int)(n > 80 ? 80 : n), ctype);
}

bool devio_http_octet_stream(const char *ctype)
{
    static const char octet[] = "application/octet-stream";
    size_t n = ctype ? strcspn(ctype, "; \t") : 0;
    return n == sizeof octet - 1 && strncasecmp(ctype, octet, n) == 0;
}

void devio_http_request_id(const char *given, uint64_t epoch, uint64_t seq, char *out, size_t n)
{
    size_t len = given ? strlen(given) : 0;
    bool ok = len > 0 && len <= DEVIO_REQUEST_ID_MAX && len < n;
    for (size_t i = 0; ok && i < len; i++)
        ok = given[i] > 0x20 && given[i] < 0x7f && given[i] != '"' && given[i] != '\\';
    if (ok)
        memcpy(out, given, len + 1);
    else
        snprintf(out, n, "%" PRIx64 "-%" PRIx64, epoch, seq);
}

/* The client's address as text: an IP address, or "local" for a unix socket. */
static void client_address(struct MHD_Connection *c, char *buf, size_t n)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    snprintf(buf, n, "local");
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)n);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)n);
}

void devio_http_log_access(struct MHD_Connection *c, const char *method, const char *url,
                           unsigned code, size_t bytes, double seconds, const char *request_id)
{
    if (!devio_log_enabled(DEVIO_LOG_INFO))
        return;
    char addr[INET6_ADDRSTRLEN + 1];
    client_address(c, addr, sizeof addr);
    devio_log_field f[] = {
        DEVIO_LF_S("method", method), DEVIO_LF_S("path", url),
        DEVIO_LF_U("status", code),   DEVIO_LF_F("duration_ms", seconds * 1e3),
        DEVIO_LF_U("bytes", bytes),   DEVIO_LF_S("request_id", request_id),
        DEVIO_LF_S("client", addr),
    };
    devio_logf(DEVIO_LOG_INFO, "access", f, sizeof f / sizeof *f, "%s %s %u",
               method ? method : "-", url ? url : "-", code);
}

/* The query's keys seen so far; a key seen again stops the walk. */
typedef struct query_keys {
    const char *seen[32];
    unsigned n;
    const char *twice;
} query_keys;

static enum MHD_Result note_key(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    query_keys *q = cls;
    (void)kind;
    (void)value;
    for (unsigned i = 0; i < q->n; i++)
        if (strcmp(q->seen[i], key) == 0) {
            q->twice = key;
            return MHD_NO;
        }
    if (q->n < sizeof q->seen / sizeof *q->seen)
        q->seen[q->n++] = key;
    return MHD_YES;
}

typedef struct header_count {
    const char *name;
    unsigned n;
} header_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    header_count *h = cls;
    (void)kind;
    (void)value;
    if (key && strcasecmp(key, h->name) == 0)
        h->n++;
    return MHD_YES;
}

devio_status devio_http_header_once(struct MHD_Connection *c, const char *name, const char **value,
                                    devio_error *err)
{
    header_count h = {.name = name};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &h);
    *value = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    if (h.n > 1)
        return devio_fail(err, DEVIO_E_INVALID, "%s is given %u times; send it once", name, h.n);
    return DEVIO_OK;
}

devio_status devio_http_query_once(struct MHD_Connection *c, devio_error *err)
{
    query_keys q = {.n = 0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, note_key, &q);
    if (q.twice)
        return devio_fail(err, DEVIO_E_INVALID, "query argument '%.64s' is given more than once",
                          q.twice);
    return DEVIO_OK;
}
