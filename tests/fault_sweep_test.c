/* fault_sweep_test.c - SQLite-style sweeps: the N-th allocation, then the N-th file call, of each site fails, for every N.
 * Sites: model and adapter load, device open, launch, await, every effect, the store; each failure is clean, changes and leaks nothing.
 * Long because every site has its own fixture and its own checks of "nothing changed", and they share one counting harness; splitting would copy the harness. */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>
#include <sqlite3.h>

#include "device/devio.h"
#include "device/model/model.h"
#include "ref/ref_backend.h"
#include "service/adapters.h"
#include "service/store/store.h"
#include "tests/fault/fault.h"
#include "tests/testutil.h"

/* Sweeps are bounded by count and time: past SAMPLE_FROM calls only every
 * SAMPLE_STEP-th N is tried, and a site stops at its time budget
 * (DEVIO_FAULT_SITE_S seconds, default 60), saying how far it got. */
#define SAMPLE_FROM 1000u
#define SAMPLE_STEP 3u

typedef struct sweep_ctx {
    devio_fixture llama, bamba;
    char root[512];    /* adapters root under llama's dir */
    char db_seed[512]; /* a store with one launched and one settled row */
    char db_restore[512]; /* the seed with adapter "a" recorded as loaded */
    char work[512];    /* per-run scratch directory */
    double site_s;
} sweep_ctx;

/* One site's tally, printed at the end of the run. */
typedef struct site_tally {
    const char *name;
    const char *kind;
    bool persist;
    uint32_t codes[64]; /* failures by status */
    uint64_t total, reached, tried, failed_clean, ok_verified, not_fired;
    double secs;
} site_tally;

static site_tally tallies[128];

/* Where a site's failures have one right code: an allocation that failed is
 * out_of_memory, a file call that failed is io_error, never a code that
 * blames the input. */
static void assert_code_names_fault(devio_status s, fault_kind k)
{
    if (s != DEVIO_OK && s != (k == FAULT_ALLOC ? DEVIO_E_NOMEM : DEVIO_E_IO)) {
        print_error("a failed %s call answered %s\n", k == FAULT_ALLOC ? "allocation" : "file",
                    devio_status_str(s));
        fail();
    }
}

/* The last failure's message, printed per N with DEVIO_FAULT_VERBOSE=1. */
static char last_message[sizeof ((devio_error *)0)->message];

/* The mode of the sweep running now: one failing call, or every call from the N-th on. */
static bool sweep_persist;

static void arm(fault_kind k, uint64_t n)
{
    fault_arm(k, n, sweep_persist);
}
static int n_tallies;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- leak counters besides ASan's: descriptors and mappings --------------
 * (Heap bytes are ASan's to count: glibc's own figures count its per-thread
 * caches as in use, so they drift without a leak. Mappings are counted
 * without ASan only, which maps its own memory as it goes.) */

typedef struct resources {
    int fds, maps;
} resources;

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n++;
    closedir(d);
    return n;
}

#ifndef __SANITIZE_ADDRESS__
static int count_maps(void)
{
    FILE *fp = fopen("/proc/self/maps", "r");
    assert_non_null(fp);
    int n = 0;
    for (int ch; (ch = fgetc(fp)) != EOF;)
        n += ch == '\n';
    fclose(fp);
    return n;
}
#endif

static resources resources_now(void)
{
#ifdef __SANITIZE_ADDRESS__
    /* ASan maps its own memory as it goes: only descriptors are counted. */
    return (resources){.fds = count_fds()};
#else
    return (resources){.fds = count_fds(), .maps = count_maps()};
#endif
}

/* False during a site's first, warming run: what is made once per process
 * (stdio buffers, tables built on first use) is not a leak. */
static bool resources_checked;

static void assert_same_resources(const resources *a, const resources *b, const char *site,
                                  uint64_t n)
{
    if (resources_checked && (a->fds != b->fds || a->maps != b->maps)) {
        print_error("%s N=%" PRIu64 ": fds %d -> %d, mappings %d -> %d\n", site, n, a->fds,
                    b->fds, a->maps, b->maps);
        fail();
    }
}

/* ---- the sweep driver ----------------------------------------------------- */

/* Runs the operation once with the fault armed at n (0: count only) and
 * checks its outcome itself. Returns the calls counted; *st the status;
 * *fired whether the armed fault fired. */
typedef uint64_t (*site_fn)(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                            bool *fired);

