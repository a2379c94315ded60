/* core_test.c - the device core: KV pool, launch/await, effects, limits, invariances.
 * Drives the real core over the reference backend and a written tiny model.
 * long because every case drives the same opened device, through the fixture and helpers at the top. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "device/backend/backend.h"
#include "ref/ref_backend.h"
#include "device/core/core.h"
#include "device/core/kv_pool.h"
#include "tools/mkmodel/mkmodel.h"
#include "tests/testutil.h"

typedef struct ctx {
    devio_fixture fx;
    uint32_t vocab;
} ctx;

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    if (!c || devio_fixture_preset(&c->fx, "tiny", DEVIO_F32, 7) != 0)
        return -1;
    c->vocab = c->fx.model->cfg.vocab_size;
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

static devio_device *open_dev(ctx *c, devio_config cfg)
{
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(c->fx.model, &devio_ref_backend, &cfg, &d, &err), DEVIO_OK);
    return d;
}

static devio_config small_cfg(void)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = 64;
    cfg.block_size = 4;
    cfg.max_seq_len = 128;
    cfg.threads = 1;
    return cfg;
}

static void assert_facts_equal(const devio_facts *a, const devio_facts *b)
{
    assert_int_equal(a->block_size, b->block_size);
    assert_int_equal(a->blocks_total, b->blocks_total);
    assert_int_equal(a->blocks_free, b->blocks_free);
    assert_int_equal(a->blocks_shared, b->blocks_shared);
    assert_int_equal(a->ssm_slots_used, b->ssm_slots_used);
    assert_int_equal(a->ssm_snapshots_used, b->ssm_snapshots_used);
    assert_int_equal(a->tickets_in_flight, b->tickets_in_flight);
    assert_int_equal(a->logits_live, b->logits_live);
    assert_int_equal(a->adapters_loaded, b->adapters_loaded);
    assert_int_equal(a->epoch, b->epoch);
}

/* ---- KV pool ------------------------------------------------------------ */

static void test_kv_pool(void **state)
{
    (void)state;
    devio_kv_pool p;
    assert_int_equal(devio_kv_pool_init(&p, 3), DEVIO_OK);
    uint32_t a = devio_kv_pool_take(&p), b = devio_kv_pool_take(&p);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(p.n_free, 1);
    devio_kv_pool_ref(&p, a);
    assert_true(devio_kv_pool_is_shared(&p, a));
    assert_int_equal(p.n_shared, 1);
    assert_false(devio_kv_pool_unref(&p, a));
    assert_int_equal(p.n_shared, 0);
    assert_true(devio_kv_pool_unref(&p, a));
    assert_int_equal(p.n_free, 2);
    assert_int_equal(devio_kv_pool_take(&p), a); /* most recently freed first */
    devio_kv_pool_fini(&p);
}

/* ---- launch, await, facts ------------------------------------------------ */

static void test_launch_await_facts(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(c, small_cfg());
    uint64_t s = devio_test_seq(d);
    int32_t tok[6];
    devio_test_tokens(tok, 6, 1, c->vocab);
    devio_row row = {.seq = s, .tokens = tok, .n_tokens = 6, .logits = DEVIO_LOGITS_ALL};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t t;
    assert_int_equal(devio_launch(d, &plan, &t, NULL), DEVIO_OK);
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.tickets_in_flight, 1);
    assert_int_equal(f.blocks_free, 64 - 2);
    assert_int_equal(f.logits_live, 1);
    devio_seq_info info;
    assert_int_equal(devio_seq_info_get(d, s, &info, NULL), DEVIO_OK);
    assert_int_equal(info.busy_ticket, t);
    devio_step_result r;
    assert_int_equal(devio_await(d, t, -1, &r, NULL), DEVIO_OK);
    assert_int_equal(r.n_rows, 1);
    assert_int_equal(r.rows[0].len, 6);
    assert_true(r.rows[0].logits != 0);
    uint32_t n_rows = 0;
    assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, 0, NULL, &n_rows, NULL), DEVIO_OK);
    assert_int_equal(n_rows, 6);
    devio_error err = {0};
    devio_step_result r2;
    assert_int_equal(devio_await(d, t, -1, &r2, &err), DEVIO_E_TICKET_CONSUMED);
    assert_int_equal(r2.n_rows, 0);
    assert_int_equal(devio_await(d, t + 100, -1, &r2, &err), DEVIO_E_UNKNOWN_TICKET);
    f = devio_facts_get(d);
    assert_int_equal(f.tickets_in_flight, 0);
    assert_int_equal(f.ssm_slots_total, 0);
    assert_int_equal(f.epoch, 1);
    devio_step_result_free(&r);
    devio_teardown(d, NULL);
}

/* What the on_settled hook saw: ticket ids in call order. */
typedef struct settled_log {
    pthread_mutex_t mu;
    uint64_t ids[8];
    uint32_t n;
} settled_log;

static void on_settled(void *ctx, uint64_t ticket)
{
    settled_log *l = ctx;
    pthread_mutex_lock(&l->mu);
    if (l->n < 8)
        l->ids[l->n] = ticket;
    l->n++;
    pthread_mutex_unlock(&l->mu);
}

