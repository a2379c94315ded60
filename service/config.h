/* config.h - devio-server's configuration: flags, each with a DEVIO_* environment twin.
 * Parsing only; it never opens files or sockets. */
#ifndef DEVIO_SERVER_CONFIG_H
#define DEVIO_SERVER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "device/devio.h"
#include "device/model/model.h"

typedef struct devio_server_config {
    const char *model;      /* --model DIR (required) */
    const char *listen;     /* --listen HOST:PORT | [IPV6]:PORT | unix:/PATH, default 127.0.0.1:8080 */
    const char *tls_cert;   /* --tls-cert FILE (PEM); HTTPS when given with tls_key */
    const char *tls_key;    /* --tls-key FILE (PEM) */
    const char *db;         /* --db FILE, default devio.db */
    const char *adapters;   /* --adapters DIR, default adapters (skipped with a warning
                               when that default does not exist) */
    const char *backend;    /* --backend auto|ref|cuda|NAME of a plugin */
    const char *backend_path; /* --backend-path DIR, where plugins are; NULL = next to the binary */
    const char *token;      /* DEVIO_TOKEN (environment only: flags show in ps) */
    const char *token_file; /* --token-file F */
    uint32_t max_body;      /* --max-body bytes, default 1 MiB */
    uint64_t max_state_bytes; /* --max-state-bytes: largest sequence state imported (its
                                 body streamed, never held; --max-body does not apply), 4 GiB */
    uint32_t max_json_depth;/* --max-json-depth, default 32 */
    uint32_t max_connections; /* --max-connections open at once, default 1024 */
    uint32_t max_per_address; /* --max-per-address: open at once from one address, default 64 */
    uint32_t header_timeout_ms; /* --header-timeout-ms for a request's headers, default 10000 */
    uint32_t connection_timeout_s; /* --connection-timeout seconds, default 30 */
    uint32_t http_threads;  /* --http-threads: libmicrohttpd's polling threads, default 2 */
    uint32_t retention;     /* --retention ticket rows kept, default 100000 */
    uint32_t key_retention; /* --key-retention Idempotency-Key rows kept, default 1000000 */
    uint32_t drain_ms;      /* --drain-ms on SIGTERM, default 10000 */
    uint32_t event_buffer;  /* --event-buffer: device events kept for GET /v1/events */
    uint32_t event_subscribers; /* --event-subscribers: GET /v1/events streams open at once */
    uint32_t ticket_lease_ms; /* --ticket-lease-ms: a settled ticket nobody awaits this long
                                 is reaped, 0 = never; default 30000 */
    bool auth_health;       /* --auth-health: token needed for /healthz /readyz /metrics too */
    int log_format;         /* --log-format: a devio_log_format (common/log.h), default text */
    int log_level;          /* --log-level: a devio_log_level, default info */
    bool adapters_given;    /* --adapters or DEVIO_ADAPTERS was set: a missing root is fatal */
    devio_config device;       /* the options of device/core/options.h */
    devio_model_params load;   /* devio_model_options, same header */
} devio_server_config;

void devio_server_config_default(devio_server_config *c);

/* Apply DEVIO_* environment variables, then flags (flags win). Returns 0 on
 * success, 1 when --help or --version was printed to `out`, -1 on a bad flag or value
 * (message written to `errf`). Strings point into argv/environ. */
int devio_server_config_parse(devio_server_config *c, int argc, char **argv, FILE *out,
                              FILE *errf);

#endif