static void sweep(sweep_ctx *c, const char *name, fault_kind k, site_fn fn)
{
    site_tally *t = &tallies[n_tallies++];
    assert_true(n_tallies <= (int)(sizeof tallies / sizeof tallies[0]));
    *t = (site_tally){
        .name = name, .kind = k == FAULT_ALLOC ? "alloc" : "io", .persist = sweep_persist};
    devio_status st;
    bool fired;
    /* Two clean runs: the first warms what is made once per process. */
    resources_checked = false;
    fn(c, k, 0, &st, &fired);
    if (st != DEVIO_OK)
        print_error("%s: the clean run failed: %s\n", name, devio_status_str(st));
    assert_int_equal(st, DEVIO_OK);
    resources_checked = true;
    t->total = fn(c, k, 0, &st, &fired);
    assert_int_equal(st, DEVIO_OK);
    double t0 = now_s();
    for (uint64_t n = 1; n <= t->total; n += n < SAMPLE_FROM ? 1 : SAMPLE_STEP) {
        if (now_s() - t0 > c->site_s)
            break;
        fn(c, k, n, &st, &fired);
        if (getenv("DEVIO_FAULT_VERBOSE"))
            printf("  %s %s N=%" PRIu64 ": %s %s\n", name, t->kind, n, devio_status_str(st),
                   st != DEVIO_OK ? last_message : "");
        t->reached = n;
        t->tried++;
        if (!fired)
            t->not_fired++; /* the run made fewer calls this time (threads) */
        else if (st != DEVIO_OK) {
            t->failed_clean++;
            t->codes[(unsigned)st < 64 ? st : 63]++;
        }
        else
            t->ok_verified++; /* the site checked that the success is right */
    }
    t->secs = now_s() - t0;
    printf("fault sweep %-18s %-5s %-6s calls %6" PRIu64 "  N reached %6" PRIu64
           "  tried %6" PRIu64 "  failed clean %6" PRIu64 "  ok (verified) %4" PRIu64
           "  not fired %3" PRIu64 "  %.1f s\n",
           t->name, t->kind, t->persist ? "from N" : "N only", t->total, t->reached, t->tried,
           t->failed_clean, t->ok_verified, t->not_fired, t->secs);
    for (int i = 0; i < 64; i++)
        if (t->codes[i])
            printf("    %s: %u\n", devio_status_str((devio_status)i), t->codes[i]);
    fflush(stdout);
}

/* Every site's error path must say what failed. */
static void assert_clean_error(devio_status s, const devio_error *err)
{
    last_message[0] = '\0';
    if (s != DEVIO_OK) {
        snprintf(last_message, sizeof last_message, "%s", err->message);
        assert_int_equal(err->status, s);
        assert_true(err->message[0] != '\0');
    }
}

/* ---- model load ------------------------------------------------------------ */

/* The model the load and open sites use now: llama, then bamba (SSM mixers). */
static const devio_fixture *model_now;

static uint64_t site_model_load(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                bool *fired)
{
    resources before = resources_now();
    devio_model *m = (devio_model *)1;
    devio_error err = {0};
    arm(k, n);
    *st = devio_model_load(model_now->dir, &m, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    assert_code_names_fault(*st, k);
    if (*st != DEVIO_OK) {
        assert_null(m);
    } else {
        /* A success must be the same model: its config and one tensor's bytes. */
        const devio_model *ref = model_now->model;
        (void)c;
        assert_memory_equal(&m->cfg, &ref->cfg, sizeof m->cfg);
        assert_memory_equal(m->embed.data, ref->embed.data,
                            (size_t)ref->cfg.vocab_size * ref->cfg.hidden_size *
                                devio_dtype_size(ref->embed.dtype));
        devio_model_free(m);
    }
    resources after = resources_now();
    assert_same_resources(&before, &after, "model load", n);
    return calls;
}

/* ---- device open (the reference backend's create) ------------------------- */

static devio_config small_cfg(const char *adapters_root)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = 32;
    cfg.block_size = 4;
    cfg.max_seq_len = 64;
    cfg.max_seqs = 8;
    cfg.threads = 2; /* a pool with a worker, so its start is swept too */
    cfg.ssm_slots = 4;
    cfg.ssm_snapshots = 4;
    cfg.adapters_root = adapters_root;
    cfg.use_worker_thread = false;
    return cfg;
}

static devio_device *open_ok(const devio_model *m, const char *adapters_root)
{
    devio_config cfg = small_cfg(adapters_root);
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(m, &devio_ref_backend, &cfg, &d, &err), DEVIO_OK);
    return d;
}

static uint64_t site_open(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st, bool *fired)
{
    resources before = resources_now();
    devio_config cfg = small_cfg(c->root);
    devio_device *d = (devio_device *)1;
    devio_error err = {0};
    arm(k, n);
    *st = devio_open(model_now->model, &devio_ref_backend, &cfg, &d, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    if (*st != DEVIO_OK) {
        assert_null(d);
    } else {
        devio_facts f = devio_facts_get(d);
        assert_int_equal(f.blocks_free, f.blocks_total);
        assert_int_equal(f.blocks_total, cfg.kv_blocks);
        free(devio_test_step(d, devio_test_seq(d), (const int32_t[]){1, 2, 3}, 3,
                             DEVIO_SNAP_NONE, DEVIO_OK));
        assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
    }
    resources after = resources_now();
    assert_same_resources(&before, &after, "device open", n);
    return calls;
}

/* ---- what "nothing changed" means on a device ---------------------------- */

typedef struct dev_state {
    devio_facts facts;
    uint32_t n_seqs;
    devio_seq_info seqs[4]; /* all zero for a sequence that is gone */
    devio_adapter_ack list;
} dev_state;

static void dev_state_get(devio_device *d, const uint64_t *seqs, uint32_t n, dev_state *out)
{
    memset(out, 0, sizeof *out);
    out->facts = devio_facts_get(d);
    out->n_seqs = n;
    for (uint32_t i = 0; i < n; i++)
        if (devio_seq_info_get(d, seqs[i], &out->seqs[i], NULL) != DEVIO_OK)
            memset(&out->seqs[i], 0, sizeof out->seqs[i]);
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LIST};
    assert_int_equal(devio_adapter_command(d, &cmd, &out->list, NULL), DEVIO_OK);
}

