/* ssm_core_test.c - the device core's recurrent state on hybrid models: state slots and
 * snapshots, their counters after every plan and effect, every refusal leaving the facts as
 * they were, and the numbers of snapshot/truncate, fork and speculative cycles.
 * Drives the real core over the reference backend and written Bamba and Mamba2 models. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/backend/backend.h"
#include "device/status.h"
#include "ref/ref_backend.h"
#include "tools/mkmodel/mkmodel.h"
#include "tests/testutil.h"

typedef struct ctx {
    devio_fixture bamba, mamba2, llama;
} ctx;

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    if (!c || devio_fixture_arch(&c->bamba, "tiny", "bamba", 31) != 0 ||
        devio_fixture_arch(&c->mamba2, "tiny", "mamba2", 32) != 0 ||
        devio_fixture_arch(&c->llama, "tiny", "llama", 33) != 0)
        return -1;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    devio_fixture_free(&c->bamba);
    devio_fixture_free(&c->mamba2);
    devio_fixture_free(&c->llama);
    free(c);
    return 0;
}

static devio_device *open_dev(const devio_fixture *f, uint32_t slots, uint32_t snaps)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = 64;
    cfg.block_size = 4;
    cfg.max_seq_len = 128;
    cfg.threads = 2;
    cfg.ssm_slots = slots;
    cfg.ssm_snapshots = snaps;
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(f->model, &devio_ref_backend, &cfg, &d, &err), DEVIO_OK);
    return d;
}

static void step_free(devio_device *d, uint64_t seq, const int32_t *tok, uint32_t n,
                      devio_snapshot snap)
{
    free(devio_test_step(d, seq, tok, n, snap, DEVIO_OK));
}

static devio_status apply(devio_device *d, devio_effect e, devio_outcome *o)
{
    devio_error err = {0};
    devio_status s = devio_apply(d, &e, o, &err);
    assert_int_equal(err.status, s == DEVIO_OK ? 0 : s);
    return s;
}

static void expect_used(devio_device *d, uint32_t slots, uint32_t snaps)
{
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.ssm_slots_used, slots);
    assert_int_equal(f.ssm_snapshots_used, snaps);
}

static void expect_snaps(devio_device *d, uint64_t seq, bool slot, uint32_t n, const uint32_t *lens)
{
    devio_seq_info in;
    assert_int_equal(devio_seq_info_get(d, seq, &in, NULL), DEVIO_OK);
    assert_int_equal(in.ssm_slot, slot);
    assert_int_equal(in.n_snapshots, n);
    for (uint32_t i = 0; i < n && i < 8; i++)
        assert_int_equal(in.snapshots[i], lens[i]);
}

static void expect_same_facts(const devio_facts *a, const devio_facts *b)
{
    assert_int_equal(a->blocks_free, b->blocks_free);
    assert_int_equal(a->blocks_shared, b->blocks_shared);
    assert_int_equal(a->ssm_slots_used, b->ssm_slots_used);
    assert_int_equal(a->ssm_snapshots_used, b->ssm_snapshots_used);
    assert_int_equal(a->tickets_in_flight, b->tickets_in_flight);
    assert_int_equal(a->logits_live, b->logits_live);
}

/* ---- counters ------------------------------------------------------------ */

