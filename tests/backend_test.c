/* backend_test.c - the backend seam: the registry (built in, dlopen plugins and the ones it must
 * refuse), and a second backend ("stream") driven by the core: steps really overlapping at depth 2,
 * logits kept on its side, sampling on its side, adapter slots, and injected submit/wait faults
 * that leave nothing reserved. Every number is compared with the reference's, bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_backend.h"
#include "device/backend/registry.h"
#include "ref/builtin.h"
#include "ref/ref_backend.h"
#include "tests/backend/stream_backend.h"
#include "tests/testutil.h"

/* Where Bazel puts the plugins of //tests/backend in this test's runfiles. */
#define PLUGIN_DIR "tests/backend"

typedef struct ctx {
    devio_fixture fx;
    uint32_t vocab;
    char adapters[300];
} ctx;

/* The stream backend with its state captured at create, so that the test
 * can read its statistics and inject faults through the core. */
static void *captured;

static devio_status capture_create(const devio_model *m, const devio_backend_config *c, void **s,
                                   devio_error *e)
{
    devio_status st = devio_stream_backend.create(m, c, s, e);
    captured = *s;
    return st;
}

static devio_backend_ops stream_ops(void)
{
    devio_backend_ops ops = devio_stream_backend;
    ops.create = capture_create;
    return ops;
}

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    if (!c || devio_fixture_preset(&c->fx, "tiny", DEVIO_F32, 9) != 0)
        return -1;
    c->vocab = c->fx.model->cfg.vocab_size;
    snprintf(c->adapters, sizeof c->adapters, "%s/adapters", c->fx.dir);
    devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
    char out[400];
    o.model_dir = c->fx.dir;
    o.rank = 4;
    for (int i = 0; i < 2; i++) {
        snprintf(out, sizeof out, "%s/a%d", c->adapters, i);
        o.out_dir = out;
        o.seed = (uint64_t)i + 1;
        if (devio_mkmodel_write_adapter(&o, NULL) != DEVIO_OK)
            return -1;
    }
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    devio_fixture_free(&c->fx);
    free(c);
    return 0;
}

static devio_config cfg_of(ctx *c, devio_numerics numerics)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = 64;
    cfg.block_size = 4;
    cfg.max_seq_len = 128;
    cfg.threads = 1;
    cfg.max_loras = 1;
    cfg.adapters_root = c->adapters;
    cfg.numerics = numerics;
    return cfg;
}

static devio_device *open_with(ctx *c, const devio_backend_ops *ops, devio_config cfg)
{
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(c->fx.model, ops, &cfg, &d, &err), DEVIO_OK);
    return d;
}

static devio_status launch_one(devio_device *d, uint64_t seq, const int32_t *tok, uint32_t n,
                               const char *adapter, uint64_t *ticket)
{
    devio_row row = {.seq = seq, .tokens = tok, .n_tokens = n, .logits = DEVIO_LOGITS_LAST,
                     .adapter = adapter, .has_sample = true,
                     .sample = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 5}};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    return devio_launch(d, &plan, ticket, NULL);
}

/* What a settled one-row step gave: its logits and its sampled token. */
typedef struct outcome {
    float *logits;
    int32_t token;
    float logprob;
} outcome;

static outcome await_one(devio_device *d, uint64_t ticket, uint32_t vocab)
{
    devio_step_result r;
    devio_error err = {0};
    assert_int_equal(devio_await(d, ticket, -1, &r, &err), DEVIO_OK);
    outcome o = {.logits = malloc(vocab * sizeof(float)), .token = r.rows[0].token,
                 .logprob = r.rows[0].logprob};
    assert_non_null(o.logits);
    assert_true(r.rows[0].sampled);
    assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, 1, o.logits, NULL, &err),
                     DEVIO_OK);
    devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = r.rows[0].logits};
    devio_outcome eo;
    assert_int_equal(devio_apply(d, &rel, &eo, NULL), DEVIO_OK);
    devio_step_result_free(&r);
    return o;
}

