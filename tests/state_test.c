/* state_test.c - a sequence's state exported and imported (docs/state.md): a sequence
 * prefilled on one device and continued on another gives, for every following step, the same
 * logits bits as the same steps on one device, across thread counts, block sizes and
 * backends (the reference, the stream test backend), for Llama, Qwen3, Mistral (a sliding
 * window that released blocks), Bamba and Mamba2 (state slots and snapshots), with a fork
 * involved; every refusal leaves both devices as they were. Parked sequences: their blocks
 * and slots given back, refused by steps and effects, restored bit for bit, limits kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_backend.h"
#include "device/status.h"
#include "ref/ref_backend.h"
#include "tests/backend/stream_backend.h"
#include "tests/testutil.h"

typedef struct ctx {
    devio_fixture llama, qwen3, mistral, bamba, mamba2, other;
} ctx;

static int fixture_with(devio_fixture *f, const char *arch, uint64_t seed, uint32_t window)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.arch = arch;
    if (devio_mkmodel_preset("tiny", &o, NULL) != DEVIO_OK)
        return -1;
    o.seed = seed;
    o.sliding_window = window;
    return devio_fixture_make(f, o);
}

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    if (!c || fixture_with(&c->llama, "llama", 41, 0) != 0 ||
        fixture_with(&c->qwen3, "qwen3", 42, 0) != 0 ||
        fixture_with(&c->mistral, "mistral", 43, 6) != 0 ||
        devio_fixture_arch(&c->bamba, "tiny", "bamba", 44) != 0 ||
        devio_fixture_arch(&c->mamba2, "tiny", "mamba2", 45) != 0 ||
        fixture_with(&c->other, "llama", 46, 0) != 0)
        return -1;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    devio_fixture *all[] = {&c->llama, &c->qwen3, &c->mistral, &c->bamba, &c->mamba2, &c->other};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        devio_fixture_free(all[i]);
    free(c);
    return 0;
}

static devio_device *open_on(const devio_fixture *f, const devio_backend_ops *ops,
                             uint32_t threads, uint32_t block_size, uint32_t kv_blocks)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = kv_blocks;
    cfg.block_size = block_size;
    cfg.max_seq_len = 96;
    cfg.threads = threads;
    cfg.ssm_slots = 8;
    cfg.ssm_snapshots = 16;
    cfg.numerics = ops == &devio_cpu_backend ? DEVIO_NUMERICS_FAST : DEVIO_NUMERICS_STRICT;
    devio_device *d = NULL;
    devio_error err = {0};
    if (devio_open(f->model, ops, &cfg, &d, &err) != DEVIO_OK)
        fail_msg("open: %s", err.message);
    return d;
}

static devio_device *open_dev(const devio_fixture *f, uint32_t threads, uint32_t block_size)
{
    return open_on(f, &devio_ref_backend, threads, block_size, 64);
}

static uint32_t vocab_of(const devio_device *d) { return devio_model_of(d)->cfg.vocab_size; }


static uint64_t prefilled(devio_device *d, uint32_t n, uint32_t salt, devio_snapshot snap)
{
    uint64_t s = devio_test_seq(d);
    int32_t tok[64];
    devio_test_tokens(tok, n, salt, vocab_of(d));
    free(devio_test_step(d, s, tok, n, snap, DEVIO_OK));
    return s;
}

static void expect_info(devio_device *a, uint64_t sa, devio_device *b, uint64_t sb)
{
    devio_seq_info ia, ib;
    devio_error err = {0};
    assert_int_equal(devio_seq_info_get(a, sa, &ia, &err), DEVIO_OK);
    assert_int_equal(devio_seq_info_get(b, sb, &ib, &err), DEVIO_OK);
    assert_int_equal(ia.len, ib.len);
    assert_int_equal(ia.ssm_slot, ib.ssm_slot);
}

/* A prompt of 13 on one device, then the state moved to a device with another block size and
 * thread count, and 6 decode steps on both; also a fork's child, which shares blocks. */