static uint32_t settled_count(settled_log *l)
{
    pthread_mutex_lock(&l->mu);
    uint32_t n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* The worker calls on_settled once per step, in launch order, and only once
 * the step has settled: an await of the ticket then answers without waiting. */
static void test_on_settled_hook(void **state)
{
    ctx *c = *state;
    settled_log log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    devio_config cfg = small_cfg();
    cfg.use_worker_thread = true;
    cfg.on_settled = on_settled;
    cfg.on_settled_ctx = &log;
    devio_device *d = open_dev(c, cfg);
    uint64_t s[2] = {devio_test_seq(d), devio_test_seq(d)}, t[2];
    int32_t tok[4];
    devio_test_tokens(tok, 4, 3, c->vocab);
    for (int i = 0; i < 2; i++) {
        devio_row row = {.seq = s[i], .tokens = tok, .n_tokens = 4};
        devio_plan plan = {.rows = &row, .n_rows = 1};
        assert_int_equal(devio_launch(d, &plan, &t[i], NULL), DEVIO_OK);
    }
    for (int spins = 0; settled_count(&log) < 2 && spins < 10000; spins++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000L}, NULL);
    assert_int_equal(settled_count(&log), 2);
    assert_int_equal(log.ids[0], t[0]);
    assert_int_equal(log.ids[1], t[1]);
    for (int i = 0; i < 2; i++) {
        devio_step_result r;
        assert_int_equal(devio_await(d, t[i], 0, &r, NULL), DEVIO_OK);
        devio_step_result_free(&r);
    }
    devio_teardown(d, NULL);
    assert_int_equal(settled_count(&log), 2);
}

static void test_plan_errors_change_nothing(void **state)
{
    ctx *c = *state;
    devio_config cfg = small_cfg();
    cfg.max_rows = 4;
    cfg.max_batch_tokens = 16;
    devio_device *d = open_dev(c, cfg);
    uint64_t s = devio_test_seq(d), s2 = devio_test_seq(d);
    int32_t tok[20];
    devio_test_tokens(tok, 20, 2, c->vocab);
    devio_facts before = devio_facts_get(d);
    devio_error err;
    uint64_t t;
    struct {
        devio_row rows[5];
        uint32_t n;
        devio_status want;
    } cases[] = {
        {{{.seq = s, .tokens = tok, .n_tokens = 0}}, 1, DEVIO_E_INVALID},
        {{{.seq = 999, .tokens = tok, .n_tokens = 1}}, 1, DEVIO_E_UNKNOWN_SEQ},
        {{{.seq = s, .tokens = tok, .n_tokens = 1}, {.seq = s, .tokens = tok, .n_tokens = 1}},
         2, DEVIO_E_INVALID},
        {{{.seq = s, .tokens = tok, .n_tokens = 17}}, 1, DEVIO_E_TOO_LARGE},
        {{{.seq = s, .tokens = tok, .n_tokens = 1}, {.seq = s2, .tokens = tok, .n_tokens = 1},
          {.seq = s, .tokens = tok, .n_tokens = 1}, {.seq = s, .tokens = tok, .n_tokens = 1},
          {.seq = s, .tokens = tok, .n_tokens = 1}},
         5, DEVIO_E_TOO_LARGE},
        {{{.seq = s, .tokens = tok, .n_tokens = 1, .adapter = "nope"}}, 1,
         DEVIO_E_UNKNOWN_ADAPTER},
        {{{.seq = s, .tokens = tok, .n_tokens = 1, .has_sample = true,
           .sample = {.temperature = -1, .top_p = 1}}},
         1, DEVIO_E_INVALID},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        devio_plan plan = {.rows = cases[i].rows, .n_rows = cases[i].n};
        memset(&err, 0, sizeof err);
        assert_int_equal(devio_launch(d, &plan, &t, &err), cases[i].want);
        assert_int_equal(err.status, cases[i].want);
        assert_true(err.message[0] != '\0');
    }
    int32_t bad = (int32_t)c->vocab;
    devio_row row = {.seq = s, .tokens = &bad, .n_tokens = 1};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_INVALID);
    bad = -1;
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_INVALID);
    devio_facts after = devio_facts_get(d);
    assert_facts_equal(&before, &after);
    devio_seq_info info;
    assert_int_equal(devio_seq_info_get(d, s, &info, NULL), DEVIO_OK);
    assert_int_equal(info.len, 0);
    devio_teardown(d, NULL);
}

static void test_max_seq_len(void **state)
{
    ctx *c = *state;
    devio_config cfg = small_cfg();
    cfg.max_seq_len = 8;
    devio_device *d = open_dev(c, cfg);
    uint64_t s = devio_test_seq(d);
    int32_t tok[9];
    devio_test_tokens(tok, 9, 3, c->vocab);
    free(devio_test_step(d, s, tok, 8, DEVIO_SNAP_NONE, DEVIO_OK));
    devio_row row = {.seq = s, .tokens = tok, .n_tokens = 1};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t t;
    devio_error err;
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_TOO_LARGE);
    devio_teardown(d, NULL);
}

