/* config.c - devio-server's option table: flag, type, field, help (DEVIO_* twins by name).
 * It must never accept a value it cannot represent, and never read files. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "common/log.h"
#include "device/core/options.h"
#include "service/config.h"

#define S(f) offsetof(devio_server_config, f)

/* The default adapters root, told apart from a given one by its address. */
static const char default_adapters[] = "adapters";

static const devio_opt opts[] = {
    {.flag = "model", .type = DEVIO_OPT_STR, .offset = S(model), .metavar = "DIR",
     .help = "model directory (config.json + safetensors) or GGUF file"},
    {.flag = "listen", .type = DEVIO_OPT_STR, .offset = S(listen), .metavar = "ADDR",
     .help = "address to serve on: HOST:PORT, [IPV6]:PORT or unix:/PATH [127.0.0.1:8080]"},
    {.flag = "tls-cert", .type = DEVIO_OPT_STR, .offset = S(tls_cert), .metavar = "FILE",
     .help = "PEM certificate (chain) to serve HTTPS with; needs --tls-key"},
    {.flag = "tls-key", .type = DEVIO_OPT_STR, .offset = S(tls_key), .metavar = "FILE",
     .help = "PEM private key of --tls-cert"},
    {.flag = "db", .type = DEVIO_OPT_STR, .offset = S(db), .metavar = "FILE",
     .help = "SQLite file for ticket history and adapters [devio.db]"},
    {.flag = "adapters", .type = DEVIO_OPT_STR, .offset = S(adapters), .metavar = "DIR",
     .help = "root directory of PEFT adapters [adapters]"},
    {.flag = "backend", .type = DEVIO_OPT_STR, .offset = S(backend), .metavar = "NAME",
     .help = "auto|ref|cuda, or a backend plugin's name [auto]"},
    {.flag = "backend-path", .type = DEVIO_OPT_STR, .offset = S(backend_path), .metavar = "DIR",
     .help = "where backend plugins (libdevio-backend-NAME.so) are [next to this binary]"},
    {.flag = "token-file", .type = DEVIO_OPT_STR, .offset = S(token_file), .metavar = "FILE",
     .help = "file holding the bearer token (or DEVIO_TOKEN)"},
    {.flag = "max-body", .type = DEVIO_OPT_U32, .offset = S(max_body), .metavar = "N",
     .help = "largest request body in bytes [1048576]"},
    {.flag = "max-state-bytes", .type = DEVIO_OPT_U64, .offset = S(max_state_bytes),
     .metavar = "N",
     .help = "largest sequence state imported (POST /v1/sequences, application/octet-stream), "
             "bytes; --max-body does not bound it [4294967296]"},
    {.flag = "max-json-depth", .type = DEVIO_OPT_U32, .offset = S(max_json_depth), .metavar = "N",
     .help = "deepest JSON nesting accepted [32]"},
    {.flag = "max-connections", .type = DEVIO_OPT_U32, .offset = S(max_connections), .metavar = "N",
     .help = "connections open at once; more are answered 503 [1024]"},
    {.flag = "max-per-address", .type = DEVIO_OPT_U32, .offset = S(max_per_address), .metavar = "N",
     .help = "connections open at once from one client address, 0 = no limit [64]"},
    {.flag = "header-timeout-ms", .type = DEVIO_OPT_U32, .offset = S(header_timeout_ms), .metavar = "N",
     .help = "a request's headers must arrive within this of the connection's start or the last answer, ms [10000]"},
    {.flag = "connection-timeout", .type = DEVIO_OPT_U32, .offset = S(connection_timeout_s), .metavar = "N",
     .help = "a connection silent this long is closed, s [30]"},
    {.flag = "http-threads", .type = DEVIO_OPT_U32, .offset = S(http_threads), .metavar = "N",
     .help = "threads serving HTTP, each an epoll loop over its connections, 1..64 [2]"},
    {.flag = "retention", .type = DEVIO_OPT_U32, .offset = S(retention), .metavar = "N",
     .help = "ticket rows kept in history, 0 = all [100000]"},
    {.flag = "key-retention", .type = DEVIO_OPT_U32, .offset = S(key_retention), .metavar = "N",
     .help = "Idempotency-Key rows kept (each also at most a day), 0 = no count bound [1000000]"},
    {.flag = "drain-ms", .type = DEVIO_OPT_U32, .offset = S(drain_ms), .metavar = "N",
     .help = "how long SIGTERM waits for in-flight steps [10000]"},
    {.flag = "ticket-lease-ms", .type = DEVIO_OPT_U32, .offset = S(ticket_lease_ms), .metavar = "N",
     .help = "a settled ticket not awaited within this is reaped: its sequences and logits handles "
             "freed, its history row 'reaped'; 0 = never [30000]"},
    {.flag = "event-buffer", .type = DEVIO_OPT_U32, .offset = S(event_buffer), .metavar = "N",
     .help = "device events kept for GET /v1/events; a stream resumed further back is told "
             "how many it missed, 1.. [4096]"},
    {.flag = "event-subscribers", .type = DEVIO_OPT_U32, .offset = S(event_subscribers),
     .metavar = "N", .help = "GET /v1/events streams open at once; more are answered 503 [16]"},
    {.flag = "auth-health", .type = DEVIO_OPT_BOOL, .offset = S(auth_health),
     .help = "require the token on /healthz, /readyz, /metrics"},
    {.flag = "log-format", .type = DEVIO_OPT_CHOICE, .offset = S(log_format), .metavar = "F",
     .choices = devio_log_format_names,
     .help = "log lines on stderr: text or json (one object per line) [text]"},
    {.flag = "log-level", .type = DEVIO_OPT_CHOICE, .offset = S(log_level), .metavar = "L",
     .choices = devio_log_level_names,
     .help = "least level logged: debug, info (one access line per request), warn, error [info]"},
};
#undef S

