/* cli_test.c - the one option parser (common/cli.h): flags and their forms, DEVIO_* twins
 * and their order, groups at an offset, every refusal's message, --help and --version. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/cpus.h"
#include "common/version.h"
#include "device/devio.h"
#include "device/core/options.h"

typedef struct flags {
    const char *name;
    uint32_t n;
    uint64_t big;
    double ratio;
    bool on;
    int pick;
    int odd; /* CUSTOM: an odd number */
    devio_config dev;
} flags;

static bool parse_odd(const char *v, void *field)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x % 2 == 0)
        return false;
    *(int *)field = (int)x;
    return true;
}

static const char *const picks[] = {"red", "green", "blue", NULL};

#define F(f) offsetof(flags, f)
static const devio_opt opts[] = {
    {.flag = "name", .type = DEVIO_OPT_STR, .offset = F(name), .metavar = "S", .help = "a name"},
    {.flag = "n", .type = DEVIO_OPT_U32, .offset = F(n), .metavar = "N", .help = "a count [1]"},
    {.flag = "big", .type = DEVIO_OPT_U64, .offset = F(big), .metavar = "N", .help = "a big one",
     .no_env = true},
    {.flag = "ratio", .type = DEVIO_OPT_F64, .offset = F(ratio), .metavar = "X", .help = "a ratio"},
    {.flag = "on", .type = DEVIO_OPT_BOOL, .offset = F(on), .help = "a switch"},
    {.flag = "pick", .type = DEVIO_OPT_CHOICE, .offset = F(pick), .metavar = "COLOUR",
     .help = "a colour", .choices = picks},
    {.flag = "odd", .type = DEVIO_OPT_CUSTOM, .offset = F(odd), .metavar = "ODD",
     .help = "an odd number", .parse = parse_odd},
};
#undef F

static const devio_opt_group groups[] = {{devio_config_options, offsetof(flags, dev)}};

static const devio_cli cli = {
    .prog = "cli_test",
    .usage = "usage: cli_test [options] [ARG]",
    .epilog = "the end",
    .opts = opts,
    .n_opts = sizeof opts / sizeof *opts,
    .groups = groups,
    .n_groups = 1,
    .env = true,
    .max_args = 1,
};

/* One parse of the words in argv (argv[0] is the program), with stdout and
 * stderr captured into out/errs (each NUL-terminated). */
typedef struct run {
    flags f;
    devio_cli_result r;
    const char *args[1];
    uint32_t n_args;
    char out[4096], errs[512];
} run;

static run *parse(const char *const *words)
{
    static run R;
    memset(&R, 0, sizeof R);
    R.f.n = 1;
    R.f.dev = devio_config_default();
    char *argv[16];
    int argc = 0;
    for (; words[argc]; argc++)
        argv[argc] = (char *)words[argc];
    FILE *out = fmemopen(R.out, sizeof R.out - 1, "w");
    FILE *errf = fmemopen(R.errs, sizeof R.errs - 1, "w");
    assert_non_null(out);
    assert_non_null(errf);
    R.r = devio_cli_parse(&cli, &R.f, argc, argv, R.args, &R.n_args, out, errf);
    fclose(out);
    fclose(errf);
    return &R;
}

#define PARSE(...) parse((const char *const[]){"cli_test", __VA_ARGS__, NULL})

static void test_forms(void **state)
{
    (void)state;
    run *R = PARSE("--name", "x", "--n=7", "--big", "18446744073709551615", "--ratio=0.25",
                   "--on", "--pick", "blue", "--odd=3", "arg");
    assert_int_equal(R->r, DEVIO_CLI_OK);
    assert_string_equal(R->f.name, "x");
    assert_int_equal(R->f.n, 7);
    assert_true(R->f.big == UINT64_MAX);
    assert_true(R->f.ratio == 0.25);
    assert_true(R->f.on);
    assert_int_equal(R->f.pick, 2);
    assert_int_equal(R->f.odd, 3);
    assert_int_equal(R->n_args, 1);
    assert_string_equal(R->args[0], "arg");
    assert_string_equal(R->errs, "");

    R = PARSE("--on=false", "--n", "2", "--n", "4", "-");
    assert_int_equal(R->r, DEVIO_CLI_OK);
    assert_false(R->f.on);
    assert_int_equal(R->f.n, 4); /* later wins */
    assert_string_equal(R->args[0], "-");
    for (const char *const *v = (const char *const[]){"1", "yes", "true", NULL}; *v; v++) {
        char flag[32];
        snprintf(flag, sizeof flag, "--on=%s", *v);
        R = PARSE(flag);
        assert_true(R->f.on);
    }
}

