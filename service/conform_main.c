/* conform_main.c - devio-conform: replay a conformance script against a running devio-server.
 * Prints the lines devio-ref prints; a transport failure is reported on stderr, never as a result line. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/script.h"
#include "service/conform_http.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: devio-conform --server URL [--token T] [--expect FILE] [--timeout S]\n"
            "                     [--connect-timeout S] [--verbose] SCRIPT.jsonl|-\n"
            "Replays a conformance script (JSON lines, DESIGN §5) against a running\n"
            "devio-server over HTTP and prints one JSON result line per operation, the\n"
            "same lines devio-ref prints in process.\n"
            "  --server URL        base URL of the server (or DEVIO_SERVER)\n"
            "  --token T           bearer token (or DEVIO_TOKEN)\n"
            "  --expect FILE       compare the lines with FILE; the first difference is\n"
            "                      reported on stderr with both lines, and the exit is 1\n"
            "  --timeout S         longest wait for one request or one await [600]\n"
            "  --connect-timeout S longest wait for a connection [10]\n"
            "  --verbose           print request and connection counts on stderr\n"
            "Each flag has an environment twin: DEVIO_SERVER, DEVIO_TOKEN, DEVIO_EXPECT,\n"
            "DEVIO_TIMEOUT, DEVIO_CONNECT_TIMEOUT, DEVIO_VERBOSE=1.\n"
            "Facts depend on everything the server did before: run each script on a\n"
            "freshly started server configured like the devio-ref it is compared with.\n"
            "Exit: 0 all lines printed (and equal to FILE), 1 a line differs from FILE,\n"
            "2 usage, script or connection error.\n");
}

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

static int parse_secs(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || end == s || v == 0 || v > 86400UL * 7)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* An environment twin's value, NULL when unset or empty. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

int main(int argc, char **argv)
{
    devio_http_options opt = devio_http_options_default();
    /* Flags override their DEVIO_* twins. */
    const char *server = env("DEVIO_SERVER");
    const char *token = env("DEVIO_TOKEN");
    const char *expect_path = env("DEVIO_EXPECT"), *script = NULL;
    bool verbose = env("DEVIO_VERBOSE") && strcmp(env("DEVIO_VERBOSE"), "0") != 0;
    const struct { const char *name; uint32_t *dst; } secs[] = {
        {"DEVIO_TIMEOUT", &opt.request_timeout_s},
        {"DEVIO_CONNECT_TIMEOUT", &opt.connect_timeout_s},
    };
    for (size_t i = 0; i < sizeof secs / sizeof *secs; i++)
        if (env(secs[i].name) && parse_secs(env(secs[i].name), secs[i].dst) < 0) {
            fprintf(stderr, "devio-conform: %s needs a positive number of seconds\n",
                    secs[i].name);
            return 2;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--verbose") == 0) {
            verbose = true;
        } else if (strcmp(a, "--server") == 0 && v) {
            server = v;
            i++;
        } else if (strcmp(a, "--token") == 0 && v) {
            token = v;
            i++;
        } else if (strcmp(a, "--expect") == 0 && v) {
            expect_path = v;
            i++;
        } else if ((strcmp(a, "--timeout") == 0 || strcmp(a, "--connect-timeout") == 0) && v) {
            uint32_t *dst = a[2] == 't' ? &opt.request_timeout_s : &opt.connect_timeout_s;
            if (parse_secs(v, dst) < 0) {
                fprintf(stderr, "devio-conform: %s needs a positive number of seconds\n", a);
                return 2;
            }
            i++;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "devio-conform: unknown flag or missing value: %s\n", a);
            usage(stderr);
            return 2;
        } else if (script) {
            fprintf(stderr, "devio-conform: one script at a time (%s, %s)\n", script, a);
            return 2;
        } else {
            script = a;
        }
    }
    if (!server || !script) {
        usage(stderr);
        return 2;
    }
    opt.server = server;
    opt.token = token;

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
    devio_script_target t;
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