static void assert_dev_unchanged(const dev_state *a, const dev_state *b, const char *site,
                                 uint64_t n)
{
    const devio_facts *x = &a->facts, *y = &b->facts;
    bool same = x->blocks_total == y->blocks_total && x->blocks_free == y->blocks_free &&
                x->blocks_shared == y->blocks_shared && x->ssm_slots_used == y->ssm_slots_used &&
                x->ssm_snapshots_used == y->ssm_snapshots_used &&
                x->tickets_in_flight == y->tickets_in_flight && x->logits_live == y->logits_live &&
                x->adapters_loaded == y->adapters_loaded && x->epoch == y->epoch &&
                a->n_seqs == b->n_seqs &&
                memcmp(a->seqs, b->seqs, sizeof a->seqs) == 0 &&
                a->list.n_adapters == b->list.n_adapters;
    for (uint32_t i = 0; same && i < a->list.n_adapters; i++)
        same = strcmp(a->list.adapters[i].name, b->list.adapters[i].name) == 0;
    if (!same) {
        print_error("%s N=%" PRIu64 ": the device changed: blocks free %u -> %u, in flight %u -> "
                    "%u, logits %u -> %u, adapters %u -> %u, len %u -> %u\n",
                    site, n, a->facts.blocks_free, b->facts.blocks_free,
                    a->facts.tickets_in_flight, b->facts.tickets_in_flight, a->facts.logits_live,
                    b->facts.logits_live, a->list.n_adapters, b->list.n_adapters,
                    a->seqs[0].len, b->seqs[0].len);
        fail();
    }
}

static void dev_state_free(dev_state *s)
{
    devio_adapter_ack_free(&s->list);
}

/* ---- adapter load ---------------------------------------------------------- */

static uint64_t site_adapter_load(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                  bool *fired)
{
    resources before_res = resources_now();
    devio_device *d = open_ok(c->llama.model, c->root);
    dev_state before, after;
    dev_state_get(d, NULL, 0, &before);
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = "a", .path = "a"};
    devio_adapter_ack ack = {0};
    devio_error err = {0};
    arm(k, n);
    *st = devio_adapter_command(d, &cmd, &ack, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    dev_state_get(d, NULL, 0, &after);
    /* File errors of an adapter load answer invalid_input (device/core/adapter_table.c:
     * the command's directory is the caller's), so only allocations are held
     * to their code here. */
    if (k == FAULT_ALLOC)
        assert_code_names_fault(*st, k);
    if (*st != DEVIO_OK) {
        assert_int_equal(ack.n_adapters, 0);
        assert_null(ack.adapters);
        assert_dev_unchanged(&before, &after, "adapter load", n);
    } else {
        assert_int_equal(after.facts.adapters_loaded, 1);
        assert_int_equal(ack.n_adapters, 1);
        assert_int_equal(ack.adapters[0].rank, 4);
        assert_int_equal(strlen(ack.adapters[0].sha256), 64);
        /* The adapter serves a step. */
        uint64_t s = devio_test_seq(d);
        int32_t tok[2] = {1, 2};
        devio_row row = {.seq = s, .tokens = tok, .n_tokens = 2, .adapter = "a"};
        devio_plan plan = {.rows = &row, .n_rows = 1};
        uint64_t t;
        assert_int_equal(devio_launch(d, &plan, &t, NULL), DEVIO_OK);
        devio_step_result r;
        assert_int_equal(devio_await(d, t, -1, &r, NULL), DEVIO_OK);
        devio_step_result_free(&r);
    }
    devio_adapter_ack_free(&ack);
    dev_state_free(&before);
    dev_state_free(&after);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
    resources after_res = resources_now();
    assert_same_resources(&before_res, &after_res, "adapter load", n);
    return calls;
}

/* ---- launch ---------------------------------------------------------------- */

/* Logits of a clean run of the launch site's plan, to check a success against. */
static float *launch_ref;

