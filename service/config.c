/* config.c - one table of options: flag, environment name, type, help.
 * It must never accept a value it cannot represent, and never read files. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "service/config.h"

typedef enum { OPT_STR, OPT_U32, OPT_BOOL } opt_type;

typedef struct opt {
    const char *flag; /* without the leading "--" */
    opt_type type;
    size_t offset;    /* in devio_server_config */
    const char *help;
} opt;

#define S(f) offsetof(devio_server_config, f)
#define D(f) (offsetof(devio_server_config, device) + offsetof(devio_config, f))

static const opt opts[] = {
    {"model", OPT_STR, S(model), "model directory (config.json + safetensors)"},
    {"listen", OPT_STR, S(listen), "address to serve on, HOST:PORT [127.0.0.1:8080]"},
    {"db", OPT_STR, S(db), "SQLite file for ticket history and adapters [devio.db]"},
    {"adapters", OPT_STR, S(adapters), "root directory of PEFT adapters [adapters]"},
    {"backend", OPT_STR, S(backend), "auto|ref|cuda [auto]"},
    {"numerics", OPT_STR, S(numerics), "strict|fast [strict]"},
    {"token-file", OPT_STR, S(token_file), "file holding the bearer token (or DEVIO_TOKEN)"},
    {"threads", OPT_U32, D(threads), "compute threads, 0 = all cores [0]"},
    {"kv-blocks", OPT_U32, D(kv_blocks), "KV cache blocks, 0 = derived [0]"},
    {"block-size", OPT_U32, D(block_size), "tokens per KV block [16]"},
    {"max-depth", OPT_U32, D(max_depth), "tickets in flight [2]"},
    {"max-seqs", OPT_U32, D(max_seqs), "live sequences [256]"},
    {"max-seq-len", OPT_U32, D(max_seq_len), "positions per sequence, 0 = model's [0]"},
    {"max-rows", OPT_U32, D(max_rows), "rows per plan [64]"},
    {"max-batch-tokens", OPT_U32, D(max_batch_tokens), "tokens per plan [2048]"},
    {"logits-handles", OPT_U32, D(logits_handles), "live logits handles [64]"},
    {"logits-rows", OPT_U32, D(logits_rows), "live logits positions over all handles [256]"},
    {"max-loras", OPT_U32, D(max_loras), "adapters loaded at once [4]"},
    {"max-lora-rank", OPT_U32, D(max_lora_rank), "largest adapter rank [64]"},
    {"max-body", OPT_U32, S(max_body), "largest request body in bytes [1048576]"},
    {"max-json-depth", OPT_U32, S(max_json_depth), "deepest JSON nesting accepted [32]"},
    {"max-connections", OPT_U32, S(max_connections), "concurrent connections [256]"},
    {"connection-timeout", OPT_U32, S(connection_timeout_s), "idle connection timeout, s [30]"},
    {"retention", OPT_U32, S(retention), "ticket rows kept in history, 0 = all [100000]"},
    {"drain-ms", OPT_U32, S(drain_ms), "how long SIGTERM waits for in-flight steps [10000]"},
    {"auth-health", OPT_BOOL, S(auth_health), "require the token on /healthz, /readyz, /metrics"},
};

void devio_server_config_default(devio_server_config *c)
{
    memset(c, 0, sizeof *c);
    c->listen = "127.0.0.1:8080";
    c->db = "devio.db";
    c->adapters = "adapters";
    c->backend = "auto";
    c->numerics = "strict";
    c->max_body = 1u << 20;
    c->max_json_depth = 32;
    c->max_connections = 256;
    c->connection_timeout_s = 30;
    c->retention = 100000;
    c->drain_ms = 10000;
    c->device = devio_config_default();
}

static void help(FILE *out)
{
    fprintf(out, "usage: devio-server --model DIR [options]\n\n"
                 "Serves one model on one device over HTTP (see GET /v1/openapi.yaml).\n"
                 "Every option has an environment twin: --max-depth is DEVIO_MAX_DEPTH.\n"
                 "The bearer token comes from DEVIO_TOKEN or --token-file.\n\n");
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        fprintf(out, "  --%-20s %s\n", opts[i].flag, opts[i].help);
    fprintf(out, "  --%-20s %s\n", "help", "this text");
}

static int set(devio_server_config *c, const opt *o, const char *v, const char *from, FILE *errf)
{
    char *base = (char *)c;
    if (o->type == OPT_STR) {
        if (!v || !*v) {
            fprintf(errf, "devio-server: %s needs a value\n", from);
            return -1;
        }
        *(const char **)(base + o->offset) = v;
        return 0;
    }
    if (o->type == OPT_BOOL) {
        bool b = !v || strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "yes") == 0;
        if (v && !b && strcmp(v, "0") != 0 && strcmp(v, "false") != 0 && strcmp(v, "no") != 0) {
            fprintf(errf, "devio-server: %s takes true or false, not '%s'\n", from, v);
            return -1;
        }
        *(bool *)(base + o->offset) = b;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long n = v ? strtoul(v, &end, 10) : 0;
    if (!v || errno || *end || end == v || n > 0xffffffffUL || v[0] == '-') {
        fprintf(errf, "devio-server: %s needs an unsigned integer, not '%s'\n", from,
                v ? v : "");
        return -1;
    }
    *(uint32_t *)(base + o->offset) = (uint32_t)n;
    return 0;
}

int devio_server_config_parse(devio_server_config *c, int argc, char **argv, FILE *out,
                              FILE *errf)
{
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        char env[64] = "DEVIO_";
        size_t k = 6;
        for (const char *p = opts[i].flag; *p && k + 1 < sizeof env; p++)
            env[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        env[k] = '\0';
        const char *v = getenv(env);
        if (v && set(c, &opts[i], v, env, errf) < 0)
            return -1;
    }
    const char *tok = getenv("DEVIO_TOKEN");
    if (tok && *tok)
        c->token = tok;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            help(out);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(errf, "devio-server: unexpected argument '%s' (see --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const opt *o = NULL;
        for (size_t i = 0; i < sizeof opts / sizeof *opts && !o; i++)
            if (strlen(opts[i].flag) == len && strncmp(opts[i].flag, name, len) == 0)
                o = &opts[i];
        if (!o) {
            fprintf(errf, "devio-server: unknown flag '%s' (see --help)\n", arg);
            return -1;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v && o->type != OPT_BOOL) {
            if (a + 1 >= argc) {
                fprintf(errf, "devio-server: %s needs a value\n", arg);
                return -1;
            }
            v = argv[++a];
        }
        if (set(c, o, v, arg, errf) < 0)
            return -1;
    }
    if (!c->model) {
        fprintf(errf, "devio-server: --model DIR is required (see --help)\n");
        return -1;
    }
    return 0;
}
