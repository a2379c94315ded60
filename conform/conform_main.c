/* conform_main.c - devio-conform: replay a conformance script against a running devio-server.
 * Prints the lines devio-ref prints; a transport failure is reported on stderr, never as a result line. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform/script.h"
#include "common/cli.h"
#include "conform/http_target.h"

typedef struct flags {
    const char *server, *token, *expect;
    devio_http_options http;
    bool verbose;
} flags;

/* Seconds of a timeout: 1 s to a week. */
static bool parse_secs(const char *v, void *field)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (errno || *end || end == v || v[0] == '-' || n == 0 || n > 86400UL * 7)
        return false;
    *(uint32_t *)field = (uint32_t)n;
    return true;
}

#define F(f) offsetof(flags, f)
static const devio_opt opts[] = {
    {.flag = "server", .type = DEVIO_OPT_STR, .offset = F(server), .metavar = "URL",
     .help = "base URL of the server"},
    {.flag = "token", .type = DEVIO_OPT_STR, .offset = F(token), .metavar = "T",
     .help = "bearer token"},
    {.flag = "expect", .type = DEVIO_OPT_STR, .offset = F(expect), .metavar = "FILE",
     .help = "compare the lines with FILE; the first difference goes to stderr, exit 1"},
    {.flag = "timeout", .type = DEVIO_OPT_CUSTOM, .offset = F(http.request_timeout_s),
     .metavar = "S", .help = "longest wait for one request or one await, seconds [600]",
     .parse = parse_secs},
    {.flag = "connect-timeout", .type = DEVIO_OPT_CUSTOM, .offset = F(http.connect_timeout_s),
     .metavar = "S", .help = "longest wait for a connection, seconds [10]", .parse = parse_secs},
    {.flag = "verbose", .type = DEVIO_OPT_BOOL, .offset = F(verbose),
     .help = "print request and connection counts on stderr"},
};
#undef F

static const devio_cli cli = {
    .prog = "devio-conform",
    .usage = "usage: devio-conform --server URL [--token T] [--expect FILE] [--timeout S]\n"
             "                     [--connect-timeout S] [--verbose] SCRIPT.jsonl|-\n"
             "Replays a conformance script (JSON lines, docs/conformance.md) against a\n"
             "running devio-server over HTTP and prints one JSON result line per operation,\n"
             "the same lines devio-ref prints in process.",
    .epilog = "Every flag has an environment twin: --connect-timeout is DEVIO_CONNECT_TIMEOUT.\n"
              "Facts depend on everything the server did before: run each script on a\n"
              "freshly started server configured like the devio-ref it is compared with.\n"
              "Exit: 0 all lines printed (and equal to FILE), 1 a line differs from FILE,\n"
              "2 usage, script or connection error.",
    .opts = opts,
    .n_opts = sizeof opts / sizeof *opts,
    .env = true,
    .max_args = 1,
};

/* Where result lines go: stdout, and the comparison with --expect. */
typedef struct sink {
    const devio_http_target *target;
    FILE *expect;          /* NULL without --expect */
    char *line;            /* the line being assembled */
    size_t len, cap;
    unsigned n_lines;      /* lines passed on so far */
    unsigned diff_at;      /* first differing line, 0 while none */
    char *diff_want, *diff_got;
    bool oom;
} sink;