static void test_out_of_kv_blocks_changes_nothing(void **state)
{
    ctx *c = *state;
    devio_config cfg = small_cfg();
    cfg.kv_blocks = 5; /* 20 tokens at block_size 4 */
    devio_device *d = open_dev(c, cfg);
    uint64_t a = devio_test_seq(d), b = devio_test_seq(d);
    int32_t tok[24];
    devio_test_tokens(tok, 24, 4, c->vocab);
    free(devio_test_step(d, a, tok, 10, DEVIO_SNAP_NONE, DEVIO_OK)); /* 3 blocks */
    devio_facts before = devio_facts_get(d);
    assert_int_equal(before.blocks_free, 2);
    /* a needs 1 more (10 -> 13), b needs 3: 4 > 2, refused whole. */
    devio_row rows[2] = {{.seq = a, .tokens = tok, .n_tokens = 3, .logits = DEVIO_LOGITS_LAST},
                         {.seq = b, .tokens = tok, .n_tokens = 9, .logits = DEVIO_LOGITS_ALL}};
    devio_plan plan = {.rows = rows, .n_rows = 2};
    uint64_t t;
    devio_error err = {0};
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_OUT_OF_KV_BLOCKS);
    assert_string_equal(err.detail_key, "needed");
    assert_int_equal(err.detail_val, 4);
    devio_facts after = devio_facts_get(d);
    assert_facts_equal(&before, &after);
    devio_seq_info ia, ib;
    devio_seq_info_get(d, a, &ia, NULL);
    devio_seq_info_get(d, b, &ib, NULL);
    assert_int_equal(ia.len, 10);
    assert_int_equal(ia.busy_ticket, 0);
    assert_int_equal(ib.len, 0);
    /* A plan that fits still goes through. */
    plan.n_rows = 1;
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
    devio_step_result r;
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    devio_teardown(d, NULL);
}

static void test_depth_and_busy(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(c, small_cfg());
    assert_int_equal(devio_max_depth(d), 2);
    uint64_t s[3] = {devio_test_seq(d), devio_test_seq(d), devio_test_seq(d)};
    int32_t tok[4];
    devio_test_tokens(tok, 4, 5, c->vocab);
    uint64_t t[3];
    devio_error err = {0};
    for (int i = 0; i < 2; i++) {
        devio_row row = {.seq = s[i], .tokens = tok, .n_tokens = 4};
        devio_plan plan = {.rows = &row, .n_rows = 1};
        assert_int_equal(devio_launch(d, &plan, &t[i], &err), DEVIO_OK);
    }
    devio_row row = {.seq = s[2], .tokens = tok, .n_tokens = 4};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_launch(d, &plan, &t[2], &err), DEVIO_E_DEPTH_EXCEEDED);
    /* A sequence inside an unawaited ticket refuses launches and effects. */
    devio_step_result r;
    assert_int_equal(devio_await(d, t[0], -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    row.seq = s[1];
    assert_int_equal(devio_launch(d, &plan, &t[2], &err), DEVIO_E_SEQ_BUSY);
    devio_effect effects[] = {
        {.kind = DEVIO_EFFECT_FORK, .seq = s[1]},
        {.kind = DEVIO_EFFECT_TRUNCATE, .seq = s[1], .len = 1},
        {.kind = DEVIO_EFFECT_SNAPSHOT, .seq = s[1]},
        {.kind = DEVIO_EFFECT_FREE, .seq = s[1]},
    };
    devio_facts before = devio_facts_get(d);
    for (size_t i = 0; i < 4; i++) {
        devio_outcome o;
        assert_int_equal(devio_apply(d, &effects[i], &o, &err), DEVIO_E_SEQ_BUSY);
    }
    devio_facts after = devio_facts_get(d);
    assert_facts_equal(&before, &after);
    /* Refused effects return at once without waiting for t[1]: wait here. */
    assert_int_equal(devio_await(d, t[1], -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    uint32_t aborted = 9;
    row.seq = s[2];
    assert_int_equal(devio_launch(d, &plan, &t[2], &err), DEVIO_OK);
    devio_teardown(d, &aborted);
    assert_int_equal(aborted, 1);
}

static void test_logits_capacity(void **state)
{
    ctx *c = *state;
    devio_config cfg = small_cfg();
    cfg.logits_handles = 2;
    cfg.logits_rows = 4;
    devio_device *d = open_dev(c, cfg);
    uint64_t s[3] = {devio_test_seq(d), devio_test_seq(d), devio_test_seq(d)};
    int32_t tok[5];
    devio_test_tokens(tok, 5, 6, c->vocab);
    devio_error err = {0};
    uint64_t t;
    devio_step_result r;
    /* 5 rows of logits do not fit in 4. */
    devio_row row = {.seq = s[0], .tokens = tok, .n_tokens = 5, .logits = DEVIO_LOGITS_ALL};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_OUT_OF_LOGITS);
    uint64_t handles[2];
    for (int i = 0; i < 2; i++) {
        row = (devio_row){.seq = s[i], .tokens = tok, .n_tokens = 2, .logits = DEVIO_LOGITS_LAST};
        assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
        assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
        handles[i] = r.rows[0].logits;
        devio_step_result_free(&r);
    }
    assert_int_equal(devio_facts_get(d).logits_live, 2);
    row = (devio_row){.seq = s[2], .tokens = tok, .n_tokens = 1, .logits = DEVIO_LOGITS_LAST};
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_OUT_OF_LOGITS);
    devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = handles[0]};
    devio_outcome o;
    assert_int_equal(devio_apply(d, &rel, &o, &err), DEVIO_OK);
    assert_int_equal(devio_apply(d, &rel, &o, &err), DEVIO_E_UNKNOWN_LOGITS);
    assert_int_equal(devio_facts_get(d).logits_live, 1);
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    devio_teardown(d, NULL);
}