static void test_counters_after_every_effect(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(&c->bamba, 3, 6);
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.ssm_slots_total, 3);
    assert_int_equal(f.ssm_snapshots_total, 6);
    int32_t t[16];
    devio_test_tokens(t, 16, 1, 256);
    devio_outcome o;

    uint64_t a = devio_test_seq(d);
    expect_used(d, 0, 0); /* an empty sequence holds no state */
    /* A snapshot at length 0 takes nothing: the state there is zeros. */
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a}, &o),
                     DEVIO_OK);
    assert_int_equal(o.len, 0);
    expect_used(d, 0, 0);
    step_free(d, a, t, 5, DEVIO_SNAP_NONE);
    expect_used(d, 1, 0);
    expect_snaps(d, a, true, 0, NULL);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a}, &o),
                     DEVIO_OK);
    assert_int_equal(o.len, 5);
    expect_used(d, 1, 1);
    /* Again at the same length: the same snapshot. */
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a}, &o),
                     DEVIO_OK);
    expect_used(d, 1, 1);
    step_free(d, a, t + 5, 2, DEVIO_SNAP_EACH);
    expect_used(d, 1, 3);
    expect_snaps(d, a, true, 3, (const uint32_t[]){5, 6, 7});
    step_free(d, a, t + 7, 3, DEVIO_SNAP_END);
    expect_snaps(d, a, true, 4, (const uint32_t[]){5, 6, 7, 10});

    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o), DEVIO_OK);
    uint64_t child = o.seq;
    expect_used(d, 2, 4);
    expect_snaps(d, child, true, 0, NULL); /* a fork copies no snapshots */

    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 6}, &o),
        DEVIO_OK);
    assert_int_equal(o.freed_snapshots, 2);
    expect_used(d, 2, 2);
    expect_snaps(d, a, true, 2, (const uint32_t[]){5, 6});
    /* Truncating to the current length needs no snapshot. */
    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 6}, &o),
        DEVIO_OK);
    expect_used(d, 2, 2);

    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_RELEASE, .seq = a}, &o),
                     DEVIO_OK);
    assert_int_equal(o.freed_snapshots, 2);
    expect_used(d, 2, 0);
    expect_snaps(d, a, true, 0, NULL);

    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 0}, &o),
        DEVIO_OK);
    expect_used(d, 1, 0);
    expect_snaps(d, a, false, 0, NULL);

    step_free(d, child, t, 1, DEVIO_SNAP_END);
    expect_used(d, 1, 1);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = child}, &o),
                     DEVIO_OK);
    assert_int_equal(o.freed_snapshots, 1);
    expect_used(d, 0, 0);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

/* ---- refusals -------------------------------------------------------------- */

static void test_refusals_change_nothing(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(&c->bamba, 2, 4);
    int32_t t[16];
    devio_test_tokens(t, 16, 2, 256);
    devio_outcome o;
    uint64_t a = devio_test_seq(d), b = devio_test_seq(d), x = devio_test_seq(d);
    step_free(d, a, t, 6, DEVIO_SNAP_END);
    step_free(d, b, t, 3, DEVIO_SNAP_NONE);
    devio_facts before = devio_facts_get(d);

    /* No state slot for a third sequence: the whole plan is refused. */
    devio_row rows[2] = {{.seq = b, .tokens = t, .n_tokens = 1},
                         {.seq = x, .tokens = t, .n_tokens = 2}};
    devio_plan plan = {.rows = rows, .n_rows = 2};
    uint64_t tk;
    devio_error err = {0};
    assert_int_equal(devio_launch(d, &plan, &tk, &err), DEVIO_E_OUT_OF_SSM_SLOTS);
    assert_string_equal(err.detail_key, "needed");
    devio_facts f = devio_facts_get(d);
    expect_same_facts(&before, &f);
    expect_snaps(d, x, false, 0, NULL);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o),
                     DEVIO_E_OUT_OF_SSM_SLOTS);
    f = devio_facts_get(d);
    expect_same_facts(&before, &f);

    /* 3 snapshots are free; "each" over 4 tokens needs 4. */
    devio_test_step(d, b, t, 4, DEVIO_SNAP_EACH, DEVIO_E_OUT_OF_SNAPSHOTS);
    f = devio_facts_get(d);
    expect_same_facts(&before, &f);
    step_free(d, b, t, 3, DEVIO_SNAP_EACH);
    expect_used(d, 2, 4);
    before = devio_facts_get(d);
    devio_test_step(d, a, t, 1, DEVIO_SNAP_END, DEVIO_E_OUT_OF_SNAPSHOTS);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a}, &o),
                     DEVIO_OK); /* length 6 has one already */
    step_free(d, a, t, 1, DEVIO_SNAP_NONE);
    before = devio_facts_get(d);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a}, &o),
                     DEVIO_E_OUT_OF_SNAPSHOTS);
    f = devio_facts_get(d);
    expect_same_facts(&before, &f);

    /* Truncate to a length without a snapshot: nothing changes. */
    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 3}, &o),
        DEVIO_E_NO_SNAPSHOT);
    devio_seq_info in;
    assert_int_equal(devio_seq_info_get(d, a, &in, NULL), DEVIO_OK);
    assert_int_equal(in.len, 7);
    f = devio_facts_get(d);
    expect_same_facts(&before, &f);

    /* release names a handle or a sequence, not both, not neither. */
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_RELEASE}, &o),
                     DEVIO_E_INVALID);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_RELEASE, .seq = a, .logits = 1},
                           &o),
                     DEVIO_E_INVALID);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_RELEASE, .seq = 999}, &o),
                     DEVIO_E_UNKNOWN_SEQ);
    /* A busy sequence refuses it. */
    devio_row r1 = {.seq = a, .tokens = t, .n_tokens = 1};
    devio_plan p1 = {.rows = &r1, .n_rows = 1};
    assert_int_equal(devio_launch(d, &p1, &tk, &err), DEVIO_OK);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_RELEASE, .seq = a}, &o),
                     DEVIO_E_SEQ_BUSY);
    devio_step_result r;
    assert_int_equal(devio_await(d, tk, -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

/* ---- numbers ------------------------------------------------------------------ */

static void expect_same_logits(float *a, float *b)
{
    assert_memory_equal(a, b, 256 * sizeof(float));
    free(a);
    free(b);
}

/* Snapshot, go on, truncate back, go on differently: equal to a fresh
 * sequence fed the kept tokens; and a fork diverging from its parent. */
static void check_restore_and_fork(const devio_fixture *fx)
{
    devio_device *d = open_dev(fx, 0, 0);
    int32_t t[24], u[24];
    devio_test_tokens(t, 24, 3, 256);
    devio_test_tokens(u, 24, 4, 256);
    devio_outcome o;
    uint64_t a = devio_test_seq(d);
    step_free(d, a, t, 9, DEVIO_SNAP_END);
    step_free(d, a, t + 9, 5, DEVIO_SNAP_NONE);
    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 9}, &o),
        DEVIO_OK);
    float *got = devio_test_step(d, a, u, 4, DEVIO_SNAP_NONE, DEVIO_OK);
    uint64_t fresh = devio_test_seq(d);
    step_free(d, fresh, t, 9, DEVIO_SNAP_NONE);
    expect_same_logits(got, devio_test_step(d, fresh, u, 4, DEVIO_SNAP_NONE, DEVIO_OK));

    /* Fork at 13, then parent and child continue differently. */
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o), DEVIO_OK);
    uint64_t child = o.seq;
    float *pc = devio_test_step(d, a, t + 3, 3, DEVIO_SNAP_NONE, DEVIO_OK);
    float *cc = devio_test_step(d, child, u + 7, 2, DEVIO_SNAP_NONE, DEVIO_OK);
    expect_same_logits(pc, devio_test_step(d, fresh, t + 3, 3, DEVIO_SNAP_NONE, DEVIO_OK));
    uint64_t f2 = devio_test_seq(d);
    step_free(d, f2, t, 9, DEVIO_SNAP_NONE);
    step_free(d, f2, u, 4, DEVIO_SNAP_NONE);
    expect_same_logits(cc, devio_test_step(d, f2, u + 7, 2, DEVIO_SNAP_NONE, DEVIO_OK));
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

