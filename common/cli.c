/* cli.c - devio_cli_parse: flags and DEVIO_* twins into a struct through an option table.
 * It must never accept a value the field cannot hold, and never swallow an argument it does not know. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "common/version.h"

void devio_cli_env_name(const char *flag, char *buf, size_t n)
{
    static const char prefix[] = "DEVIO_";
    size_t k = 0;
    for (const char *p = prefix; *p && k + 1 < n; p++)
        buf[k++] = *p;
    for (const char *p = flag; *p && k + 1 < n; p++)
        buf[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    if (n > 0)
        buf[k] = '\0';
}

void devio_cli_version(const devio_cli *cli, FILE *out)
{
    fprintf(out, "%s %s\n", cli->prog, DEVIO_VERSION);
}

/* The cli's options one after another: its own table, then each group's.
 * Returns the i-th (and the base its offset counts from), NULL past the last. */
static const devio_opt *opt_at(const devio_cli *cli, size_t i, size_t *base)
{
    *base = 0;
    if (i < cli->n_opts)
        return &cli->opts[i];
    i -= cli->n_opts;
    for (size_t g = 0; g < cli->n_groups; g++) {
        const devio_opt *o = cli->groups[g].opts;
        for (; o->flag; o++, i--)
            if (i == 0) {
                *base = cli->groups[g].base;
                return o;
            }
    }
    return NULL;
}

void devio_cli_help(const devio_cli *cli, FILE *out)
{
    if (cli->usage)
        fprintf(out, "%s\n", cli->usage);
    fprintf(out, "options:\n");
    size_t base;
    const devio_opt *o;
    for (size_t i = 0; (o = opt_at(cli, i, &base)) != NULL; i++) {
        char left[48];
        snprintf(left, sizeof left, "--%s%s%s", o->flag, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        fprintf(out, "  %-26s %s\n", left, o->help ? o->help : "");
    }
    fprintf(out, "  %-26s %s\n", "--help", "this text");
    fprintf(out, "  %-26s %s\n", "--version", "print the version and exit");
    if (cli->epilog)
        fprintf(out, "%s\n", cli->epilog);
}

static bool parse_unsigned(const char *v, uint64_t max, uint64_t *out)
{
    if (!v || !*v || *v < '0' || *v > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || *end || n > max)
        return false;
    *out = n;
    return true;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes"}, *const no[] = {"0", "false", "no"};
    for (size_t i = 0; i < 3; i++) {
        if (strcmp(v, yes[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcmp(v, no[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

/* What a value of option o must look like, for messages. */
static const char *wants(const devio_opt *o)
{
    switch (o->type) {
    case DEVIO_OPT_U32:
    case DEVIO_OPT_U64: return "an unsigned integer";
    case DEVIO_OPT_F64: return "a finite number";
    case DEVIO_OPT_BOOL: return "true or false";
    case DEVIO_OPT_CHOICE: return "one of its choices (see --help)";
    case DEVIO_OPT_STR: return "a non-empty value";
    case DEVIO_OPT_CUSTOM: break;
    }
    return o->metavar ? o->metavar : "a valid value";
}

/* Store value v (never NULL) of option o; `from` names it in messages. */
static bool set(const devio_cli *cli, const devio_opt *o, size_t base, void *dst,
                const char *v, const char *from, FILE *errf)
{
    void *field = (char *)dst + base + o->offset;
    bool ok = true;
    uint64_t u = 0;
    switch (o->type) {
    case DEVIO_OPT_STR:
        ok = *v != '\0';
        if (ok)
            *(const char **)field = v;
        break;
    case DEVIO_OPT_U32:
        ok = parse_unsigned(v, UINT32_MAX, &u);
        if (ok)
            *(uint32_t *)field = (uint32_t)u;
        break;
    case DEVIO_OPT_U64:
        ok = parse_unsigned(v, UINT64_MAX, &u);
        if (ok)
            *(uint64_t *)field = u;
        break;
    case DEVIO_OPT_F64: {
        char *end;
        double d = strtod(v, &end);
        ok = *v && !*end && isfinite(d);
        if (ok)
            *(double *)field = d;
        break;
    }
    case DEVIO_OPT_BOOL:
        ok = parse_bool(v, (bool *)field);
        break;
    case DEVIO_OPT_CHOICE:
        ok = false;
        for (int i = 0; o->choices && o->choices[i]; i++)
            if (strcmp(o->choices[i], v) == 0) {
                *(int *)field = i;
                ok = true;
            }
        break;
    case DEVIO_OPT_CUSTOM:
        ok = o->parse && o->parse(v, field);
        break;
    }
    if (!ok)
        fprintf(errf, "%s: %s takes %s, not '%s'\n", cli->prog, from, wants(o), v);
    return ok;
}

static const devio_opt *find(const devio_cli *cli, const char *name, size_t len, size_t *base)
{
    const devio_opt *o;
    for (size_t i = 0; (o = opt_at(cli, i, base)) != NULL; i++)
        if (strlen(o->flag) == len && strncmp(o->flag, name, len) == 0)
            return o;
    return NULL;
}

static devio_cli_result apply_env(const devio_cli *cli, void *dst, FILE *errf)
{
    size_t base;
    const devio_opt *o;
    for (size_t i = 0; cli->env && (o = opt_at(cli, i, &base)) != NULL; i++) {
        char name[64];
        if (o->no_env)
            continue;
        devio_cli_env_name(o->flag, name, sizeof name);
        const char *v = getenv(name);
        /* An empty twin counts as unset, as shells make them easily. */
        if (v && *v && !set(cli, o, base, dst, v, name, errf))
            return DEVIO_CLI_ERROR;
    }
    return DEVIO_CLI_OK;
}

devio_cli_result devio_cli_parse(const devio_cli *cli, void *dst, int argc, char **argv,
                                 const char **args, uint32_t *n_args, FILE *out, FILE *errf)
{
    uint32_t n = 0;
    if (n_args)
        *n_args = 0;
    if (apply_env(cli, dst, errf) != DEVIO_CLI_OK)
        return DEVIO_CLI_ERROR;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            devio_cli_help(cli, out);
            return DEVIO_CLI_EXIT;
        }
        if (strcmp(arg, "--version") == 0) {
            devio_cli_version(cli, out);
            return DEVIO_CLI_EXIT;
        }
        if (arg[0] != '-' || strcmp(arg, "-") == 0) {
            if (n >= cli->max_args) {
                fprintf(errf, "%s: unexpected argument '%s' (see --help)\n", cli->prog, arg);
                return DEVIO_CLI_ERROR;
            }
            args[n++] = arg;
            if (n_args)
                *n_args = n;
            continue;
        }
        const char *name = arg + (arg[1] == '-' ? 2 : 1), *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        size_t base = 0;
        const devio_opt *o = arg[1] == '-' ? find(cli, name, len, &base) : NULL;
        if (!o) {
            fprintf(errf, "%s: unknown flag '%s' (see --help)\n", cli->prog, arg);
            return DEVIO_CLI_ERROR;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v && o->type == DEVIO_OPT_BOOL)
            v = "true";
        if (!v) {
            if (a + 1 >= argc) {
                fprintf(errf, "%s: --%s needs a value (see --help)\n", cli->prog, o->flag);
                return DEVIO_CLI_ERROR;
            }
            v = argv[++a];
        }
        char from[72];
        snprintf(from, sizeof from, "--%s", o->flag);
        if (!set(cli, o, base, dst, v, from, errf))
            return DEVIO_CLI_ERROR;
    }
    return DEVIO_CLI_OK;
}