static void move_case(const devio_fixture *f, uint32_t bs_from, uint32_t bs_to)
{
    devio_device *a = open_dev(f, 1, bs_from), *b = open_dev(f, 2, bs_to);
    uint64_t sa = prefilled(a, 13, 1, DEVIO_SNAP_NONE);
    uint64_t sb = devio_test_move(a, sa, false, b);
    expect_info(a, sa, b, sb);
    devio_test_steps_alike(a, sa, b, sb, 6, 100);
    devio_effect fork = {.kind = DEVIO_EFFECT_FORK, .seq = sa};
    devio_outcome o;
    devio_error err = {0};
    assert_int_equal(devio_apply(a, &fork, &o, &err), DEVIO_OK);
    uint64_t child_b = devio_test_move(a, o.seq, false, b);
    devio_test_steps_alike(a, o.seq, b, child_b, 3, 200);
    devio_test_steps_alike(a, sa, b, sb, 2, 300);
    devio_teardown(a, NULL);
    devio_teardown(b, NULL);
}

static void test_llama_moves(void **state)
{
    ctx *c = *state;
    move_case(&c->llama, 4, 8);
    move_case(&c->llama, 16, 4);
}

static void test_qwen3_moves(void **state)
{
    ctx *c = *state;
    move_case(&c->qwen3, 8, 8);
}

/* A sliding window of 6 with blocks of 2: after 13 tokens the first blocks are released, and
 * the state holds only the keys from the first one kept. */
static void test_window_moves(void **state)
{
    ctx *c = *state;
    move_case(&c->mistral, 2, 2);
    /* Blocks of 4 cannot start at key 6: refused, nothing held. */
    devio_device *a = open_dev(&c->mistral, 1, 2), *b = open_dev(&c->mistral, 1, 4);
    uint64_t sa = prefilled(a, 11, 2, DEVIO_SNAP_NONE); /* keys from 6 */
    size_t n;
    uint8_t *bytes = devio_test_export(a, sa, false, 4096, &n);
    devio_facts before = devio_facts_get(b);
    uint64_t sb = 0;
    devio_error err = {0};
    assert_int_equal(devio_test_import(b, bytes, n, 4096, 0, &sb, &err), DEVIO_E_UNSUPPORTED);
    assert_non_null(strstr(err.message, "not a whole block"));
    devio_facts after = devio_facts_get(b);
    assert_int_equal(after.blocks_free, before.blocks_free);
    assert_int_equal(after.seqs_live, before.seqs_live);
    free(bytes);
    devio_teardown(a, NULL);
    devio_teardown(b, NULL);
}

/* A hybrid model: the state slot moves, and with `snapshots` every snapshot too, so that a
 * truncate to one of them on the new device continues as on the old. */
static void hybrid_case(const devio_fixture *f)
{
    devio_device *a = open_dev(f, 1, 4), *b = open_dev(f, 2, 8);
    uint64_t sa = prefilled(a, 9, 3, DEVIO_SNAP_EACH);
    uint64_t sb = devio_test_move(a, sa, true, b);
    devio_seq_info ia, ib;
    devio_error err = {0};
    assert_int_equal(devio_seq_info_get(a, sa, &ia, &err), DEVIO_OK);
    assert_int_equal(devio_seq_info_get(b, sb, &ib, &err), DEVIO_OK);
    assert_int_equal(ib.n_snapshots, ia.n_snapshots);
    assert_memory_equal(ib.snapshots, ia.snapshots, ia.n_snapshots * sizeof *ia.snapshots);
    devio_test_steps_alike(a, sa, b, sb, 4, 400);
    devio_effect cut = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = sa, .len = 5};
    devio_outcome o;
    assert_int_equal(devio_apply(a, &cut, &o, &err), DEVIO_OK);
    cut.seq = sb;
    assert_int_equal(devio_apply(b, &cut, &o, &err), DEVIO_OK);
    devio_test_steps_alike(a, sa, b, sb, 3, 500);
    /* Without snapshots the state slot still moves; no snapshot comes along. */
    uint64_t sc = devio_test_move(a, sa, false, b);
    assert_int_equal(devio_seq_info_get(b, sc, &ib, &err), DEVIO_OK);
    assert_int_equal(ib.n_snapshots, 0);
    devio_test_steps_alike(a, sa, b, sc, 2, 600);
    devio_teardown(a, NULL);
    devio_teardown(b, NULL);
}