static void assert_same(const outcome *a, const outcome *b, uint32_t vocab)
{
    assert_memory_equal(a->logits, b->logits, vocab * sizeof(float));
    assert_int_equal(a->token, b->token);
    assert_memory_equal(&a->logprob, &b->logprob, sizeof(float));
}

/* Two sequences, a prompt each then one more token each; on the reference,
 * one step at a time. out[0..3]. */
static void reference_run(ctx *c, const char *adapter, outcome out[4])
{
    devio_device *d = open_with(c, &devio_ref_backend, cfg_of(c, DEVIO_NUMERICS_STRICT));
    if (adapter) {
        devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = adapter, .path = "a0"};
        devio_adapter_ack ack;
        assert_int_equal(devio_adapter_command(d, &cmd, &ack, NULL), DEVIO_OK);
        devio_adapter_ack_free(&ack);
    }
    uint64_t s[2] = {devio_test_seq(d), devio_test_seq(d)};
    int32_t tok[2][9];
    for (uint32_t k = 0; k < 2; k++)
        devio_test_tokens(tok[k], 9, k, c->vocab);
    for (uint32_t phase = 0; phase < 2; phase++)
        for (uint32_t k = 0; k < 2; k++) {
            uint64_t t;
            assert_int_equal(launch_one(d, s[k], tok[k] + phase * 8, phase ? 1 : 8,
                                        k ? adapter : NULL, &t),
                             DEVIO_OK);
            out[phase * 2 + k] = await_one(d, t, c->vocab);
        }
    devio_teardown(d, NULL);
}

static void free_outcomes(outcome *o, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        free(o[i].logits);
}

/* ---- the registry ------------------------------------------------------ */

static void expect_refused(devio_registry *r, const char *name, const char *says)
{
    const devio_backend_ops *ops = (const devio_backend_ops *)1;
    devio_error err = {0};
    assert_int_equal(devio_registry_find(r, name, &ops, &err), DEVIO_E_UNSUPPORTED);
    assert_null(ops);
    if (!strstr(err.message, says))
        fail_msg("'%s' refused with '%s', expected it to say '%s'", name, err.message, says);
}

static void test_registry(void **state)
{
    (void)state;
    devio_registry r;
    devio_registry_builtin(&r, PLUGIN_DIR);
    const devio_backend_ops *ops = NULL;
    devio_error err = {0};
    assert_int_equal(devio_registry_find(&r, "ref", &ops, &err), DEVIO_OK);
    assert_ptr_equal(ops, &devio_ref_backend);
    assert_int_equal(r.n_handles, 0);
    assert_int_equal(devio_registry_find(&r, "stream", &ops, &err), DEVIO_OK);
    assert_string_equal(ops->name, "stream");
    assert_int_equal(r.n_handles, 1);
    assert_non_null(ops->logits_read);
    char abi[64];
    snprintf(abi, sizeof abi, "interface version 1, this devio needs %u", DEVIO_BACKEND_ABI);
    expect_refused(&r, "badabi", abi);
    expect_refused(&r, "noentry", "has no devio_backend_plugin entry");
    expect_refused(&r, "wrongname", "calls itself 'somebody-else'");
    expect_refused(&r, "nope", "libdevio-backend-nope.so");
    /* A name nothing answers to is refused with the names that exist. */
    expect_refused(&r, "nope", "no backend 'nope'; the backends here: ref, cpu (built in), badabi, "
                               "noentry, stream, wrongname (plugins); no libdevio-backend-nope.so");
    /* No CUDA plugin here: auto takes the reference and says why; under
     * fast numerics it takes the cpu backend. */
    assert_int_equal(devio_registry_find(&r, "auto", &ops, &err), DEVIO_OK);
    assert_ptr_equal(ops, &devio_ref_backend);
    assert_non_null(strstr(r.note, "cuda"));
    assert_int_equal(r.n_handles, 1);
    r.numerics = DEVIO_NUMERICS_FAST;
    assert_int_equal(devio_registry_find(&r, "auto", &ops, &err), DEVIO_OK);
    assert_ptr_equal(ops, &devio_cpu_backend);
    assert_int_equal(devio_registry_find(&r, "cpu", &ops, &err), DEVIO_OK);
    assert_string_equal(ops->name, "cpu");
    devio_registry_close(&r);
    assert_int_equal(r.n_handles, 0);
}

