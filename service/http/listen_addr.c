/* listen_addr.c - parses --listen into a socket address (IPv4, bracketed IPv6, unix:PATH) and formats one for messages.
 * Pure string work: no socket is opened and no file looked at here. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/status.h"
#include "service/http/listen_addr.h"

#define UNIX_PREFIX "unix:"

static devio_status parse_port(const char *text, const char *p, uint16_t *port, devio_error *err)
{
    if (*p < '0' || *p > '9' || strlen(p) > 5)
        return devio_fail(err, DEVIO_E_INVALID, "bad port in --listen '%s': 0 to 65535", text);
    char *end;
    long v = strtol(p, &end, 10);
    if (*end || v < 0 || v > 65535)
        return devio_fail(err, DEVIO_E_INVALID, "bad port in --listen '%s': 0 to 65535", text);
    *port = (uint16_t)v;
    return DEVIO_OK;
}

static devio_status parse_unix(const char *text, devio_listen_addr *out, devio_error *err)
{
    const char *path = text + strlen(UNIX_PREFIX);
    struct sockaddr_un *un = (struct sockaddr_un *)&out->sa;
    size_t n = strlen(path);
    if (n == 0 || path[0] != '/')
        return devio_fail(err, DEVIO_E_INVALID,
                          "--listen unix: needs an absolute path (unix:/run/devio.sock), not '%s'",
                          text);
    if (n >= sizeof un->sun_path)
        return devio_fail_at(err, DEVIO_E_INVALID, "max_path_bytes", sizeof un->sun_path - 1,
                             "--listen unix socket path is %zu bytes; at most %zu fit", n,
                             sizeof un->sun_path - 1);
    un->sun_family = AF_UNIX;
    memcpy(un->sun_path, path, n + 1);
    out->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return DEVIO_OK;
}

devio_status devio_listen_addr_parse(const char *text, devio_listen_addr *out, devio_error *err)
{
    memset(out, 0, sizeof *out);
    if (strncmp(text, UNIX_PREFIX, strlen(UNIX_PREFIX)) == 0)
        return parse_unix(text, out, err);
    char host[INET6_ADDRSTRLEN];
    const char *port_at;
    bool v6 = text[0] == '[';
    if (v6) {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':')
            return devio_fail(err, DEVIO_E_INVALID,
                              "--listen must be HOST:PORT, [IPV6]:PORT or unix:PATH, not '%s'",
                              text);
        size_t n = (size_t)(close - text - 1);
        if (n >= sizeof host)
            return devio_fail(err, DEVIO_E_INVALID, "--listen host is not an IPv6 address in '%s'",
                              text);
        memcpy(host, text + 1, n);
        host[n] = '\0';
        port_at = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof host || memchr(text, ':', (size_t)(colon - text)))
            return devio_fail(err, DEVIO_E_INVALID,
                              "--listen must be HOST:PORT, [IPV6]:PORT or unix:PATH, not '%s'",
                              text);
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port_at = colon + 1;
    }
    uint16_t port;
    devio_status st = parse_port(text, port_at, &port, err);
    if (st != DEVIO_OK)
        return st;
    if (v6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&out->sa;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
        if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
            return devio_fail(err, DEVIO_E_INVALID,
                              "--listen host must be an IPv6 address in brackets, not '[%s]'",
                              host);
        out->len = sizeof *in6;
        return DEVIO_OK;
    }
    struct sockaddr_in *in = (struct sockaddr_in *)&out->sa;
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &in->sin_addr) != 1)
        return devio_fail(err, DEVIO_E_INVALID,
                          "--listen host must be an IPv4 address, localhost or [IPV6], not '%s'",
                          host);
    out->len = sizeof *in;
    return DEVIO_OK;
}

const char *devio_listen_addr_path(const devio_listen_addr *a)
{
    return a->sa.ss_family == AF_UNIX ? ((const struct sockaddr_un *)&a->sa)->sun_path : NULL;
}

void devio_listen_addr_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (cap == 0)
        return;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        snprintf(buf, cap, "%s:%u", host, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        snprintf(buf, cap, "[%s]:%u", host, ntohs(in6->sin6_port));
    } else if (sa->sa_family == AF_UNIX) {
        const struct sockaddr_un *un = (const struct sockaddr_un *)sa;
        size_t off = offsetof(struct sockaddr_un, sun_path);
        size_t n = len > (socklen_t)off ? strnlen(un->sun_path, (size_t)len - off) : 0;
        snprintf(buf, cap, "unix:%.*s", (int)n, un->sun_path);
    } else {
        snprintf(buf, cap, "(address family %d)", (int)sa->sa_family);
    }
}