static void test_group_at_offset(void **state)
{
    (void)state;
    run *R = PARSE("--max-depth", "5", "--kv-blocks=40", "--numerics", "fast", "--n", "9");
    assert_int_equal(R->r, DEVIO_CLI_OK);
    assert_int_equal(R->f.dev.max_depth, 5);
    assert_int_equal(R->f.dev.kv_blocks, 40);
    assert_int_equal(R->f.dev.numerics, DEVIO_NUMERICS_FAST);
    assert_int_equal(R->f.n, 9);
    /* Fields the flags do not name keep their defaults. */
    devio_config d = devio_config_default();
    assert_int_equal(R->f.dev.block_size, d.block_size);
    assert_int_equal(R->f.dev.max_rows, d.max_rows);
    assert_int_equal(R->f.dev.ssm_slots, 0); /* 0: the core derives them from memory */
    assert_int_equal(R->f.dev.ssm_snapshots, 0);

    /* The SSM pools of hybrid models, by flag and by twin. */
    setenv("DEVIO_SSM_SNAPSHOTS", "48", 1);
    R = PARSE("--ssm-slots", "12");
    unsetenv("DEVIO_SSM_SNAPSHOTS");
    assert_int_equal(R->r, DEVIO_CLI_OK);
    assert_int_equal(R->f.dev.ssm_slots, 12);
    assert_int_equal(R->f.dev.ssm_snapshots, 48);
    R = PARSE("--ssm-snapshots=0", "--ssm-slots", "x");
    assert_int_equal(R->r, DEVIO_CLI_ERROR);
    assert_string_equal(R->errs, "cli_test: --ssm-slots takes an unsigned integer, not 'x'\n");

    /* Every option in the shared table lands in its own field of devio_config. */
    for (const devio_opt *o = devio_config_options; o->flag; o++) {
        assert_true(o->offset < sizeof(devio_config));
        for (const devio_opt *p = o + 1; p->flag; p++) {
            assert_true(p->offset != o->offset);
            assert_string_not_equal(p->flag, o->flag);
        }
    }
}

static void test_env_twins(void **state)
{
    (void)state;
    setenv("DEVIO_N", "11", 1);
    setenv("DEVIO_MAX_SEQS", "12", 1);
    setenv("DEVIO_BIG", "13", 1); /* no_env: never read */
    setenv("DEVIO_RATIO", "", 1); /* empty counts as unset */
    run *R = PARSE("--max-seqs", "99");
    assert_int_equal(R->r, DEVIO_CLI_OK);
    assert_int_equal(R->f.n, 11);
    assert_int_equal(R->f.dev.max_seqs, 99); /* the flag wins over its twin */
    assert_true(R->f.big == 0);
    assert_true(R->f.ratio == 0);

    setenv("DEVIO_N", "eleven", 1);
    R = PARSE("--n", "3");
    assert_int_equal(R->r, DEVIO_CLI_ERROR);
    assert_string_equal(R->errs, "cli_test: DEVIO_N takes an unsigned integer, not 'eleven'\n");
    unsetenv("DEVIO_N");
    unsetenv("DEVIO_MAX_SEQS");
    unsetenv("DEVIO_BIG");
    unsetenv("DEVIO_RATIO");

    char buf[8];
    devio_cli_env_name("max-lora-rank", buf, sizeof buf);
    assert_string_equal(buf, "DEVIO_M"); /* truncated, still terminated */
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b, *says;
    } cases[] = {
        {"--n", "4294967296", "cli_test: --n takes an unsigned integer, not '4294967296'\n"},
        {"--n", "-1", "cli_test: --n takes an unsigned integer, not '-1'\n"},
        {"--n", "1x", "cli_test: --n takes an unsigned integer, not '1x'\n"},
        {"--ratio", "inf", "cli_test: --ratio takes a finite number, not 'inf'\n"},
        {"--on=maybe", NULL, "cli_test: --on takes true or false, not 'maybe'\n"},
        {"--pick", "pink", "cli_test: --pick takes one of its choices (see --help), not 'pink'\n"},
        {"--odd", "4", "cli_test: --odd takes ODD, not '4'\n"},
        {"--numerics", "exact", "cli_test: --numerics takes strict|fast, not 'exact'\n"},
        {"--name=", NULL, "cli_test: --name takes a non-empty value, not ''\n"},
        {"--nope", NULL, "cli_test: unknown flag '--nope' (see --help)\n"},
        {"-n", "3", "cli_test: unknown flag '-n' (see --help)\n"},
        {"a", "b", "cli_test: unexpected argument 'b' (see --help)\n"},
        {"--name", NULL, "cli_test: --name needs a value (see --help)\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run *R = cases[i].b ? PARSE(cases[i].a, cases[i].b) : PARSE(cases[i].a);
        assert_int_equal(R->r, DEVIO_CLI_ERROR);
        assert_string_equal(R->errs, cases[i].says);
        assert_string_equal(R->out, "");
    }
}

