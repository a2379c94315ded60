/* cli.h - the one command-line parser of devio's binaries: a table of options
 * written into the caller's struct, DEVIO_* environment twins, --help, --version.
 * Parsing only: it never opens files, and strings it stores point into argv or environ. */
#ifndef DEVIO_CLI_H
#define DEVIO_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum devio_opt_type {
    DEVIO_OPT_STR = 0, /* const char *; an empty value is refused */
    DEVIO_OPT_U32,     /* uint32_t, decimal, no sign */
    DEVIO_OPT_U64,     /* uint64_t, decimal, no sign */
    DEVIO_OPT_F64,     /* double, finite */
    DEVIO_OPT_BOOL,    /* bool: "--x" alone is true; "--x=true|false|1|0|yes|no" */
    DEVIO_OPT_CHOICE,  /* int: the index of the value in `choices` */
    DEVIO_OPT_CUSTOM,  /* parse(value, field) stores it, false when it is not valid */
} devio_opt_type;

/* One option. Tables are static const data filled with designated initializers. */
typedef struct devio_opt {
    const char *flag;    /* without the leading "--", e.g. "max-depth" */
    devio_opt_type type;
    size_t offset;       /* offsetof the field in the caller's struct */
    const char *metavar; /* what --help shows after the flag, e.g. "N"; NULL for BOOL */
    const char *help;    /* one line; "[default]" at its end by convention */
    const char *const *choices;                    /* CHOICE: NULL-terminated */
    bool (*parse)(const char *value, void *field); /* CUSTOM */
    bool no_env;         /* no DEVIO_* twin even when the parser reads the environment */
} devio_opt;

/* A table of options shared by several binaries, e.g. the device's
 * (device/core/options.h): its offsets are from `base` in the caller's struct,
 * and the table ends at an entry whose flag is NULL. */
typedef struct devio_opt_group {
    const devio_opt *opts;
    size_t base;
} devio_opt_group;

typedef struct devio_cli {
    const char *prog;     /* "devio-server": first word of every message */
    const char *usage;    /* --help text before the option list */
    const char *epilog;   /* --help text after the option list, or NULL */
    const devio_opt *opts;
    size_t n_opts;
    const devio_opt_group *groups; /* after opts, in order; --help lists them the same way */
    size_t n_groups;
    bool env;             /* read the DEVIO_<FLAG> twin of every option before the flags */
    uint32_t max_args;    /* positional arguments accepted ("-" is one) */
} devio_cli;

typedef enum devio_cli_result {
    DEVIO_CLI_ERROR = -1, /* a message went to errf; exit with status 2 */
    DEVIO_CLI_OK = 0,     /* go on */
    DEVIO_CLI_EXIT = 1,   /* --help or --version was printed to out; exit with status 0 */
} devio_cli_result;

/* Apply the environment twins (when cli->env), then argv[1..argc) in order,
 * to the struct at dst: later values win, so flags override the environment.
 * "--flag value" and "--flag=value" are both accepted; "-h"/"--help" and
 * "--version" print and return DEVIO_CLI_EXIT. Positional arguments go to
 * args[0..*n_args) (args holds cli->max_args entries; may be NULL when
 * max_args is 0). On DEVIO_CLI_ERROR fields already set may have changed. */
devio_cli_result devio_cli_parse(const devio_cli *cli, void *dst, int argc, char **argv,
                                 const char **args, uint32_t *n_args, FILE *out, FILE *errf);

/* "max-depth" -> "DEVIO_MAX_DEPTH" into buf (truncated to n - 1 bytes). */
void devio_cli_env_name(const char *flag, char *buf, size_t n);

/* The --help text: usage, one line per option, --help and --version, epilog. */
void devio_cli_help(const devio_cli *cli, FILE *out);

/* "prog VERSION\n": what --version prints. */
void devio_cli_version(const devio_cli *cli, FILE *out);

#endif