static uint64_t site_launch(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                            bool *fired)
{
    resources before_res = resources_now();
    devio_device *d = open_ok(c->llama.model, c->root);
    uint64_t seqs[2] = {devio_test_seq(d), devio_test_seq(d)};
    free(devio_test_step(d, seqs[0], (const int32_t[]){5, 6, 7}, 3, DEVIO_SNAP_NONE, DEVIO_OK));
    dev_state before, after;
    dev_state_get(d, seqs, 2, &before);
    int32_t t0[6] = {1, 2, 3, 4, 5, 6}, t1[1] = {9};
    devio_row rows[2] = {
        {.seq = seqs[0], .tokens = t0, .n_tokens = 6, .logits = DEVIO_LOGITS_LAST},
        {.seq = seqs[1],
         .tokens = t1,
         .n_tokens = 1,
         .logits = DEVIO_LOGITS_ALL,
         .has_sample = true,
         .sample = devio_sample_params_default()},
    };
    devio_plan plan = {.rows = rows, .n_rows = 2};
    uint64_t ticket = 0;
    devio_error err = {0};
    arm(k, n);
    *st = devio_launch(d, &plan, &ticket, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    if (*st != DEVIO_OK) {
        dev_state_get(d, seqs, 2, &after);
        assert_dev_unchanged(&before, &after, "launch", n);
        dev_state_free(&after);
    } else {
        devio_step_result r;
        assert_int_equal(devio_await(d, ticket, -1, &r, NULL), DEVIO_OK);
        assert_int_equal(r.n_rows, 2);
        assert_int_equal(r.rows[0].len, 9);
        assert_int_equal(r.rows[1].len, 1);
        uint32_t vocab = c->llama.model->cfg.vocab_size;
        float *lg = malloc(vocab * sizeof *lg);
        assert_non_null(lg);
        uint32_t nr;
        assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, 1, lg, &nr, NULL), DEVIO_OK);
        if (!launch_ref)
            launch_ref = lg;
        else {
            assert_memory_equal(lg, launch_ref, vocab * sizeof *lg);
            free(lg);
        }
        devio_step_result_free(&r);
    }
    dev_state_free(&before);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
    resources after_res = resources_now();
    assert_same_resources(&before_res, &after_res, "launch", n);
    return calls;
}

/* ---- await (the step runs inside it without the worker thread) ---------- */

static uint64_t site_await(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st, bool *fired)
{
    resources before_res = resources_now();
    devio_device *d = open_ok(c->llama.model, c->root);
    uint64_t seq = devio_test_seq(d);
    int32_t tok[6] = {1, 2, 3, 4, 5, 6};
    devio_row row = {.seq = seq, .tokens = tok, .n_tokens = 6, .logits = DEVIO_LOGITS_LAST};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t ticket;
    assert_int_equal(devio_launch(d, &plan, &ticket, NULL), DEVIO_OK);
    dev_state before, after;
    dev_state_get(d, &seq, 1, &before);
    devio_step_result r;
    devio_error err = {0};
    arm(k, n);
    *st = devio_await(d, ticket, -1, &r, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    assert_code_names_fault(*st, k);
    if (*st != DEVIO_OK) {
        /* The result could not be built: the ticket stays, and a retry gets it. */
        assert_int_equal(r.n_rows, 0);
        assert_null(r.rows);
        dev_state_get(d, &seq, 1, &after);
        assert_int_equal(after.facts.tickets_in_flight, 1);
        dev_state_free(&after);
        assert_int_equal(devio_await(d, ticket, -1, &r, NULL), DEVIO_OK);
    }
    assert_int_equal(r.n_rows, 1);
    assert_int_equal(r.rows[0].len, 6);
    uint32_t vocab = c->llama.model->cfg.vocab_size;
    float *lg = malloc(vocab * sizeof *lg);
    assert_non_null(lg);
    uint32_t nr;
    assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, 1, lg, &nr, NULL), DEVIO_OK);
    free(lg);
    devio_step_result_free(&r);
    dev_state_get(d, &seq, 1, &after);
    assert_int_equal(after.facts.tickets_in_flight, 0);
    assert_int_equal(after.seqs[0].len, 6);
    dev_state_free(&after);
    dev_state_free(&before);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
    resources after_res = resources_now();
    assert_same_resources(&before_res, &after_res, "await", n);
    return calls;
}

/* ---- effects ----------------------------------------------------------------- */

/* The state an effect runs on: a sequence of 9 tokens (bamba: with
 * snapshots at 5 and 9) and a logits handle of 3 positions. */
typedef struct effect_env {
    devio_device *d;
    uint64_t seq, logits;
} effect_env;

static void effect_env_make(const devio_model *m, effect_env *e)
{
    e->d = open_ok(m, NULL);
    e->seq = devio_test_seq(e->d);
    bool ssm = m->cfg.arch != DEVIO_ARCH_LLAMA;
    free(devio_test_step(e->d, e->seq, (const int32_t[]){1, 2, 3, 4, 5}, 5,
                         ssm ? DEVIO_SNAP_END : DEVIO_SNAP_NONE, DEVIO_OK));
    int32_t tok[4] = {6, 7, 8, 9};
    devio_row row = {.seq = e->seq,
                     .tokens = tok,
                     .n_tokens = 4,
                     .logits = DEVIO_LOGITS_ALL,
                     .snapshot = ssm ? DEVIO_SNAP_END : DEVIO_SNAP_NONE};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t t;
    assert_int_equal(devio_launch(e->d, &plan, &t, NULL), DEVIO_OK);
    devio_step_result r;
    assert_int_equal(devio_await(e->d, t, -1, &r, NULL), DEVIO_OK);
    e->logits = r.rows[0].logits;
    devio_step_result_free(&r);
}