static void test_bamba_moves(void **state)
{
    ctx *c = *state;
    hybrid_case(&c->bamba);
}

static void test_mamba2_moves(void **state)
{
    ctx *c = *state;
    hybrid_case(&c->mamba2);
}

/* The stream test backend computes the reference's numbers on a thread of its own: a state
 * moves both ways between it and the reference. */
static void test_between_backends(void **state)
{
    ctx *c = *state;
    devio_device *a = open_dev(&c->llama, 1, 4);
    devio_device *b = open_on(&c->llama, &devio_stream_backend, 1, 8, 64);
    uint64_t sa = prefilled(a, 11, 4, DEVIO_SNAP_NONE);
    uint64_t sb = devio_test_move(a, sa, false, b);
    devio_test_steps_alike(a, sa, b, sb, 3, 700);
    uint64_t back = devio_test_move(b, sb, false, a);
    devio_test_steps_alike(b, sb, a, back, 3, 800);
    devio_teardown(a, NULL);
    devio_teardown(b, NULL);
}

/* An empty sequence moves too. */
static void test_empty_moves(void **state)
{
    ctx *c = *state;
    devio_device *a = open_dev(&c->bamba, 1, 4), *b = open_dev(&c->bamba, 1, 4);
    uint64_t sa = devio_test_seq(a);
    uint64_t sb = devio_test_move(a, sa, true, b);
    int32_t tok[5];
    devio_test_tokens(tok, 5, 9, vocab_of(a));
    float *la = devio_test_step(a, sa, tok, 5, DEVIO_SNAP_NONE, DEVIO_OK);
    float *lb = devio_test_step(b, sb, tok, 5, DEVIO_SNAP_NONE, DEVIO_OK);
    assert_memory_equal(la, lb, vocab_of(a) * sizeof *la);
    free(la);
    free(lb);
    devio_teardown(a, NULL);
    devio_teardown(b, NULL);
}

/* An import refused with `want` (and `text` in its message) leaves d's facts as they were. */
static void refused(devio_device *d, const uint8_t *b, size_t n, uint64_t max_bytes,
                    devio_status want, const char *text)
{
    devio_facts before = devio_facts_get(d);
    uint64_t seq = 0;
    devio_error err = {0};
    assert_int_equal(devio_test_import(d, b, n, 97, max_bytes, &seq, &err), want);
    if (!strstr(err.message, text))
        fail_msg("'%s' lacks '%s'", err.message, text);
    devio_facts after = devio_facts_get(d);
    assert_int_equal(after.blocks_free, before.blocks_free);
    assert_int_equal(after.seqs_live, before.seqs_live);
    assert_int_equal(after.ssm_slots_used, before.ssm_slots_used);
    assert_int_equal(after.ssm_snapshots_used, before.ssm_snapshots_used);
}