/* A sequence's logits handles are listed with it and freed with it. */
static void test_handles_belong_to_their_sequence(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(c, small_cfg());
    uint64_t s[2] = {devio_test_seq(d), devio_test_seq(d)};
    int32_t tok[5];
    devio_test_tokens(tok, 5, 2, c->vocab);
    devio_error err = {0};
    uint64_t t, h[2];
    devio_step_result r;
    for (int i = 0; i < 2; i++) {
        devio_row row = {.seq = s[i], .tokens = tok, .n_tokens = 3 + (uint32_t)i,
                         .logits = i ? DEVIO_LOGITS_ALL : DEVIO_LOGITS_LAST};
        devio_plan plan = {.rows = &row, .n_rows = 1};
        assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
        assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
        h[i] = r.rows[0].logits;
        devio_step_result_free(&r);
    }
    devio_logits_info l[4];
    uint32_t n = 0;
    assert_int_equal(devio_logits_list(d, l, 4, &n, &err), DEVIO_OK);
    assert_int_equal(n, 2);
    assert_true(l[0].logits == h[0] && l[0].seq == s[0] && l[0].rows == 1 && l[0].pos0 == 2);
    assert_true(l[1].logits == h[1] && l[1].seq == s[1] && l[1].rows == 4 && l[1].pos0 == 0);
    assert_int_equal(l[0].state, DEVIO_LOGITS_READY);
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.logits_live, 2);
    assert_int_equal(f.logits_rows_live, 5);
    devio_effect fr = {.kind = DEVIO_EFFECT_FREE, .seq = s[1]};
    devio_outcome o;
    assert_int_equal(devio_apply(d, &fr, &o, &err), DEVIO_OK);
    assert_int_equal(o.freed_logits, 1);
    f = devio_facts_get(d);
    assert_int_equal(f.logits_live, 1);
    assert_int_equal(f.logits_rows_live, 1);
    devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = h[1]};
    assert_int_equal(devio_apply(d, &rel, &o, &err), DEVIO_E_UNKNOWN_LOGITS);
    /* The sequences left, by id, in the shape of one sequence's info. */
    devio_seq_info q[2];
    assert_int_equal(devio_seq_list(d, q, 2, &n, &err), DEVIO_OK);
    assert_int_equal(n, 1);
    assert_true(q[0].seq == s[0] && q[0].len == 3 && q[0].busy_ticket == 0);
    assert_int_equal(devio_seq_list(d, NULL, 0, &n, &err), DEVIO_OK);
    assert_int_equal(n, 1);
    assert_int_equal(devio_logits_list(d, l, 4, &n, &err), DEVIO_OK);
    assert_int_equal(n, 1);
    assert_int_equal(l[0].logits, h[0]);
    devio_teardown(d, NULL);
}

/* ---- effects ------------------------------------------------------------ */

static void test_fork_cow_truncate_free(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(c, small_cfg());
    int32_t tok[16];
    devio_test_tokens(tok, 16, 8, c->vocab);
    uint64_t a = devio_test_seq(d);
    free(devio_test_step(d, a, tok, 6, DEVIO_SNAP_NONE, DEVIO_OK)); /* blocks: 4 + 2 (partial) */
    devio_outcome o;
    devio_error err = {0};
    devio_effect fork = {.kind = DEVIO_EFFECT_FORK, .seq = a};
    assert_int_equal(devio_apply(d, &fork, &o, &err), DEVIO_OK);
    uint64_t b = o.seq;
    assert_int_equal(o.shared_blocks, 2);
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.blocks_shared, 2);
    assert_int_equal(f.blocks_free, 62);
    /* Both continue with different tokens: b's write copies the partial block. */
    float *la = devio_test_step(d, a, tok + 6, 1, DEVIO_SNAP_NONE, DEVIO_OK);
    f = devio_facts_get(d);
    assert_int_equal(f.blocks_free, 61);
    assert_int_equal(f.blocks_shared, 1);
    float *lb = devio_test_step(d, b, tok + 7, 1, DEVIO_SNAP_NONE, DEVIO_OK);
    /* The same continuations computed on fresh sequences. */
    uint64_t a2 = devio_test_seq(d), b2 = devio_test_seq(d);
    int32_t pa[7], pb[7];
    memcpy(pa, tok, 6 * sizeof *tok);
    memcpy(pb, tok, 6 * sizeof *tok);
    pa[6] = tok[6];
    pb[6] = tok[7];
    float *ra = devio_test_step(d, a2, pa, 7, DEVIO_SNAP_NONE, DEVIO_OK);
    float *rb = devio_test_step(d, b2, pb, 7, DEVIO_SNAP_NONE, DEVIO_OK);
    assert_memory_equal(la, ra, c->vocab * sizeof(float));
    assert_memory_equal(lb, rb, c->vocab * sizeof(float));
    assert_memory_not_equal(la, lb, c->vocab * sizeof(float));
    free(la), free(lb), free(ra), free(rb);

    /* truncate: errors, then effect */
    devio_effect tr = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 99};
    assert_int_equal(devio_apply(d, &tr, &o, &err), DEVIO_E_INVALID);
    tr.len = 3;
    assert_int_equal(devio_apply(d, &tr, &o, &err), DEVIO_OK);
    assert_int_equal(o.freed_blocks, 1); /* a's copied block; the first stays shared */
    devio_seq_info info;
    devio_seq_info_get(d, a, &info, NULL);
    assert_int_equal(info.len, 3);
    assert_int_equal(info.blocks, 1);
    /* truncate then continue equals the fresh computation */
    float *lt = devio_test_step(d, a, tok + 3, 4, DEVIO_SNAP_NONE, DEVIO_OK);
    uint64_t a3 = devio_test_seq(d);
    float *rt = devio_test_step(d, a3, tok, 7, DEVIO_SNAP_NONE, DEVIO_OK);
    assert_memory_equal(lt, rt, c->vocab * sizeof(float));
    free(lt), free(rt);

    devio_effect snap = {.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a};
    assert_int_equal(devio_apply(d, &snap, &o, &err), DEVIO_OK);
    assert_int_equal(o.len, 7);

    uint32_t free_before = devio_facts_get(d).blocks_free;
    devio_effect fr = {.kind = DEVIO_EFFECT_FREE, .seq = b};
    assert_int_equal(devio_apply(d, &fr, &o, &err), DEVIO_OK);
    assert_int_equal(devio_facts_get(d).blocks_free, free_before + o.freed_blocks);
    assert_int_equal(devio_apply(d, &fr, &o, &err), DEVIO_E_UNKNOWN_SEQ);
    assert_int_equal(devio_seq_info_get(d, b, &info, &err), DEVIO_E_UNKNOWN_SEQ);
    devio_effect bad = {.kind = (devio_effect_kind)42};
    assert_int_equal(devio_apply(d, &bad, &o, &err), DEVIO_E_INVALID);
    devio_teardown(d, NULL);
}