/* The cpu backend takes fast numerics only, says so, and its device says
 * which path runs; the reference takes strict only. The model here has no
 * quantized weight: its numbers then differ from the reference's only by
 * its binary16 K and V (the same token, its logprob within 1e-3). */
static void test_cpu_backend(void **state)
{
    ctx *c = *state;
    devio_config cfg = cfg_of(c, DEVIO_NUMERICS_STRICT);
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(c->fx.model, &devio_cpu_backend, &cfg, &d, &err),
                     DEVIO_E_UNSUPPORTED);
    assert_non_null(strstr(err.message, "fast numerics only"));
    cfg.numerics = DEVIO_NUMERICS_FAST;
    assert_int_equal(devio_open(c->fx.model, &devio_ref_backend, &cfg, &d, &err),
                     DEVIO_E_UNSUPPORTED);
    /* A path the binary lacks is refused, naming the variable. */
    setenv(DEVIO_CPU_ISA_ENV, "nosuch", 1);
    assert_int_equal(devio_open(c->fx.model, &devio_cpu_backend, &cfg, &d, &err),
                     DEVIO_E_UNSUPPORTED);
    unsetenv(DEVIO_CPU_ISA_ENV);
    assert_non_null(strstr(err.message, "DEVIO_CPU_ISA=nosuch: no path 'nosuch'"));
    d = open_with(c, &devio_cpu_backend, cfg);
    devio_device_info info;
    devio_device_info_get(d, &info);
    assert_string_equal(info.backend, "cpu");
    assert_non_null(strstr(info.device, "(fast numerics, "));
    devio_device *r = open_with(c, &devio_ref_backend, cfg_of(c, DEVIO_NUMERICS_STRICT));
    static const int32_t tok[] = {3, 1, 4, 1, 5};
    uint64_t s1 = 0, s2 = 0, t1 = 0, t2 = 0;
    assert_int_equal(devio_seq_create(d, &s1, NULL), DEVIO_OK);
    assert_int_equal(devio_seq_create(r, &s2, NULL), DEVIO_OK);
    assert_int_equal(launch_one(d, s1, tok, 5, NULL, &t1), DEVIO_OK);
    assert_int_equal(launch_one(r, s2, tok, 5, NULL, &t2), DEVIO_OK);
    devio_step_result a = {0}, b = {0};
    assert_int_equal(devio_await(d, t1, -1, &a, NULL), DEVIO_OK);
    assert_int_equal(devio_await(r, t2, -1, &b, NULL), DEVIO_OK);
    assert_int_equal(a.rows[0].token, b.rows[0].token);
    assert_true(fabsf(a.rows[0].logprob - b.rows[0].logprob) < 1e-3f);
    devio_step_result_free(&a);
    devio_step_result_free(&b);
    devio_teardown(r, NULL);
    devio_teardown(d, NULL);
}

/* The plugin's vtable runs a real device, as devio-ref --backend stream does. */
static void test_plugin_device(void **state)
{
    ctx *c = *state;
    devio_registry r;
    devio_registry_builtin(&r, PLUGIN_DIR);
    const devio_backend_ops *ops = NULL;
    assert_int_equal(devio_registry_find(&r, "stream", &ops, NULL), DEVIO_OK);
    devio_device *d = open_with(c, ops, cfg_of(c, DEVIO_NUMERICS_STRICT));
    devio_device_info info;
    devio_device_info_get(d, &info);
    assert_string_equal(info.backend, "stream");
    assert_non_null(strstr(info.device, "stream test device"));
    assert_true(info.memory_used > 0);
    outcome want[4];
    reference_run(c, NULL, want);
    uint64_t s = devio_test_seq(d), t;
    int32_t tok[9];
    devio_test_tokens(tok, 9, 0, c->vocab);
    assert_int_equal(launch_one(d, s, tok, 8, NULL, &t), DEVIO_OK);
    outcome got = await_one(d, t, c->vocab);
    assert_same(&got, &want[0], c->vocab);
    free(got.logits);
    free_outcomes(want, 4);
    devio_teardown(d, NULL);
    devio_registry_close(&r);
}