static void test_refusals(void **state)
{
    ctx *c = *state;
    devio_device *a = open_dev(&c->llama, 1, 4), *b = open_dev(&c->llama, 1, 4);
    uint64_t sa = prefilled(a, 13, 5, DEVIO_SNAP_NONE);
    size_t n;
    uint8_t *good = devio_test_export(a, sa, false, 1 << 20, &n);
    uint8_t *bad = malloc(n + 8);
    assert_non_null(bad);

    /* Another model, other numerics. */
    devio_device *other = open_dev(&c->other, 1, 4);
    refused(other, good, n, 0, DEVIO_E_INVALID, "another model");
    devio_teardown(other, NULL);
    devio_device *fast = open_on(&c->llama, &devio_cpu_backend, 1, 4, 64);
    refused(fast, good, n, 0, DEVIO_E_INVALID, "strict numerics");
    devio_teardown(fast, NULL);
    /* A version it does not read; not a state at all. */
    memcpy(bad, good, n);
    bad[8] = 2;
    refused(b, bad, n, 0, DEVIO_E_INVALID, "version 2");
    memcpy(bad, "NOTSTATE", 8);
    refused(b, bad, n, 0, DEVIO_E_INVALID, "magic");
    /* A byte of a key altered; the body cut short; bytes past its end. */
    memcpy(bad, good, n);
    bad[n / 2] ^= 0x10;
    refused(b, bad, n, 0, DEVIO_E_INVALID, "checksum");
    refused(b, good, n - 40, 0, DEVIO_E_INVALID, "cut short");
    refused(b, good, 100, 0, DEVIO_E_INVALID, "no whole header");
    memcpy(bad, good, n);
    memset(bad + n, 0, 8);
    refused(b, bad, n + 8, 0, DEVIO_E_INVALID, "past the end");
    /* Over the limit; no room in the pool, in the sequence table. */
    refused(b, good, n, n - 1, DEVIO_E_TOO_LARGE, "over the limit");
    devio_device *small = open_on(&c->llama, &devio_ref_backend, 1, 4, 3);
    refused(small, good, n, 0, DEVIO_E_OUT_OF_KV_BLOCKS, "KV blocks");
    devio_teardown(small, NULL);

    /* What was refused left b able to take the same state. */
    uint64_t sb = 0;
    devio_error err = {0};
    assert_int_equal(devio_test_import(b, good, n, 4096, n, &sb, &err), DEVIO_OK);
    devio_test_steps_alike(a, sa, b, sb, 2, 900);
    free(good);
    free(bad);
    devio_teardown(a, NULL);
    devio_teardown(b, NULL);
}

/* A sequence in a ticket not yet awaited is not exported; one being exported takes no step
 * and no effect until the export closes. */