static void test_sample_effect_and_fused(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(c, small_cfg());
    uint64_t s = devio_test_seq(d), s2 = devio_test_seq(d);
    int32_t tok[5];
    devio_test_tokens(tok, 5, 9, c->vocab);
    devio_sample_params greedy = {.temperature = 0, .top_p = 1};
    devio_sample_params hot = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 42};
    /* Fused sampling in the step... */
    devio_row rows[2] = {
        {.seq = s, .tokens = tok, .n_tokens = 5, .logits = DEVIO_LOGITS_ALL, .has_sample = true,
         .sample = hot},
        {.seq = s2, .tokens = tok, .n_tokens = 5, .has_sample = true, .sample = greedy},
    };
    devio_plan plan = {.rows = rows, .n_rows = 2};
    uint64_t t;
    devio_error err = {0};
    devio_step_result r;
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
    assert_true(r.rows[0].sampled && r.rows[1].sampled);
    assert_int_equal(r.rows[1].logits, 0);
    /* ...equals the sample effect on the same logits. */
    devio_effect e = {.kind = DEVIO_EFFECT_SAMPLE, .logits = r.rows[0].logits, .has_row = true,
                      .row = 4, .params = hot};
    devio_outcome o;
    assert_int_equal(devio_apply(d, &e, &o, &err), DEVIO_OK);
    assert_int_equal(o.n_tokens, 1);
    assert_int_equal(o.tokens[0], r.rows[0].token);
    assert_true(o.logprobs[0] == r.rows[0].logprob);
    devio_outcome_free(&o);
    e.params = greedy;
    assert_int_equal(devio_apply(d, &e, &o, &err), DEVIO_OK);
    assert_int_equal(o.tokens[0], r.rows[1].token); /* same prefix, greedy */
    devio_outcome_free(&o);
    e.has_row = false;
    assert_int_equal(devio_apply(d, &e, &o, &err), DEVIO_OK);
    assert_int_equal(o.n_tokens, 5);
    devio_outcome_free(&o);
    e.has_row = true;
    e.row = 5;
    assert_int_equal(devio_apply(d, &e, &o, &err), DEVIO_E_INVALID);
    e.row = 0;
    e.params.top_p = 0;
    assert_int_equal(devio_apply(d, &e, &o, &err), DEVIO_E_INVALID);
    e.logits = 999;
    assert_int_equal(devio_apply(d, &e, &o, &err), DEVIO_E_UNKNOWN_LOGITS);
    devio_step_result_free(&r);
    devio_teardown(d, NULL);
}

/* ---- invariances -------------------------------------------------------- */

/* Logits of every position of `n` tokens run as one prefill on a fresh device. */
static float *prefill_all(ctx *c, devio_config cfg, const int32_t *tok, uint32_t n,
                          const uint32_t *chunks, uint32_t n_chunks)
{
    devio_device *d = open_dev(c, cfg);
    uint64_t s = devio_test_seq(d);
    float *out = malloc((size_t)n * c->vocab * sizeof *out);
    uint32_t done = 0;
    for (uint32_t k = 0; done < n; k++) {
        uint32_t m = n_chunks ? chunks[k % n_chunks] : n;
        if (m > n - done)
            m = n - done;
        devio_row row = {.seq = s, .tokens = tok + done, .n_tokens = m,
                         .logits = DEVIO_LOGITS_ALL};
        devio_plan plan = {.rows = &row, .n_rows = 1};
        uint64_t t;
        devio_step_result r;
        assert_int_equal(devio_launch(d, &plan, &t, NULL), DEVIO_OK);
        assert_int_equal(devio_await(d, t, -1, &r, NULL), DEVIO_OK);
        assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, m,
                                           out + (size_t)done * c->vocab, NULL, NULL),
                         DEVIO_OK);
        devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = r.rows[0].logits};
        devio_outcome o;
        assert_int_equal(devio_apply(d, &rel, &o, NULL), DEVIO_OK);
        devio_step_result_free(&r);
        done += m;
    }
    devio_teardown(d, NULL);
    return out;
}