/* The next line of the expected file without its line ending; NULL at its end. */
static char *expect_next(sink *k)
{
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n = getline(&buf, &cap, k->expect);
    if (n < 0) {
        free(buf);
        return NULL;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    return buf;
}

static void sink_line(sink *k, const char *line)
{
    /* Once the target broke, the runner still prints lines for the failed
     * operations; they are not results and must not look like results. */
    if (devio_http_target_failure(k->target))
        return;
    fputs(line, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    k->n_lines++;
    if (!k->expect || k->diff_at)
        return;
    char *want = expect_next(k);
    if (want && strcmp(want, line) == 0) {
        free(want);
        return;
    }
    k->diff_at = k->n_lines;
    k->diff_want = want;
    k->diff_got = strdup(line);
}

static ssize_t sink_write(void *cls, const char *buf, size_t size)
{
    sink *k = cls;
    for (size_t i = 0; i < size; i++) {
        if (buf[i] == '\n') {
            if (k->line)
                k->line[k->len] = '\0';
            sink_line(k, k->line ? k->line : "");
            k->len = 0;
            continue;
        }
        if (k->len + 2 > k->cap) {
            size_t cap = k->cap ? k->cap * 2 : 4096;
            char *b = realloc(k->line, cap);
            if (!b) {
                k->oom = true;
                return -1;
            }
            k->line = b;
            k->cap = cap;
        }
        k->line[k->len++] = buf[i];
    }
    return (ssize_t)size;
}

int main(int argc, char **argv)
{
    flags f = {.http = devio_http_options_default()};
    const char *script = NULL;
    uint32_t n_args = 0;
    devio_cli_result cr = devio_cli_parse(&cli, &f, argc, argv, &script, &n_args, stdout, stderr);
    if (cr != DEVIO_CLI_OK)
        return cr == DEVIO_CLI_EXIT ? 0 : 2;
    if (!f.server || !script) {
        devio_cli_help(&cli, stderr);
        return 2;
    }
    devio_http_options opt = f.http;
    const char *server = f.server, *expect_path = f.expect;
    bool verbose = f.verbose;
    opt.server = server;
    opt.token = f.token;

    int rc = 2;
    FILE *in = strcmp(script, "-") == 0 ? stdin : fopen(script, "r");
    if (!in) {
        fprintf(stderr, "devio-conform: cannot open %s: %s\n", script, strerror(errno));
        return 2;
    }
    sink k = {0};
    if (expect_path) {
        k.expect = fopen(expect_path, "r");
        if (!k.expect) {
            fprintf(stderr, "devio-conform: cannot open %s: %s\n", expect_path, strerror(errno));
            goto out_in;
        }
    }
    devio_http_target *h = NULL;
    devio_error err = {0};
    if (devio_http_target_open(&opt, &h, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-conform: cannot use server %s: %s\n", server, err.message);
        goto out_expect;
    }
    k.target = h;
    FILE *out = fopencookie(&k, "w", (cookie_io_functions_t){.write = sink_write});
    if (!out) {
        fprintf(stderr, "devio-conform: out of memory\n");
        goto out_target;
    }
    /* Line buffering: each line reaches the sink while the target's state
     * still describes the operation that printed it. */
    setvbuf(out, NULL, _IOLBF, 0);
    devio_script_target t = {0};
    devio_http_target_fill(h, &t);
    char why[512];
    int run = devio_script_run(&t, in, out, why, sizeof why);
    fclose(out);
    const char *failure = devio_http_target_failure(h);
    if (k.oom) {
        fprintf(stderr, "devio-conform: out of memory printing results\n");
    } else if (failure) {
        fprintf(stderr, "devio-conform: %s\n", failure);
        fprintf(stderr, "devio-conform: stopped after %u result line(s); the rest of %s was "
                        "not run\n", k.n_lines, script);
    } else if (run != 0) {
        fprintf(stderr, "devio-conform: %s: %s\n", script, why);
    } else {
        rc = 0;
        if (k.expect && !k.diff_at) {
            char *extra = expect_next(&k);
            if (extra) {
                k.diff_at = k.n_lines + 1;
                k.diff_want = extra;
            }
        }
        if (k.diff_at) {
            fprintf(stderr,
                    "devio-conform: result line %u differs from %s\n"
                    "  expected: %s\n"
                    "  got:      %s\n",
                    k.diff_at, expect_path, k.diff_want ? k.diff_want : "(end of file)",
                    k.diff_got ? k.diff_got : "(end of output)");
            rc = 1;
        }
    }
    if (verbose) {
        uint64_t req = 0, conn = 0;
        devio_http_target_counts(h, &req, &conn);
        fprintf(stderr, "devio-conform: %llu request(s) over %llu connection(s)\n",
                (unsigned long long)req, (unsigned long long)conn);
    }
out_target:
    devio_http_target_free(h);
out_expect:
    if (k.expect)
        fclose(k.expect);
out_in:
    if (in != stdin)
        fclose(in);
    free(k.line);
    free(k.diff_want);
    free(k.diff_got);
    return rc;
}