static void test_busy(void **state)
{
    ctx *c = *state;
    devio_device *a = open_dev(&c->llama, 1, 4);
    uint64_t s = prefilled(a, 5, 6, DEVIO_SNAP_NONE);
    int32_t tok = 3;
    devio_row row = {.seq = s, .tokens = &tok, .n_tokens = 1, .logits = DEVIO_LOGITS_NONE};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t t, bytes;
    devio_error err = {0};
    assert_int_equal(devio_launch(a, &plan, &t, &err), DEVIO_OK);
    devio_export *x = NULL;
    assert_int_equal(devio_export_open(a, s, false, &x, &bytes, &err), DEVIO_E_SEQ_BUSY);
    assert_null(x);
    devio_step_result r;
    assert_int_equal(devio_await(a, t, -1, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);

    assert_int_equal(devio_export_open(a, s, false, &x, &bytes, &err), DEVIO_OK);
    assert_int_equal(devio_launch(a, &plan, &t, &err), DEVIO_E_SEQ_BUSY);
    assert_non_null(strstr(err.message, "being exported"));
    devio_effect fr = {.kind = DEVIO_EFFECT_FREE, .seq = s};
    devio_outcome o;
    assert_int_equal(devio_apply(a, &fr, &o, &err), DEVIO_E_SEQ_BUSY);
    devio_export_close(x);
    assert_int_equal(devio_apply(a, &fr, &o, &err), DEVIO_OK);
    assert_int_equal(devio_export_open(a, s, false, &x, &bytes, &err), DEVIO_E_UNKNOWN_SEQ);
    devio_teardown(a, NULL);
}

/* The fingerprint is stable and covers the weights: two models of one config and other
 * weights (another seed) differ. */
static void test_fingerprint(void **state)
{
    ctx *c = *state;
    uint8_t x[32], y[32], z[32];
    devio_model_fingerprint(c->llama.model, x);
    devio_model_fingerprint(c->llama.model, y);
    assert_memory_equal(x, y, 32);
    devio_model_fingerprint(c->other.model, z);
    assert_memory_not_equal(x, z, 32);
}

/* ---- parked sequences ---------------------------------------------------- */

static devio_status effect_on(devio_device *d, devio_effect_kind kind, uint64_t seq,
                              devio_outcome *o)
{
    devio_effect e = {.kind = kind, .seq = seq};
    devio_error err = {0};
    return devio_apply(d, &e, o, &err);
}

/* Parked, its blocks and slots given back (a fork keeps those it shares), refused by steps
 * and effects, then restored: the next steps the same bits as a twin that never moved. */
static void park_case(const devio_fixture *f, bool hybrid)
{
    devio_device *a = open_dev(f, 1, 4), *twin = open_dev(f, 2, 4);
    devio_snapshot snap = hybrid ? DEVIO_SNAP_EACH : DEVIO_SNAP_NONE;
    uint64_t sa = prefilled(a, 13, 7, snap), st = prefilled(twin, 13, 7, snap);
    devio_outcome o;
    assert_int_equal(effect_on(a, DEVIO_EFFECT_FORK, sa, &o), DEVIO_OK);
    uint64_t child = o.seq;
    /* the parent's own blocks past the shared ones */
    devio_test_steps_alike(a, sa, twin, st, 3, 40);
    devio_facts before = devio_facts_get(a);
    assert_int_equal(effect_on(a, DEVIO_EFFECT_PARK, sa, &o), DEVIO_OK);
    devio_facts parked = devio_facts_get(a);
    assert_int_equal(parked.blocks_free - before.blocks_free, o.freed_blocks);
    assert_true(o.freed_blocks > 0 && o.parked_bytes > 0);
    assert_int_equal(parked.seqs_parked, 1);
    assert_int_equal(parked.parked_bytes, o.parked_bytes);
    if (hybrid)
        assert_int_equal(o.freed_snapshots, 13);
    devio_seq_info info;
    devio_error err = {0};
    assert_int_equal(devio_seq_info_get(a, sa, &info, &err), DEVIO_OK);
    assert_true(info.parked);
    assert_int_equal(info.blocks, 0);
    assert_int_equal(info.len, 16);
    int32_t tok = 1;
    assert_null(devio_test_step(a, sa, &tok, 1, DEVIO_SNAP_NONE, DEVIO_E_SEQ_BUSY));
    assert_int_equal(effect_on(a, DEVIO_EFFECT_FORK, sa, &o), DEVIO_E_SEQ_BUSY);
    assert_int_equal(effect_on(a, DEVIO_EFFECT_PARK, sa, &o), DEVIO_E_SEQ_BUSY);
    devio_export *x = NULL;
    uint64_t bytes;
    assert_int_equal(devio_export_open(a, sa, false, &x, &bytes, &err), DEVIO_E_SEQ_BUSY);
    assert_int_equal(effect_on(a, DEVIO_EFFECT_RESTORE, child, &o), DEVIO_E_INVALID);
    /* The child that shares the parent's first blocks goes on as before. */
    free(devio_test_step(a, child, &tok, 1, DEVIO_SNAP_NONE, DEVIO_OK));
    assert_int_equal(effect_on(a, DEVIO_EFFECT_RESTORE, sa, &o), DEVIO_OK);
    assert_int_equal(o.parked_bytes, parked.parked_bytes);
    devio_facts back = devio_facts_get(a);
    assert_int_equal(back.seqs_parked, 0);
    assert_int_equal(back.parked_bytes, 0);
    devio_test_steps_alike(a, sa, twin, st, 3, 50);
    if (hybrid) { /* the snapshots came back too */
        devio_effect cut = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = sa, .len = 6};
        assert_int_equal(devio_apply(a, &cut, &o, &err), DEVIO_OK);
        cut.seq = st;
        assert_int_equal(devio_apply(twin, &cut, &o, &err), DEVIO_OK);
        devio_test_steps_alike(a, sa, twin, st, 2, 60);
    }
    /* A parked sequence freed gives its host bytes back. */
    assert_int_equal(effect_on(a, DEVIO_EFFECT_PARK, sa, &o), DEVIO_OK);
    uint64_t held = o.parked_bytes;
    assert_int_equal(effect_on(a, DEVIO_EFFECT_FREE, sa, &o), DEVIO_OK);
    assert_int_equal(o.parked_bytes, held);
    assert_int_equal(devio_facts_get(a).parked_bytes, 0);
    devio_teardown(a, NULL);
    devio_teardown(twin, NULL);
}