static void test_chunk_and_thread_invariance(void **state)
{
    ctx *c = *state;
    enum { N = 40 };
    int32_t tok[N];
    devio_test_tokens(tok, N, 10, c->vocab);
    devio_config cfg = small_cfg();
    float *ref = prefill_all(c, cfg, tok, N, NULL, 0);
    const uint32_t sizes[] = {1, 7, 16};
    for (int i = 0; i < 3; i++) {
        float *x = prefill_all(c, cfg, tok, N, &sizes[i], 1);
        assert_memory_equal(ref, x, (size_t)N * c->vocab * sizeof(float));
        free(x);
    }
    cfg.threads = 2;
    float *x = prefill_all(c, cfg, tok, N, NULL, 0);
    assert_memory_equal(ref, x, (size_t)N * c->vocab * sizeof(float));
    free(x);
    cfg.use_worker_thread = false;
    x = prefill_all(c, cfg, tok, N, &sizes[1], 1);
    assert_memory_equal(ref, x, (size_t)N * c->vocab * sizeof(float));
    free(x);
    free(ref);
}

static void test_batch_invariance(void **state)
{
    ctx *c = *state;
    devio_config cfg = small_cfg();
    cfg.kv_blocks = 512;
    enum { N = 9 };
    int32_t tok[N];
    devio_test_tokens(tok, N, 11, c->vocab);
    float *alone = prefill_all(c, cfg, tok, N, NULL, 0);

    /* The same row inside a batch of 32 mixed rows: 31 other sequences with
     * their own histories, some prefilling, some decoding. */
    devio_device *d = open_dev(c, cfg);
    uint64_t seqs[32];
    int32_t other[32][24];
    for (int i = 0; i < 32; i++) {
        seqs[i] = devio_test_seq(d);
        devio_test_tokens(other[i], 24, 100 + (uint32_t)i, c->vocab);
        if (i % 3 == 0)
            free(devio_test_step(d, seqs[i], other[i], 1 + (uint32_t)i % 11, DEVIO_SNAP_NONE,
                                 DEVIO_OK));
    }
    devio_row rows[32];
    for (int i = 0; i < 32; i++)
        rows[i] = (devio_row){.seq = seqs[i], .tokens = other[i] + 12,
                              .n_tokens = i % 2 ? 1 : 1 + (uint32_t)i % 12,
                              .logits = i % 4 ? DEVIO_LOGITS_LAST : DEVIO_LOGITS_NONE};
    rows[13] = (devio_row){.seq = seqs[13], .tokens = tok, .n_tokens = N,
                           .logits = DEVIO_LOGITS_ALL};
    devio_seq_info info;
    devio_seq_info_get(d, seqs[13], &info, NULL);
    assert_int_equal(info.len, 0);
    devio_plan plan = {.rows = rows, .n_rows = 32};
    uint64_t t;
    devio_step_result r;
    assert_int_equal(devio_launch(d, &plan, &t, NULL), DEVIO_OK);
    assert_int_equal(devio_await(d, t, -1, &r, NULL), DEVIO_OK);
    float *x = malloc((size_t)N * c->vocab * sizeof *x);
    assert_int_equal(devio_logits_read(d, r.rows[13].logits, 0, N, x, NULL, NULL), DEVIO_OK);
    assert_memory_equal(alone, x, (size_t)N * c->vocab * sizeof(float));
    devio_step_result_free(&r);
    devio_teardown(d, NULL);
    free(x);
    free(alone);
}

/* Depth 2 (two steps in flight, different sequences) gives the numbers of depth 1. */
static void test_depth_invariance(void **state)
{
    ctx *c = *state;
    int32_t ta[12], tb[12];
    devio_test_tokens(ta, 12, 12, c->vocab);
    devio_test_tokens(tb, 12, 13, c->vocab);
    float *res[2][2];
    for (uint32_t depth = 1; depth <= 2; depth++) {
        devio_config cfg = small_cfg();
        cfg.max_depth = depth;
        cfg.threads = 2;
        devio_device *d = open_dev(c, cfg);
        uint64_t a = devio_test_seq(d), b = devio_test_seq(d);
        devio_row ra = {.seq = a, .tokens = ta, .n_tokens = 12, .logits = DEVIO_LOGITS_LAST};
        devio_row rb = {.seq = b, .tokens = tb, .n_tokens = 12, .logits = DEVIO_LOGITS_LAST};
        devio_plan pa = {.rows = &ra, .n_rows = 1}, pb = {.rows = &rb, .n_rows = 1};
        uint64_t t1, t2;
        devio_step_result r1, r2;
        assert_int_equal(devio_launch(d, &pa, &t1, NULL), DEVIO_OK);
        if (depth == 2) {
            assert_int_equal(devio_launch(d, &pb, &t2, NULL), DEVIO_OK);
            assert_int_equal(devio_await(d, t1, -1, &r1, NULL), DEVIO_OK);
        } else {
            assert_int_equal(devio_await(d, t1, -1, &r1, NULL), DEVIO_OK);
            assert_int_equal(devio_launch(d, &pb, &t2, NULL), DEVIO_OK);
        }
        assert_int_equal(devio_await(d, t2, -1, &r2, NULL), DEVIO_OK);
        for (int k = 0; k < 2; k++) {
            res[depth - 1][k] = malloc(c->vocab * sizeof(float));
            devio_step_result *r = k ? &r2 : &r1;
            assert_int_equal(devio_logits_read(d, r->rows[0].logits, 0, 1, res[depth - 1][k],
                                               NULL, NULL),
                             DEVIO_OK);
        }
        devio_step_result_free(&r1);
        devio_step_result_free(&r2);
        devio_teardown(d, NULL);
    }
    for (int k = 0; k < 2; k++) {
        assert_memory_equal(res[0][k], res[1][k], c->vocab * sizeof(float));
        free(res[0][k]);
        free(res[1][k]);
    }
}