/* ---- depth 2 really overlaps -------------------------------------------- */

static void overlap_run(ctx *c, devio_numerics numerics, bool worker, const char *adapter)
{
    devio_backend_ops ops = stream_ops();
    devio_config cfg = cfg_of(c, numerics);
    cfg.use_worker_thread = worker;
    devio_device *d = open_with(c, &ops, cfg);
    void *st = captured;
    if (adapter) {
        devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = adapter, .path = "a0"};
        devio_adapter_ack ack;
        assert_int_equal(devio_adapter_command(d, &cmd, &ack, NULL), DEVIO_OK);
        devio_adapter_ack_free(&ack);
    }
    outcome want[4], got[4];
    reference_run(c, adapter, want);
    uint64_t s[2] = {devio_test_seq(d), devio_test_seq(d)};
    int32_t tok[2][9];
    for (uint32_t k = 0; k < 2; k++)
        devio_test_tokens(tok[k], 9, k, c->vocab);
    for (uint32_t phase = 0; phase < 2; phase++) {
        /* The stream starts the first step only once the second is
         * submitted: launch must return before its step ran. */
        devio_stream_hold(st, 2);
        uint64_t t[2];
        for (uint32_t k = 0; k < 2; k++)
            assert_int_equal(launch_one(d, s[k], tok[k] + phase * 8, phase ? 1 : 8,
                                        k ? adapter : NULL, &t[k]),
                             DEVIO_OK);
        assert_int_equal(devio_facts_get(d).tickets_in_flight, 2);
        for (uint32_t k = 0; k < 2; k++)
            got[phase * 2 + k] = await_one(d, t[k], c->vocab);
    }
    for (uint32_t i = 0; i < 4; i++)
        assert_same(&got[i], &want[i], c->vocab);
    devio_stream_stats stats;
    devio_stream_stats_get(st, &stats);
    assert_int_equal(stats.max_queued, 2);
    assert_int_equal(stats.held, 2);
    assert_int_equal(stats.hold_timeouts, 0);
    assert_int_equal(stats.submitted, 4);
    assert_int_equal(stats.waited, 4);
    /* Logits stay on the stream's side: every read went through it. */
    assert_true(stats.logits_reads >= 4);
    /* Fast numerics sample on the stream, strict ones on the host. */
    assert_int_equal(stats.samples, numerics == DEVIO_NUMERICS_FAST ? 4 : 0);
    assert_int_equal(stats.adapters_added, adapter ? 1 : 0);
    free_outcomes(want, 4);
    free_outcomes(got, 4);
    devio_teardown(d, NULL);
}

static void test_overlap_strict(void **state) { overlap_run(*state, DEVIO_NUMERICS_STRICT, true, NULL); }
static void test_overlap_fast(void **state) { overlap_run(*state, DEVIO_NUMERICS_FAST, true, NULL); }
static void test_overlap_sync(void **state) { overlap_run(*state, DEVIO_NUMERICS_STRICT, false, NULL); }
static void test_overlap_lora(void **state) { overlap_run(*state, DEVIO_NUMERICS_FAST, true, "x"); }

/* ---- faults leave nothing behind ----------------------------------------- */

static void assert_facts_equal(devio_facts a, devio_facts b)
{
    assert_int_equal(a.blocks_free, b.blocks_free);
    assert_int_equal(a.blocks_shared, b.blocks_shared);
    assert_int_equal(a.tickets_in_flight, b.tickets_in_flight);
    assert_int_equal(a.logits_live, b.logits_live);
}

