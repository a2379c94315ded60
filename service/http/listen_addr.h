/* listen_addr.h - devio-server's --listen value: HOST:PORT (IPv4), [IPV6]:PORT, or unix:PATH, parsed into a socket address and written back for messages.
 * It only parses and formats: it never opens a socket or touches the file system. */
#ifndef DEVIO_LISTEN_ADDR_H
#define DEVIO_LISTEN_ADDR_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "device/devio.h"

/* The mode a unix-domain socket file is given: its owner and group may connect. */
#define DEVIO_LISTEN_UNIX_MODE 0660

typedef struct devio_listen_addr {
    struct sockaddr_storage sa; /* AF_INET, AF_INET6 or AF_UNIX */
    socklen_t len;              /* the used part of sa */
} devio_listen_addr;

/* Parse `text`: "HOST:PORT" with HOST an IPv4 address or "localhost",
 * "[IPV6]:PORT" (e.g. "[::1]:8080", "[::]:0"), or "unix:/path" (a path that
 * fits sun_path, NUL excluded). PORT is 0..65535, 0 = any free one.
 * On failure `out` is unspecified and err says what is wrong with `text`. */
devio_status devio_listen_addr_parse(const char *text, devio_listen_addr *out, devio_error *err);

/* The unix socket's path, or NULL for an IP address. Borrowed from `a`. */
const char *devio_listen_addr_path(const devio_listen_addr *a);

/* Write the address sa (len bytes) as --listen would take it ("127.0.0.1:8080", "[::1]:0",
 * "unix:/run/devio.sock") into buf, always NUL-terminated. */
void devio_listen_addr_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap);

#endif