/* --kv-blocks 0: 16 full-length sequences, within --kv-memory; --max-seq-len 0: the context
 * the model declares, past the 4096 devio once stopped at. */
static void test_derived_limits(void **state)
{
    ctx *c = *state;
    devio_model_config *mc = &c->fx.model->cfg;
    devio_config cfg = devio_config_default();
    cfg.threads = 1;
    devio_device *d = open_dev(c, cfg);
    assert_int_equal(devio_config_of(d)->max_seq_len, mc->max_position_embeddings);
    assert_int_equal(devio_config_of(d)->kv_blocks, 16 * (mc->max_position_embeddings / 16));
    devio_teardown(d, NULL);
    /* tiny: 2 attention layers x 2 kv heads x 16 x 8 bytes x 16 positions = 8 KiB a block;
     * half that under fast numerics (binary16 K and V). */
    assert_int_equal(devio_kv_block_bytes(mc, 16, false), 8192);
    assert_int_equal(devio_kv_block_bytes(mc, 16, true), 4096);
    cfg.kv_memory_mib = 1;
    d = open_dev(c, cfg);
    assert_int_equal(devio_config_of(d)->kv_blocks, 128);
    devio_teardown(d, NULL);
    /* The same budget under fast numerics (binary16 K and V) holds twice the blocks. */
    devio_config fast = cfg;
    fast.numerics = DEVIO_NUMERICS_FAST;
    devio_error err = {0};
    assert_int_equal(dv_config_check(&fast, c->fx.model, &err), DEVIO_OK);
    assert_int_equal(fast.kv_blocks, 256);
    uint32_t declared = mc->max_position_embeddings;
    mc->max_position_embeddings = 8192; /* only the RoPE tables and the limits read it */
    cfg.kv_memory_mib = 0;
    d = open_dev(c, cfg);
    assert_int_equal(devio_config_of(d)->max_seq_len, 8192);
    /* 16 sequences of 8192 would take 64 MiB, within the 1024 MiB default. */
    assert_int_equal(devio_config_of(d)->kv_blocks, 16 * 512);
    devio_teardown(d, NULL);
    cfg.kv_memory_mib = 5; /* 640 blocks: below 16 sequences, above one */
    d = open_dev(c, cfg);
    assert_int_equal(devio_config_of(d)->kv_blocks, 640);
    devio_teardown(d, NULL);
    mc->max_position_embeddings = declared;
}

static void test_open_rejects_bad_config(void **state)
{
    ctx *c = *state;
    devio_config cfg = devio_config_default();
    cfg.block_size = 0;
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(c->fx.model, &devio_ref_backend, &cfg, &d, &err),
                     DEVIO_E_INVALID);
    assert_null(d);
    cfg = devio_config_default();
    cfg.max_seq_len = 1u << 30;
    assert_int_equal(devio_open(c->fx.model, &devio_ref_backend, &cfg, &d, &err),
                     DEVIO_E_INVALID);
    devio_backend_ops bad = devio_ref_backend;
    bad.abi = 99;
    cfg = devio_config_default();
    assert_int_equal(devio_open(c->fx.model, &bad, &cfg, &d, &err), DEVIO_E_UNSUPPORTED);
    assert_string_equal(devio_status_str(DEVIO_E_OUT_OF_KV_BLOCKS), "out_of_kv_blocks");
    assert_string_equal(devio_status_str((devio_status)999), "unknown_status");
}

static void test_adapter_table_list(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(c, small_cfg());
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LIST};
    devio_adapter_ack ack;
    devio_error err = {0};
    assert_int_equal(devio_adapter_command(d, &cmd, &ack, &err), DEVIO_OK);
    assert_int_equal(ack.n_adapters, 0);
    devio_adapter_ack_free(&ack);
    cmd = (devio_adapter_cmd){.kind = DEVIO_ADAPTER_CMD_PIN, .name = "x"};
    assert_int_equal(devio_adapter_command(d, &cmd, &ack, &err), DEVIO_E_UNKNOWN_ADAPTER);
    devio_teardown(d, NULL);
}

/* ---- adapter table through the device ------------------------------------- */

static void write_adapter(ctx *c, const char *root, const char *name, uint32_t rank, uint64_t seed)
{
    char out[512];
    snprintf(out, sizeof out, "%s/%s", root, name);
    devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
    o.model_dir = c->fx.dir;
    o.out_dir = out;
    o.rank = rank;
    o.alpha = 16;
    o.seed = seed;
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_write_adapter(&o, &err), DEVIO_OK);
}