typedef struct effect_site {
    const char *name;
    devio_effect_kind kind;
    bool bamba;
    bool by_seq; /* release: a sequence's snapshots rather than a logits handle */
} effect_site;

static const effect_site effect_sites[] = {
    {"apply sample", DEVIO_EFFECT_SAMPLE, false, false},
    {"apply fork", DEVIO_EFFECT_FORK, false, false},
    {"apply fork (ssm)", DEVIO_EFFECT_FORK, true, false},
    {"apply truncate", DEVIO_EFFECT_TRUNCATE, false, false},
    {"apply truncate ssm", DEVIO_EFFECT_TRUNCATE, true, false},
    {"apply snapshot", DEVIO_EFFECT_SNAPSHOT, true, false},
    {"apply free", DEVIO_EFFECT_FREE, false, false},
    {"apply release", DEVIO_EFFECT_RELEASE, false, false},
    {"apply release ssm", DEVIO_EFFECT_RELEASE, true, true},
};
static const effect_site *effect_now;
/* The clean run's outcome, to check a success against. */
static devio_outcome effect_ref;
static bool effect_ref_set;

static devio_effect effect_of(const effect_site *s, const effect_env *e)
{
    devio_effect x = {.kind = s->kind, .seq = e->seq};
    switch (s->kind) {
    case DEVIO_EFFECT_SAMPLE:
        x.seq = 0;
        x.logits = e->logits;
        x.params = devio_sample_params_default();
        x.params.temperature = 0.8f;
        x.params.seed = 11;
        break;
    case DEVIO_EFFECT_TRUNCATE:
        x.len = s->bamba ? 5 : 3; /* a hybrid sequence truncates to a snapshot */
        break;
    case DEVIO_EFFECT_RELEASE:
        if (!s->by_seq) {
            x.seq = 0;
            x.logits = e->logits;
        }
        break;
    default:
        break;
    }
    return x;
}

static uint64_t site_effect(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st, bool *fired)
{
    const effect_site *s = effect_now;
    resources before_res = resources_now();
    effect_env e;
    effect_env_make(s->bamba ? c->bamba.model : c->llama.model, &e);
    dev_state before, after;
    dev_state_get(e.d, &e.seq, 1, &before);
    devio_effect x = effect_of(s, &e);
    devio_outcome o;
    memset(&o, 0xa5, sizeof o);
    devio_error err = {0};
    arm(k, n);
    *st = devio_apply(e.d, &x, &o, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    assert_code_names_fault(*st, k);
    if (n == 0 && *st != DEVIO_OK)
        print_error("%s: %s\n", s->name, err.message);
    dev_state_get(e.d, &e.seq, 1, &after);
    if (*st != DEVIO_OK) {
        assert_dev_unchanged(&before, &after, s->name, n);
        if (s->kind == DEVIO_EFFECT_FORK && effect_ref_set) {
            devio_seq_info info;
            assert_int_not_equal(devio_seq_info_get(e.d, effect_ref.seq, &info, NULL), DEVIO_OK);
        }
    } else if (!effect_ref_set) {
        effect_ref = o;
        effect_ref_set = true;
        o = (devio_outcome){0};
    } else {
        assert_int_equal(o.kind, effect_ref.kind);
        assert_int_equal(o.seq, effect_ref.seq);
        assert_int_equal(o.len, effect_ref.len);
        assert_int_equal(o.shared_blocks, effect_ref.shared_blocks);
        assert_int_equal(o.freed_blocks, effect_ref.freed_blocks);
        assert_int_equal(o.freed_snapshots, effect_ref.freed_snapshots);
        assert_int_equal(o.n_tokens, effect_ref.n_tokens);
        if (o.n_tokens) {
            assert_memory_equal(o.tokens, effect_ref.tokens, o.n_tokens * sizeof *o.tokens);
            assert_memory_equal(o.logprobs, effect_ref.logprobs, o.n_tokens * sizeof *o.logprobs);
        }
    }
    if (*st == DEVIO_OK)
        devio_outcome_free(&o);
    dev_state_free(&before);
    dev_state_free(&after);
    assert_int_equal(devio_teardown(e.d, NULL), DEVIO_OK);
    resources after_res = resources_now();
    assert_same_resources(&before_res, &after_res, s->name, n);
    return calls;
}

/* ---- the store ---------------------------------------------------------------- */

static int64_t sql_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static bool integrity_ok(const char *path)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    bool ok = sqlite3_step(st) == SQLITE_ROW &&
              strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ok;
}

static void copy_file(const char *from, const char *to)
{
    size_t n = 0;
    uint8_t *b = devio_read_file(from, &n);
    assert_non_null(b);
    assert_int_equal(devio_write_file(to, b, n), 0);
    free(b);
}

/* A fresh copy of database `from`; its path in c->work's "devio.db". */
static const char *fresh_db_from(sweep_ctx *c, const char *from, char *path, size_t len)
{
    snprintf(path, len, "%s/devio.db", c->work);
    char side[600];
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    copy_file(from, path);
    return path;
}