static uint32_t seq_len(devio_device *d, uint64_t s)
{
    devio_seq_info info;
    assert_int_equal(devio_seq_info_get(d, s, &info, NULL), DEVIO_OK);
    return info.len;
}

/* A refused submit and a step that fails at sync both leave the device as
 * it was, copy-on-write included; the same step then runs and gives the
 * reference's numbers. */
static void test_faults(void **state)
{
    ctx *c = *state;
    devio_backend_ops ops = stream_ops();
    devio_device *d = open_with(c, &ops, cfg_of(c, DEVIO_NUMERICS_STRICT));
    void *st = captured;
    outcome want[4];
    reference_run(c, NULL, want);
    int32_t tok[9];
    devio_test_tokens(tok, 9, 0, c->vocab);
    uint64_t parent = devio_test_seq(d), t;
    assert_int_equal(launch_one(d, parent, tok, 8, NULL, &t), DEVIO_OK);
    free(await_one(d, t, c->vocab).logits);
    /* Back to 6 tokens and fork: the child shares a partial block, so its
     * next step copies it first. */
    devio_effect e = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = parent, .len = 6};
    devio_outcome o;
    assert_int_equal(devio_apply(d, &e, &o, NULL), DEVIO_OK);
    e = (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = parent};
    assert_int_equal(devio_apply(d, &e, &o, NULL), DEVIO_OK);
    uint64_t child = o.seq;
    devio_facts before = devio_facts_get(d);
    assert_true(before.blocks_shared > 0);

    devio_error err = {0};
    devio_stream_fail(st, 1, 0, false);
    devio_row row = {.seq = child, .tokens = tok + 6, .n_tokens = 2,
                     .logits = DEVIO_LOGITS_LAST};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_DEVICE);
    assert_non_null(strstr(err.message, "injected submit fault"));
    assert_facts_equal(devio_facts_get(d), before);
    assert_int_equal(seq_len(d, child), 6);

    devio_stream_fail(st, 0, 1, false);
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
    assert_true(devio_facts_get(d).blocks_shared < before.blocks_shared);
    devio_step_result r;
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_E_DEVICE);
    assert_non_null(strstr(err.message, "found at sync"));
    assert_facts_equal(devio_facts_get(d), before);
    assert_int_equal(seq_len(d, child), 6);
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_E_TICKET_CONSUMED);

    /* The same step now runs: the child's 8 tokens are the parent's first 8. */
    assert_int_equal(launch_one(d, child, tok + 6, 2, NULL, &t), DEVIO_OK);
    outcome got = await_one(d, t, c->vocab);
    assert_same(&got, &want[0], c->vocab);
    free(got.logits);
    free_outcomes(want, 4);
    devio_teardown(d, NULL);
}

/* A device that breaks for good (a GPU's error): the failed step is undone
 * like any other, the device's info says why from then on (the server turns
 * /readyz unready on it), and every later launch is refused with the reason
 * while nothing is reserved. */
static void test_broken_device(void **state)
{
    ctx *c = *state;
    devio_backend_ops ops = stream_ops();
    devio_device *d = open_with(c, &ops, cfg_of(c, DEVIO_NUMERICS_STRICT));
    void *st = captured;
    devio_device_info info;
    devio_device_info_get(d, &info);
    assert_string_equal(info.failure, "");
    int32_t tok[8];
    devio_test_tokens(tok, 8, 3, c->vocab);
    uint64_t s = devio_test_seq(d), t;
    devio_facts before = devio_facts_get(d);
    devio_stream_fail(st, 0, 1, true);
    devio_error err = {0};
    devio_step_result r;
    assert_int_equal(launch_one(d, s, tok, 8, NULL, &t), DEVIO_OK);
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_E_DEVICE);
    assert_facts_equal(devio_facts_get(d), before);
    devio_device_info_get(d, &info);
    assert_non_null(strstr(info.failure, "found at sync"));
    devio_row row = {.seq = s, .tokens = tok, .n_tokens = 8, .logits = DEVIO_LOGITS_LAST};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_DEVICE);
    assert_non_null(strstr(err.message, "failed earlier"));
    assert_facts_equal(devio_facts_get(d), before);
    assert_int_equal(seq_len(d, s), 0);
    devio_teardown(d, NULL);
}