static void test_help_and_version(void **state)
{
    (void)state;
    run *R = PARSE("--n", "2", "--help", "--nope");
    assert_int_equal(R->r, DEVIO_CLI_EXIT);
    assert_non_null(strstr(R->out, "usage: cli_test [options] [ARG]\noptions:\n"));
    assert_non_null(strstr(R->out, "  --odd ODD                  an odd number\n"));
    assert_non_null(strstr(R->out, "  --on                       a switch\n"));
    assert_non_null(strstr(R->out, "  --ssm-slots N              SSM state slots (hybrid models), "
                                   "0 = derived from memory [0]\n"));
    assert_non_null(strstr(R->out, "  --ssm-snapshots N          SSM snapshots (hybrid models), "
                                   "0 = derived from memory [0]\n"));
    /* The group's options follow the cli's own, then --help, --version, the epilog. */
    const char *own = strstr(R->out, "--odd"), *grp = strstr(R->out, "--max-lora-rank N"),
               *help = strstr(R->out, "--help"), *end = strstr(R->out, "the end\n");
    assert_true(own && grp && help && end && own < grp && grp < help && help < end);
    assert_string_equal(R->errs, "");

    R = PARSE("-h");
    assert_int_equal(R->r, DEVIO_CLI_EXIT);
    R = PARSE("--version");
    assert_int_equal(R->r, DEVIO_CLI_EXIT);
    assert_string_equal(R->out, "cli_test " DEVIO_VERSION "\n");
}

/* --threads 0's CPU count: cgroup quota texts, v2 and v1, and the live process's count. */
static void test_cpu_quota(void **state)
{
    (void)state;
    assert_int_equal(devio_cpus_of_cpu_max("max 100000\n"), 0);
    assert_int_equal(devio_cpus_of_cpu_max("200000 100000\n"), 2);
    assert_int_equal(devio_cpus_of_cpu_max("150000 100000"), 2); /* 1.5 CPUs: 2 threads */
    assert_int_equal(devio_cpus_of_cpu_max("50000 100000"), 1);
    assert_int_equal(devio_cpus_of_cpu_max("x 100000"), 0);
    assert_int_equal(devio_cpus_of_cpu_max("100000"), 0);
    assert_int_equal(devio_cpus_of_cpu_max(""), 0);
    assert_int_equal(devio_cpus_of_cfs("-1\n", "100000\n"), 0);
    assert_int_equal(devio_cpus_of_cfs("400000\n", "100000\n"), 4);
    assert_int_equal(devio_cpus_of_cfs("400000", "0"), 0);
    assert_int_equal(devio_cpus_of_cfs("4x", "100000"), 0);
    uint32_t n = devio_usable_cpus();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(n >= 1 && (online <= 0 || n <= (uint32_t)online));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_group_at_offset),
        cmocka_unit_test(test_env_twins),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_help_and_version),
        cmocka_unit_test(test_cpu_quota),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