static const char *fresh_db(sweep_ctx *c, char *path, size_t len)
{
    return fresh_db_from(c, c->db_seed, path, len);
}

static devio_store *store_open_ok(const char *path)
{
    devio_store_options o = devio_store_options_default();
    devio_store *s = NULL;
    devio_error err = {0};
    assert_int_equal(devio_store_open(path, &o, &s, &err), DEVIO_OK);
    return s;
}

static const uint64_t rec_seqs[2] = {7, 8};

static devio_ticket_record rec_launch(uint64_t id)
{
    return (devio_ticket_record){.id = id,
                                 .status = "in_flight",
                                 .launched_ms = 1000 + (int64_t)id,
                                 .rows = 2,
                                 .tokens = 17,
                                 .seqs = rec_seqs,
                                 .n_seqs = 2};
}

static devio_ticket_record rec_settle(uint64_t id)
{
    devio_ticket_record r = rec_launch(id);
    r.status = "ok";
    r.settled_ms = 2000 + (int64_t)id;
    r.queued_us = 5;
    r.compute_us = 6;
    return r;
}

/* Opening an existing database (the restart path: schema, epoch, aborting
 * what the last process left in flight). */
static uint64_t site_store_open(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                bool *fired)
{
    char path[600];
    fresh_db(c, path, sizeof path);
    resources before = resources_now();
    devio_store_options o = devio_store_options_default();
    devio_store *s = (devio_store *)1;
    devio_error err = {0};
    arm(k, n);
    *st = devio_store_open(path, &o, &s, &err);
    if (*st == DEVIO_OK)
        devio_store_close(s); /* the close's calls count too */
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    if (*st != DEVIO_OK)
        assert_null(s);
    resources after = resources_now();
    assert_same_resources(&before, &after, "store open", n);
    /* Whatever happened, the file is sound and the rows the seed holds are there. */
    assert_true(integrity_ok(path));
    assert_int_equal(sql_int(path, "SELECT count(*) FROM tickets WHERE id IN (1, 2)"), 2);
    if (*st == DEVIO_OK) {
        assert_int_equal(sql_int(path, "SELECT count(*) FROM tickets WHERE status='in_flight'"),
                         0);
        assert_int_equal(sql_int(path, "SELECT count(*) FROM tickets WHERE id=2 AND status='ok'"),
                         1);
    }
    /* A later clean open works, and ids go on from the seed's. */
    devio_store *s2 = store_open_ok(path);
    assert_true(devio_store_next_ticket_id(s2) >= 3);
    devio_store_close(s2);
    return calls;
}

/* A launch write (insert) or a settle write (update) and its wait. */
static uint64_t store_write(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                            bool *fired, bool settle)
{
    char path[600];
    fresh_db(c, path, sizeof path);
    resources before = resources_now();
    devio_store *s = store_open_ok(path);
    uint64_t id = devio_store_next_ticket_id(s);
    if (settle) {
        devio_ticket_record r = rec_launch(id);
        devio_error err = {0};
        assert_int_equal(devio_store_wait(s, devio_store_ticket_launched(s, &r), &err), DEVIO_OK);
    }
    devio_ticket_record r = settle ? rec_settle(id) : rec_launch(id);
    devio_error err = {0};
    arm(k, n);
    uint64_t w = settle ? devio_store_ticket_settled(s, &r) : devio_store_ticket_launched(s, &r);
    *st = w ? devio_store_wait(s, w, &err) : DEVIO_E_IO;
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    if (w)
        assert_clean_error(*st, &err);
    /* A later write on the same store goes through. */
    devio_ticket_record r2 = rec_launch(id + 1);
    devio_error err2 = {0};
    devio_status st2 = devio_store_wait(s, devio_store_ticket_launched(s, &r2), &err2);
    devio_store_close(s);
    resources after = resources_now();
    assert_same_resources(&before, &after, settle ? "store settle" : "store launch", n);
    assert_true(integrity_ok(path));
    char q[200];
    snprintf(q, sizeof q, "SELECT count(*) FROM tickets WHERE id=%" PRIu64 " AND status='%s'", id,
             settle ? "ok" : "in_flight");
    int64_t have = sql_int(path, q);
    /* Answered ok: the row is there. Failed: it may or may not be (a commit
     * whose sync failed can still be in the journal), but only as written. */
    if (*st == DEVIO_OK)
        assert_int_equal(have, 1);
    if (settle && have == 0) {
        snprintf(q, sizeof q,
                 "SELECT count(*) FROM tickets WHERE id=%" PRIu64 " AND status='in_flight'", id);
        assert_int_equal(sql_int(path, q), 1);
    }
    if (st2 == DEVIO_OK) {
        snprintf(q, sizeof q, "SELECT count(*) FROM tickets WHERE id=%" PRIu64, id + 1);
        assert_int_equal(sql_int(path, q), 1);
    } else {
        print_message("store %s N=%" PRIu64 ": the next write failed too: %s\n",
                      settle ? "settle" : "launch", n, err2.message);
    }
    return calls;
}