/* --kv-blocks 0 on a backend that can size its pool (kv_blocks_fit): the
 * pool is what fits, capped at what max_seqs full sequences could use; an
 * explicit --kv-blocks, or a backend that cannot tell (0), keeps the core's
 * choice. */
static uint32_t fit_answer;

static uint32_t fit_blocks(const devio_model *m, const devio_backend_config *cfg)
{
    (void)m;
    assert_non_null(cfg->shape);
    return fit_answer;
}

static void test_kv_blocks_fit(void **state)
{
    ctx *c = *state;
    devio_backend_ops ops = stream_ops();
    ops.kv_blocks_fit = fit_blocks;
    static const struct {
        uint32_t asked, fit, want;
    } cases[] = {
        {0, 37, 37},        /* what fits */
        {0, 1000000, 256},  /* at most 8 sequences of 128 positions in blocks of 4 */
        {0, 0, 0},          /* the backend cannot tell: the core's default */
        {50, 37, 50},       /* asked for: kept */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        devio_config cfg = cfg_of(c, DEVIO_NUMERICS_STRICT);
        cfg.kv_blocks = cases[i].asked;
        cfg.max_seqs = 8;
        fit_answer = cases[i].fit;
        devio_device *d = open_with(c, &ops, cfg);
        uint32_t total = devio_facts_get(d).blocks_total;
        if (cases[i].want)
            assert_int_equal(total, cases[i].want);
        else
            assert_true(total > 0 && total != 37);
        assert_int_equal(devio_config_of(d)->kv_blocks, total);
        devio_teardown(d, NULL);
    }
}

/* Loads, evictions and unloads move the backend's adapter slots in step. */
static void test_adapter_slots(void **state)
{
    ctx *c = *state;
    devio_backend_ops ops = stream_ops();
    devio_device *d = open_with(c, &ops, cfg_of(c, DEVIO_NUMERICS_STRICT));
    void *st = captured;
    devio_adapter_ack ack;
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = "p", .path = "a0"};
    assert_int_equal(devio_adapter_command(d, &cmd, &ack, NULL), DEVIO_OK);
    devio_adapter_ack_free(&ack);
    cmd = (devio_adapter_cmd){.kind = DEVIO_ADAPTER_CMD_LOAD, .name = "q", .path = "a1"};
    assert_int_equal(devio_adapter_command(d, &cmd, &ack, NULL), DEVIO_OK);
    assert_string_equal(ack.evicted, "p");
    devio_adapter_ack_free(&ack);
    devio_stream_stats stats;
    devio_stream_stats_get(st, &stats);
    assert_int_equal(stats.adapters_added, 2);
    assert_int_equal(stats.adapters_removed, 1);
    cmd = (devio_adapter_cmd){.kind = DEVIO_ADAPTER_CMD_UNLOAD, .name = "q"};
    assert_int_equal(devio_adapter_command(d, &cmd, &ack, NULL), DEVIO_OK);
    devio_adapter_ack_free(&ack);
    devio_stream_stats_get(st, &stats);
    assert_int_equal(stats.adapters_removed, 2);
    devio_teardown(d, NULL);
}

/* ---- effects wait for what they touch, no more -------------------------- */

/* A step of one sequence held on the stream: sampling, reading and
 * releasing another step's logits, freeing, forking and truncating other
 * sequences all answer while it waits, and its answer is then the same. */