static devio_status adapter_cmd(devio_device *d, devio_adapter_cmd_kind kind, const char *name,
                             const char *path, bool pin, devio_adapter_ack *ack)
{
    devio_adapter_cmd cmd = {.kind = kind, .name = name, .path = path, .pin = pin};
    devio_error err = {0};
    devio_status s = devio_adapter_command(d, &cmd, ack, &err);
    if (s != DEVIO_OK)
        assert_true(err.message[0] != '\0');
    return s;
}

static void test_lora_commands(void **state)
{
    ctx *c = *state;
    char root[512];
    snprintf(root, sizeof root, "%s/adapters", c->fx.dir);
    write_adapter(c, root, "a", 8, 1);
    write_adapter(c, root, "b", 4, 2);
    write_adapter(c, root, "c", 4, 3);
    write_adapter(c, root, "big", 128, 4);
    devio_config cfg = small_cfg();
    cfg.max_loras = 2;
    cfg.adapters_root = root;
    devio_device *d = open_dev(c, cfg);
    devio_adapter_ack ack;

    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "A", "a", false, &ack), DEVIO_OK);
    assert_int_equal(ack.n_adapters, 1);
    assert_int_equal(ack.adapters[0].rank, 8);
    assert_true(ack.adapters[0].scale == 2.0f);
    assert_string_equal(ack.adapters[0].targets, "q_proj,v_proj");
    assert_int_equal(strlen(ack.adapters[0].sha256), 64);
    assert_int_equal(ack.adapters[0].state, DEVIO_ADAPTER_LOADED);
    assert_int_equal(ack.adapters[0].loaded_ms, 0); /* the store's fields stay 0 */
    devio_adapter_ack_free(&ack);
    /* Same weights again: no change. Other weights under the same name: refused. */
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "A", "a", false, &ack), DEVIO_OK);
    devio_adapter_ack_free(&ack);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "A", "b", false, &ack), DEVIO_E_INVALID);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "X", "big", false, &ack), DEVIO_E_INVALID);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "X", "../a", false, &ack), DEVIO_E_INVALID);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "X", "none", false, &ack), DEVIO_E_INVALID);
    assert_int_equal(devio_facts_get(d).adapters_loaded, 1);

    /* A row of A in an unawaited ticket keeps A from eviction. */
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "B", "b", true, &ack), DEVIO_OK);
    devio_adapter_ack_free(&ack);
    uint64_t s = devio_test_seq(d);
    int32_t tok[3] = {1, 2, 3};
    devio_row row = {.seq = s, .tokens = tok, .n_tokens = 3, .adapter = "A"};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t t;
    assert_int_equal(devio_launch(d, &plan, &t, NULL), DEVIO_OK);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "C", "c", false, &ack),
                     DEVIO_E_ADAPTER_CAPACITY);
    devio_step_result r;
    assert_int_equal(devio_await(d, t, -1, &r, NULL), DEVIO_OK);
    devio_step_result_free(&r);
    /* Now A (unpinned, idle) is the one to go; B is pinned. */
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "C", "c", false, &ack), DEVIO_OK);
    assert_string_equal(ack.evicted, "A");
    devio_adapter_ack_free(&ack);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LIST, NULL, NULL, false, &ack), DEVIO_OK);
    assert_int_equal(ack.n_adapters, 2);
    devio_adapter_ack_free(&ack);
    assert_int_equal(devio_launch(d, &plan, &t, NULL), DEVIO_E_UNKNOWN_ADAPTER);
    /* pin, unpin, unload */
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_PIN, "C", NULL, false, &ack), DEVIO_OK);
    assert_true(ack.adapters[0].pinned);
    devio_adapter_ack_free(&ack);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "A", "a", false, &ack),
                     DEVIO_E_ADAPTER_CAPACITY);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_UNPIN, "B", NULL, false, &ack), DEVIO_OK);
    devio_adapter_ack_free(&ack);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_UNLOAD, "B", NULL, false, &ack), DEVIO_OK);
    assert_int_equal(ack.adapters[0].state, DEVIO_ADAPTER_UNLOADED);
    devio_adapter_ack_free(&ack);
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_UNLOAD, "B", NULL, false, &ack),
                     DEVIO_E_UNKNOWN_ADAPTER);
    assert_int_equal(devio_facts_get(d).adapters_loaded, 1);
    devio_teardown(d, NULL);

    /* Without an adapters root, loading is refused. */
    d = open_dev(c, small_cfg());
    assert_int_equal(adapter_cmd(d, DEVIO_ADAPTER_CMD_LOAD, "A", "a", false, &ack), DEVIO_E_UNSUPPORTED);
    devio_teardown(d, NULL);
    devio_rmtree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_pool),
        cmocka_unit_test(test_launch_await_facts),
        cmocka_unit_test(test_on_settled_hook),
        cmocka_unit_test(test_plan_errors_change_nothing),
        cmocka_unit_test(test_max_seq_len),
        cmocka_unit_test(test_derived_limits),
        cmocka_unit_test(test_out_of_kv_blocks_changes_nothing),
        cmocka_unit_test(test_depth_and_busy),
        cmocka_unit_test(test_logits_capacity),
        cmocka_unit_test(test_handles_belong_to_their_sequence),
        cmocka_unit_test(test_fork_cow_truncate_free),
        cmocka_unit_test(test_sample_effect_and_fused),
        cmocka_unit_test(test_chunk_and_thread_invariance),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_depth_invariance),
        cmocka_unit_test(test_open_rejects_bad_config),
        cmocka_unit_test(test_adapter_table_list),
        cmocka_unit_test(test_lora_commands),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