/* k = 4 drafts with a snapshot after each, accept 2, truncate, continue:
 * bit for bit what decoding only the accepted tokens gives. */
static void check_speculative_cycle(const devio_fixture *fx)
{
    devio_device *d = open_dev(fx, 0, 0);
    int32_t t[32];
    devio_test_tokens(t, 32, 5, 256);
    devio_outcome o;
    uint64_t s = devio_test_seq(d), ref = devio_test_seq(d);
    step_free(d, s, t, 11, DEVIO_SNAP_NONE);
    step_free(d, ref, t, 11, DEVIO_SNAP_NONE);
    int32_t drafts[4] = {t[11], t[12], 77, 78};
    step_free(d, s, drafts, 4, DEVIO_SNAP_EACH);
    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = s, .len = 13}, &o),
        DEVIO_OK);
    assert_int_equal(o.freed_snapshots, 2);
    float *got = devio_test_step(d, s, t + 13, 1, DEVIO_SNAP_NONE, DEVIO_OK);
    step_free(d, ref, t + 11, 1, DEVIO_SNAP_NONE);
    step_free(d, ref, t + 12, 1, DEVIO_SNAP_NONE);
    expect_same_logits(got, devio_test_step(d, ref, t + 13, 1, DEVIO_SNAP_NONE, DEVIO_OK));
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

static void test_numbers_bamba(void **state)
{
    ctx *c = *state;
    check_restore_and_fork(&c->bamba);
    check_speculative_cycle(&c->bamba);
}

static void test_numbers_mamba2(void **state)
{
    ctx *c = *state;
    check_restore_and_fork(&c->mamba2);
    check_speculative_cycle(&c->mamba2);
}