static void test_effects_pass_held_steps(void **state)
{
    ctx *c = *state;
    devio_backend_ops ops = stream_ops();
    devio_device *d = open_with(c, &ops, cfg_of(c, DEVIO_NUMERICS_STRICT));
    void *st = captured;
    uint64_t s[3] = {devio_test_seq(d), devio_test_seq(d), devio_test_seq(d)};
    int32_t tok[9];
    devio_test_tokens(tok, 9, 3, c->vocab);
    devio_error err = {0};
    uint64_t t0, t1;
    devio_step_result r;
    assert_int_equal(launch_one(d, s[0], tok, 9, NULL, &t0), DEVIO_OK);
    assert_int_equal(devio_await(d, t0, -1, &r, &err), DEVIO_OK);
    uint64_t handle = r.rows[0].logits;
    devio_step_result_free(&r);
    /* s[2] gets a length, so that fork and truncate have work. */
    assert_int_equal(launch_one(d, s[2], tok, 9, NULL, &t0), DEVIO_OK);
    assert_int_equal(devio_await(d, t0, -1, &r, &err), DEVIO_OK);
    uint64_t handle2 = r.rows[0].logits;
    devio_step_result_free(&r);
    /* The stream holds the next step until a second one is queued (5 s at most). */
    devio_stream_hold(st, 2);
    assert_int_equal(launch_one(d, s[1], tok, 9, NULL, &t1), DEVIO_OK);
    devio_effect e[] = {
        {.kind = DEVIO_EFFECT_SAMPLE, .logits = handle, .params = {.temperature = 0, .top_p = 1}},
        {.kind = DEVIO_EFFECT_FORK, .seq = s[2]},
        {.kind = DEVIO_EFFECT_TRUNCATE, .seq = s[2], .len = 4},
        {.kind = DEVIO_EFFECT_RELEASE, .logits = handle},
        {.kind = DEVIO_EFFECT_FREE, .seq = s[2]},
    };
    float row[512];
    assert_true(c->vocab <= 512);
    assert_int_equal(devio_logits_read(d, handle2, 0, 1, row, NULL, &err), DEVIO_OK);
    for (size_t i = 0; i < sizeof e / sizeof *e; i++) {
        devio_outcome o;
        devio_status got = devio_apply(d, &e[i], &o, &err);
        if (got != DEVIO_OK)
            fail_msg("effect %zu: %s", i, err.message);
        if (e[i].kind == DEVIO_EFFECT_FREE)
            assert_int_equal(o.freed_logits, 1); /* handle2 went with s[2] */
        devio_outcome_free(&o);
    }
    /* An effect on the held step's sequence is refused busy, at once. */
    devio_effect busy = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = s[1], .len = 0};
    devio_outcome o;
    assert_int_equal(devio_apply(d, &busy, &o, &err), DEVIO_E_SEQ_BUSY);
    /* None of it waited for the held step. */
    devio_stream_stats stats;
    devio_stream_stats_get(st, &stats);
    assert_int_equal(stats.hold_timeouts, 0);
    assert_int_equal(devio_await(d, t1, 0, &r, &err), DEVIO_E_TICKET_PENDING);
    /* A second step meets the hold: both run. */
    uint64_t t2;
    assert_int_equal(launch_one(d, s[0], tok, 1, NULL, &t2), DEVIO_OK);
    assert_int_equal(devio_await(d, t1, -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    assert_int_equal(devio_await(d, t2, -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    devio_stream_stats_get(st, &stats);
    assert_int_equal(stats.hold_timeouts, 0);
    assert_int_equal(stats.held, 1);
    devio_teardown(d, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_plugin_device),
        cmocka_unit_test(test_cpu_backend),
        cmocka_unit_test(test_overlap_strict),
        cmocka_unit_test(test_overlap_fast),
        cmocka_unit_test(test_overlap_sync),
        cmocka_unit_test(test_overlap_lora),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_broken_device),
        cmocka_unit_test(test_kv_blocks_fit),
        cmocka_unit_test(test_adapter_slots),
        cmocka_unit_test(test_effects_pass_held_steps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