static uint64_t site_store_launch(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                  bool *fired)
{
    return store_write(c, k, n, st, fired, false);
}

static uint64_t site_store_settle(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                  bool *fired)
{
    return store_write(c, k, n, st, fired, true);
}

/* ---- adapter load through the server's adapter commands (device and store) ---- */

/* The device is changed first and the row written after: a failed row write
 * answers DEVIO_E_IO with the device changed (service/adapters.h); any
 * other failure leaves both as they were. */
static uint64_t site_adapters_cmd(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                  bool *fired)
{
    char path[600];
    fresh_db(c, path, sizeof path);
    resources before_res = resources_now();
    devio_device *d = open_ok(c->llama.model, c->root);
    devio_store *s = store_open_ok(path);
    devio_adapters a;
    devio_adapters_init(&a);
    assert_int_equal(devio_adapters_start(&a, s, d, NULL, NULL), DEVIO_OK);
    devio_adapter_record rec;
    char evicted[DEVIO_ADAPTER_NAME_MAX];
    devio_error err = {0};
    arm(k, n);
    *st = devio_adapters_load(&a, d, "a", "a", false, &rec, evicted, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    uint32_t loaded = devio_facts_get(d).adapters_loaded;
    if (*st == DEVIO_OK) {
        assert_int_equal(loaded, 1);
        assert_int_equal(rec.state, DEVIO_ADAPTER_LOADED);
    } else if (loaded != 0) {
        assert_int_equal(*st, DEVIO_E_IO); /* the device changed, the row did not follow */
    }
    devio_adapters_fini(&a);
    devio_store_close(s);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
    resources after_res = resources_now();
    assert_same_resources(&before_res, &after_res, "adapters command", n);
    assert_true(integrity_ok(path));
    int64_t rows = sql_int(path, "SELECT count(*) FROM adapters WHERE name='a' AND state='loaded'");
    if (*st == DEVIO_OK)
        assert_int_equal(rows, 1);
    return calls;
}

/* A restart: the adapter its row records as loaded is loaded again. Only a
 * store that cannot be read fails the start; what it says it restored must
 * be what the device holds. */
static uint64_t site_adapters_start(sweep_ctx *c, fault_kind k, uint64_t n, devio_status *st,
                                    bool *fired)
{
    char path[600];
    fresh_db_from(c, c->db_restore, path, sizeof path);
    resources before_res = resources_now();
    devio_device *d = open_ok(c->llama.model, c->root);
    devio_store *s = store_open_ok(path);
    devio_adapters a;
    devio_adapters_init(&a);
    devio_adapters_restored got = {0};
    devio_error err = {0};
    arm(k, n);
    *st = devio_adapters_start(&a, s, d, &got, &err);
    uint64_t calls = fault_disarm();
    *fired = fault_fired();
    assert_clean_error(*st, &err);
    uint32_t loaded = devio_facts_get(d).adapters_loaded;
    assert_int_equal(loaded, got.loaded);
    if (*st == DEVIO_OK)
        assert_int_equal(got.loaded + got.stale + got.failed, 1);
    else
        assert_int_equal(loaded, 0);
    devio_adapters_fini(&a);
    devio_store_close(s);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
    resources after_res = resources_now();
    assert_same_resources(&before_res, &after_res, "adapters start", n);
    assert_true(integrity_ok(path));
    assert_int_equal(sql_int(path, "SELECT count(*) FROM adapters WHERE name='a'"), 1);
    return calls;
}

/* ---- fixtures and the tests -------------------------------------------------- */

static int setup(void **state)
{
    sweep_ctx *c = calloc(1, sizeof *c);
    if (!c || devio_fixture_arch(&c->llama, "tiny", "llama", 41) != 0 ||
        devio_fixture_arch(&c->bamba, "tiny", "bamba", 42) != 0)
        return -1;
    const char *budget = getenv("DEVIO_FAULT_SITE_S");
    c->site_s = budget ? atof(budget) : 60.0;
    snprintf(c->root, sizeof c->root, "%s/adapters", c->llama.dir);
    char out[600];
    snprintf(out, sizeof out, "%s/a", c->root);
    devio_mkmodel_adapter_opts ao = devio_mkmodel_adapter_opts_default();
    ao.model_dir = c->llama.dir;
    ao.out_dir = out;
    ao.rank = 4;
    ao.alpha = 8;
    ao.seed = 3;
    if (devio_mkmodel_write_adapter(&ao, NULL) != DEVIO_OK)
        return -1;
    snprintf(c->work, sizeof c->work, "%s/work", c->llama.dir);
    snprintf(c->db_seed, sizeof c->db_seed, "%s/seed.db", c->llama.dir);
    if (mkdir(c->work, 0700) != 0)
        return -1;
    /* The seed: ticket 1 left in flight by "an earlier process", ticket 2 settled. */
    devio_store *s = NULL;
    devio_store_options so = devio_store_options_default();
    if (devio_store_open(c->db_seed, &so, &s, NULL) != DEVIO_OK)
        return -1;
    devio_ticket_record r1 = rec_launch(1), r2 = rec_launch(2), r2s = rec_settle(2);
    devio_store_ticket_launched(s, &r1);
    devio_store_ticket_launched(s, &r2);
    uint64_t w = devio_store_ticket_settled(s, &r2s);
    devio_status st = devio_store_wait(s, w, NULL);
    devio_store_close(s);
    if (st != DEVIO_OK)
        return -1;
    /* The restart seed: the seed after adapter "a" was loaded. */
    snprintf(c->db_restore, sizeof c->db_restore, "%s/restore.db", c->llama.dir);
    copy_file(c->db_seed, c->db_restore);
    devio_device *d = open_ok(c->llama.model, c->root);
    s = store_open_ok(c->db_restore);
    devio_adapters a;
    devio_adapters_init(&a);
    devio_adapter_record rec;
    char evicted[DEVIO_ADAPTER_NAME_MAX];
    st = devio_adapters_start(&a, s, d, NULL, NULL);
    if (st == DEVIO_OK)
        st = devio_adapters_load(&a, d, "a", "a", true, &rec, evicted, NULL);
    devio_adapters_fini(&a);
    devio_store_close(s);
    devio_teardown(d, NULL);
    if (st != DEVIO_OK)
        return -1;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    sweep_ctx *c = *state;
    printf("fault sweep summary (site, kind, mode, calls, N reached, tried, failed clean, "
           "ok verified, not fired, seconds, codes):\n");
    for (int i = 0; i < n_tallies; i++) {
        const site_tally *t = &tallies[i];
        printf("| %s | %s | %s | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %" PRIu64
               " | %" PRIu64 " | %" PRIu64 " | %.1f |",
               t->name, t->kind, t->persist ? "from N" : "N only", t->total, t->reached, t->tried,
               t->failed_clean, t->ok_verified, t->not_fired, t->secs);
        for (int j = 0; j < 64; j++)
            if (t->codes[j])
                printf(" %s %u", devio_status_str((devio_status)j), t->codes[j]);
        printf(" |\n");
    }
    free(launch_ref);
    devio_fixture_free(&c->bamba);
    devio_fixture_free(&c->llama);
    free(c);
    return 0;
}

/* Both kinds, each in both modes. */
static void both(sweep_ctx *c, const char *name, site_fn fn)
{
    for (int p = 0; p < 2; p++) {
        sweep_persist = p == 1;
        sweep(c, name, FAULT_ALLOC, fn);
        sweep(c, name, FAULT_IO, fn);
    }
    sweep_persist = false;
}

static void test_model_load(void **state)
{
    sweep_ctx *c = *state;
    model_now = &c->llama;
    both(c, "model load", site_model_load);
    model_now = &c->bamba;
    both(c, "model load (ssm)", site_model_load);
}

static void test_device_open(void **state)
{
    sweep_ctx *c = *state;
    model_now = &c->llama;
    both(c, "device open", site_open);
    model_now = &c->bamba;
    both(c, "device open (ssm)", site_open);
}

static void test_adapter_load(void **state)
{
    both(*state, "adapter load", site_adapter_load);
}

static void test_launch(void **state)
{
    both(*state, "launch", site_launch);
}

static void test_await(void **state)
{
    both(*state, "await", site_await);
}

static void test_adapters_cmd(void **state)
{
    both(*state, "adapters load cmd", site_adapters_cmd);
}

static void test_adapters_start(void **state)
{
    both(*state, "adapters restore", site_adapters_start);
}

static void test_effects(void **state)
{
    for (size_t i = 0; i < sizeof effect_sites / sizeof effect_sites[0]; i++) {
        effect_now = &effect_sites[i];
        for (int m = 0; m < 4; m++) {
            sweep_persist = m >= 2;
            effect_ref_set = false;
            sweep(*state, effect_now->name, (fault_kind)(m % 2), site_effect);
            if (effect_ref_set)
                devio_outcome_free(&effect_ref);
        }
        sweep_persist = false;
    }
}

static void test_store_open(void **state)
{
    both(*state, "store open", site_store_open);
}

static void test_store_launch(void **state)
{
    both(*state, "store launch write", site_store_launch);
}

static void test_store_settle(void **state)
{
    both(*state, "store settle write", site_store_settle);
}

int main(void)
{
    /* Before any SQL: SQLite's allocations and VFS calls go through the counters. */
    if (fault_sqlite_install() != 0) {
        fprintf(stderr, "cannot install the SQLite fault shims\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_load),   cmocka_unit_test(test_device_open),
        cmocka_unit_test(test_adapter_load), cmocka_unit_test(test_adapters_cmd),
        cmocka_unit_test(test_adapters_start),
        cmocka_unit_test(test_launch),       cmocka_unit_test(test_await),
        cmocka_unit_test(test_effects),      cmocka_unit_test(test_store_open),
        cmocka_unit_test(test_store_launch), cmocka_unit_test(test_store_settle),
    };
    return devio_run_tests("fault_sweep_test", tests, sizeof tests / sizeof tests[0], setup,
                           teardown);
}