/* The reference, whose wait fails (after computing) when fail_next is set:
 * a step that ran and then failed, as a broken device's would. */
static bool fail_next;
static devio_backend_ops flaky;

static devio_status flaky_wait(void *state, const devio_batch *b, devio_error *err)
{
    devio_status s = devio_ref_backend.wait(state, b, err);
    if (s == DEVIO_OK && fail_next) {
        fail_next = false;
        s = devio_fail(err, DEVIO_E_DEVICE, "injected failure after the step ran");
    }
    return s;
}

/* A failed step leaves the state lost: launches and snapshots are refused
 * until a truncate restores a snapshot (at the current length too) or goes
 * to 0; then the numbers are a fresh sequence's. */
static void test_state_lost_after_failed_step(void **state)
{
    ctx *c = *state;
    flaky = devio_ref_backend;
    flaky.wait = flaky_wait;
    devio_config cfg = devio_config_default();
    cfg.threads = 1;
    devio_device *d = NULL;
    assert_int_equal(devio_open(c->bamba.model, &flaky, &cfg, &d, NULL), DEVIO_OK);
    int32_t t[16];
    devio_test_tokens(t, 16, 7, 256);
    devio_outcome o;
    uint64_t a = devio_test_seq(d), fresh = devio_test_seq(d);
    step_free(d, a, t, 6, DEVIO_SNAP_END);
    fail_next = true;
    devio_row row = {.seq = a, .tokens = t + 6, .n_tokens = 2};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t tk;
    devio_step_result r;
    assert_int_equal(devio_launch(d, &plan, &tk, NULL), DEVIO_OK);
    assert_int_equal(devio_await(d, tk, -1, &r, NULL), DEVIO_E_DEVICE);
    devio_seq_info in;
    assert_int_equal(devio_seq_info_get(d, a, &in, NULL), DEVIO_OK);
    assert_int_equal(in.len, 6); /* undone */
    devio_test_step(d, a, t + 6, 1, DEVIO_SNAP_NONE, DEVIO_E_DEVICE);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o),
                     DEVIO_E_DEVICE);
    /* The snapshot at the current length brings the state back. */
    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 6}, &o),
        DEVIO_OK);
    float *got = devio_test_step(d, a, t + 6, 2, DEVIO_SNAP_NONE, DEVIO_OK);
    step_free(d, fresh, t, 6, DEVIO_SNAP_NONE);
    expect_same_logits(got, devio_test_step(d, fresh, t + 6, 2, DEVIO_SNAP_NONE, DEVIO_OK));
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

/* Derived pool sizes: at most max_seqs slots, 4 snapshots per slot. */
static void test_derived_pools(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(&c->mamba2, 0, 0);
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.ssm_slots_total, devio_config_default().max_seqs);
    assert_int_equal(f.ssm_snapshots_total, 4 * f.ssm_slots_total);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

/* Attention-only models: the snapshot fields and effects hold nothing. */
static void test_attention_only_holds_nothing(void **state)
{
    ctx *c = *state;
    devio_device *d = open_dev(&c->llama, 0, 0);
    int32_t t[8];
    devio_test_tokens(t, 8, 6, 256);
    devio_outcome o;
    uint64_t a = devio_test_seq(d);
    step_free(d, a, t, 6, DEVIO_SNAP_EACH);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_SNAPSHOT, .seq = a}, &o),
                     DEVIO_OK);
    assert_int_equal(apply(d, (devio_effect){.kind = DEVIO_EFFECT_RELEASE, .seq = a}, &o),
                     DEVIO_OK);
    assert_int_equal(o.freed_snapshots, 0);
    assert_int_equal(
        apply(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 2}, &o),
        DEVIO_OK);
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.ssm_slots_total, 0);
    assert_int_equal(f.ssm_snapshots_total, 0);
    expect_snaps(d, a, false, 0, NULL);
    assert_int_equal(devio_teardown(d, NULL), DEVIO_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counters_after_every_effect),
        cmocka_unit_test(test_refusals_change_nothing),
        cmocka_unit_test(test_numbers_bamba),
        cmocka_unit_test(test_numbers_mamba2),
        cmocka_unit_test(test_state_lost_after_failed_step),
        cmocka_unit_test(test_derived_pools),
        cmocka_unit_test(test_attention_only_holds_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