static void test_park_llama(void **state)
{
    ctx *c = *state;
    park_case(&c->llama, false);
    park_case(&c->mistral, false);
}

static void test_park_hybrid(void **state)
{
    ctx *c = *state;
    park_case(&c->bamba, true);
    park_case(&c->mamba2, true);
}

/* A restore that finds no room fails and leaves the sequence parked; parking past
 * --park-memory is refused and leaves the sequence as it was. */
static void test_park_limits(void **state)
{
    ctx *c = *state;
    devio_device *a = open_on(&c->llama, &devio_ref_backend, 1, 4, 12);
    uint64_t s = prefilled(a, 20, 8, DEVIO_SNAP_NONE); /* 5 of the 12 blocks */
    devio_outcome o;
    assert_int_equal(effect_on(a, DEVIO_EFFECT_PARK, s, &o), DEVIO_OK);
    uint64_t filler = prefilled(a, 40, 9, DEVIO_SNAP_NONE); /* 10 blocks: 2 left */
    devio_facts before = devio_facts_get(a);
    assert_int_equal(effect_on(a, DEVIO_EFFECT_RESTORE, s, &o), DEVIO_E_OUT_OF_KV_BLOCKS);
    devio_facts after = devio_facts_get(a);
    assert_int_equal(after.blocks_free, before.blocks_free);
    assert_int_equal(after.seqs_parked, 1);
    assert_int_equal(effect_on(a, DEVIO_EFFECT_FREE, filler, &o), DEVIO_OK);
    assert_int_equal(effect_on(a, DEVIO_EFFECT_RESTORE, s, &o), DEVIO_OK);
    devio_teardown(a, NULL);

    devio_config cfg = devio_config_default();
    cfg.kv_blocks = 2048;
    cfg.block_size = 4;
    cfg.max_seq_len = 96;
    cfg.max_seqs = 64;
    cfg.threads = 1;
    cfg.park_memory_mib = 1;
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(c->llama.model, &devio_ref_backend, &cfg, &d, &err), DEVIO_OK);
    devio_status st = DEVIO_OK;
    uint64_t last = 0;
    for (uint32_t i = 0; i < 60 && st == DEVIO_OK; i++) {
        last = prefilled(d, 64, 10 + i, DEVIO_SNAP_NONE);
        st = effect_on(d, DEVIO_EFFECT_PARK, last, &o);
    }
    assert_int_equal(st, DEVIO_E_TOO_LARGE);
    devio_facts f = devio_facts_get(d);
    assert_true(f.parked_bytes <= (1u << 20) && f.seqs_parked > 0);
    free(devio_test_step(d, last, &(int32_t){3}, 1, DEVIO_SNAP_NONE, DEVIO_OK));
    devio_teardown(d, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_moves),  cmocka_unit_test(test_qwen3_moves),
        cmocka_unit_test(test_window_moves), cmocka_unit_test(test_bamba_moves),
        cmocka_unit_test(test_mamba2_moves), cmocka_unit_test(test_between_backends),
        cmocka_unit_test(test_empty_moves),  cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_busy),         cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_park_llama),   cmocka_unit_test(test_park_hybrid),
        cmocka_unit_test(test_park_limits),
    };
    return devio_run_tests("state", tests, sizeof tests / sizeof *tests, setup, teardown);
}