static const devio_opt_group groups[] = {
    {devio_config_options, offsetof(devio_server_config, device)},
    {devio_model_options, offsetof(devio_server_config, load)},
};

static const devio_cli cli = {
    .prog = "devio-server",
    .usage = "usage: devio-server --model DIR [options]\n\n"
             "Serves one model on one device over HTTP (see GET /v1/openapi.yaml and docs/).\n"
             "Every option has an environment twin: --max-depth is DEVIO_MAX_DEPTH.\n"
             "The bearer token comes from DEVIO_TOKEN or --token-file.\n",
    .opts = opts,
    .n_opts = sizeof opts / sizeof *opts,
    .groups = groups,
    .n_groups = 2,
    .env = true,
};

void devio_server_config_default(devio_server_config *c)
{
    memset(c, 0, sizeof *c);
    c->listen = "127.0.0.1:8080";
    c->db = "devio.db";
    c->adapters = default_adapters;
    c->backend = "auto";
    c->max_body = 1u << 20;
    c->max_state_bytes = 4ull << 30;
    c->max_json_depth = 32;
    c->max_connections = 1024;
    c->max_per_address = 64;
    c->header_timeout_ms = 10000;
    c->connection_timeout_s = 30;
    c->http_threads = 2;
    c->retention = 100000;
    c->key_retention = 1000000;
    c->drain_ms = 10000;
    c->ticket_lease_ms = 30000;
    c->event_buffer = 4096;
    c->event_subscribers = 16;
    c->log_format = DEVIO_LOG_TEXT;
    c->log_level = DEVIO_LOG_INFO;
    c->device = devio_config_default();
    c->load = devio_model_params_default();
}

int devio_server_config_parse(devio_server_config *c, int argc, char **argv, FILE *out,
                              FILE *errf)
{
    devio_cli_result r = devio_cli_parse(&cli, c, argc, argv, NULL, NULL, out, errf);
    if (r != DEVIO_CLI_OK)
        return r == DEVIO_CLI_EXIT ? 1 : -1;
    c->adapters_given = c->adapters != default_adapters;
    const char *tok = getenv("DEVIO_TOKEN");
    if (tok && *tok)
        c->token = tok;
    if (c->http_threads < 1 || c->http_threads > 64) {
        fprintf(errf, "devio-server: --http-threads must be 1 to 64\n");
        return -1;
    }
    if (c->max_state_bytes < 1) {
        fprintf(errf, "devio-server: --max-state-bytes must be at least 1\n");
        return -1;
    }
    if (c->event_buffer < 1) {
        fprintf(errf, "devio-server: --event-buffer must be at least 1\n");
        return -1;
    }
    if (c->max_connections < 1) {
        fprintf(errf, "devio-server: --max-connections must be at least 1\n");
        return -1;
    }
    if (!c->model) {
        fprintf(errf, "devio-server: --model DIR is required (see --help)\n");
        return -1;
    }
    return 0;
}
