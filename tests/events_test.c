/* events_test.c - the device's events (devio.h, docs/state.md): sequence events in order, a
 * stored block for every block a step fills with the prefix hash a router computes from the
 * tokens alone, and a removed block for every stored one that goes back to the pool or is
 * about to be rewritten, through forks, copy-on-write, truncates, parks, imports and frees;
 * and over a random run of all of them, every removed block one that was stored, none left
 * stored once every sequence is freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/status.h"
#include "ref/ref_backend.h"
#include "tests/testutil.h"

#define MAX_EVENTS 4096
#define BLOCKS 64

typedef struct log_t {
    devio_event ev[MAX_EVENTS];
    uint32_t n;
    bool stored[BLOCKS];
    uint64_t hash[BLOCKS];
    uint32_t n_stored;
} log_t;

/* Keeps every event and checks the stored set as it goes: a block is stored once, and only
 * a stored block is removed, with the hash it was stored with. */
static void on_event(void *ctx, const devio_event *e)
{
    log_t *l = ctx;
    assert_true(l->n < MAX_EVENTS);
    l->ev[l->n] = *e;
    l->ev[l->n].name = NULL;
    l->n++;
    if (e->kind == DEVIO_EVENT_BLOCK_STORED) {
        assert_false(l->stored[e->block]);
        l->stored[e->block] = true;
        l->hash[e->block] = e->prefix_hash;
        l->n_stored++;
    } else if (e->kind == DEVIO_EVENT_BLOCK_REMOVED) {
        assert_true(l->stored[e->block]);
        assert_true(l->hash[e->block] == e->prefix_hash);
        l->stored[e->block] = false;
        l->n_stored--;
    }
}

static int setup(void **state)
{
    devio_fixture *f = calloc(1, sizeof *f);
    if (!f || devio_fixture_arch(f, "tiny", "llama", 51) != 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    devio_fixture_free(*state);
    free(*state);
    return 0;
}

static devio_device *open_logged(const devio_fixture *f, log_t *l)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = BLOCKS;
    cfg.block_size = 4;
    cfg.max_seq_len = 96;
    cfg.threads = 1;
    cfg.on_event = on_event;
    cfg.on_event_ctx = l;
    devio_device *d = NULL;
    devio_error err = {0};
    if (devio_open(f->model, &devio_ref_backend, &cfg, &d, &err) != DEVIO_OK)
        fail_msg("open: %s", err.message);
    return d;
}

static void step(devio_device *d, uint64_t s, const int32_t *tok, uint32_t n)
{
    free(devio_test_step(d, s, tok, n, DEVIO_SNAP_NONE, DEVIO_OK));
}

static devio_status apply(devio_device *d, devio_effect_kind kind, uint64_t seq, uint32_t len,
                          devio_outcome *o)
{
    devio_effect e = {.kind = kind, .seq = seq, .len = len};
    devio_error err = {0};
    return devio_apply(d, &e, o, &err);
}

/* The events from index *at on, which must be exactly these kinds; *at moves past them. */
static const devio_event *expect(const log_t *l, uint32_t *at, const devio_event_kind *kinds,
                                 uint32_t n)
{
    if (l->n - *at != n)
        fail_msg("%u events, expected %u", l->n - *at, n);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(l->ev[*at + i].kind, kinds[i]);
    const devio_event *first = &l->ev[*at];
    *at += n;
    return first;
}

static void test_events_in_order(void **state)
{
    log_t *l = calloc(1, sizeof *l);
    devio_device *d = open_logged(*state, l);
    uint32_t at = 0;
    uint64_t a = devio_test_seq(d);
    expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_SEQ_CREATED}, 1);
    int32_t tok[16];
    devio_test_tokens(tok, 16, 3, devio_model_of(d)->cfg.vocab_size);
    step(d, a, tok, 10); /* blocks 0 and 1 full, block 2 half */
    const devio_event *e =
        expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_BLOCK_STORED, DEVIO_EVENT_BLOCK_STORED}, 2);
    uint64_t h0 = devio_prefix_hash(0, tok, 4), h1 = devio_prefix_hash(h0, tok + 4, 4);
    assert_true(e[0].prefix_hash == h0 && e[0].prefix_len == 4 && e[0].seq == a);
    assert_true(e[1].prefix_hash == h1 && e[1].prefix_len == 8);

    devio_outcome o;
    assert_int_equal(apply(d, DEVIO_EFFECT_FORK, a, 0, &o), DEVIO_OK);
    uint64_t c = o.seq;
    e = expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_SEQ_CREATED}, 1);
    assert_true(e->seq == c && e->parent == a);
    /* The child fills the shared half block by copy-on-write: a block of its own, stored. */
    step(d, c, tok + 10, 2);
    e = expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_BLOCK_STORED}, 1);
    assert_true(e->seq == c && e->prefix_len == 12);
    assert_true(e->prefix_hash == devio_prefix_hash(h1, tok + 8, 4));
    uint32_t child_block = e->block;
    /* The parent truncated inside block 1, which the child shares: nothing leaves yet. */
    assert_int_equal(apply(d, DEVIO_EFFECT_TRUNCATE, a, 6, &o), DEVIO_OK);
    expect(l, &at, NULL, 0);
    /* The child freed: its own block leaves; block 1 is the parent's alone now, and the
     * parent's next step rewrites it in place, so it leaves then. */
    assert_int_equal(apply(d, DEVIO_EFFECT_FREE, c, 0, &o), DEVIO_OK);
    e = expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_BLOCK_REMOVED, DEVIO_EVENT_SEQ_FREED}, 2);
    assert_int_equal(e->block, child_block);
    step(d, a, tok + 6, 2);
    e = expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_BLOCK_REMOVED, DEVIO_EVENT_BLOCK_STORED},
               2);
    assert_true(e[0].prefix_hash == h1 && e[1].prefix_hash == h1); /* the same tokens again */
    /* Parked: both its blocks leave; restored: stored again, with the same hashes. */
    assert_int_equal(apply(d, DEVIO_EFFECT_PARK, a, 0, &o), DEVIO_OK);
    expect(l, &at,
           (devio_event_kind[]){DEVIO_EVENT_BLOCK_REMOVED, DEVIO_EVENT_BLOCK_REMOVED,
                                DEVIO_EVENT_SEQ_PARKED},
           3);
    assert_int_equal(apply(d, DEVIO_EFFECT_RESTORE, a, 0, &o), DEVIO_OK);
    e = expect(l, &at,
               (devio_event_kind[]){DEVIO_EVENT_BLOCK_STORED, DEVIO_EVENT_BLOCK_STORED,
                                    DEVIO_EVENT_SEQ_RESTORED},
               3);
    assert_true(e[0].prefix_hash == h0 && e[1].prefix_hash == h1);
    /* Exported to the end, then imported: the importing device stores its blocks. */
    size_t n;
    uint8_t *b = devio_test_export(d, a, false, 64, &n);
    expect(l, &at, (devio_event_kind[]){DEVIO_EVENT_SEQ_EXPORTED}, 1);
    log_t *l2 = calloc(1, sizeof *l2);
    devio_device *d2 = open_logged(*state, l2);
    uint64_t s2 = 0;
    devio_error err = {0};
    assert_int_equal(devio_test_import(d2, b, n, 1000, 0, &s2, &err), DEVIO_OK);
    uint32_t at2 = 0;
    e = expect(l2, &at2,
               (devio_event_kind[]){DEVIO_EVENT_BLOCK_STORED, DEVIO_EVENT_BLOCK_STORED,
                                    DEVIO_EVENT_SEQ_IMPORTED},
               3);
    assert_true(e[1].prefix_hash == h1 && e[2].seq == s2);
    assert_int_equal(apply(d, DEVIO_EFFECT_FREE, a, 0, &o), DEVIO_OK);
    assert_int_equal(l->n_stored, 0);
    free(b);
    devio_teardown(d, NULL);
    devio_teardown(d2, NULL);
    free(l);
    free(l2);
}

/* A random run of steps, forks, truncates, parks, restores and frees: on_event checks every
 * removal against the stored set; once every sequence is freed nothing is stored. */
static void test_events_balance(void **state)
{
    log_t *l = calloc(1, sizeof *l);
    devio_device *d = open_logged(*state, l);
    uint32_t V = devio_model_of(d)->cfg.vocab_size, rng = 12345;
    uint64_t seqs[8] = {0};
    for (uint32_t it = 0; it < 300 && l->n < MAX_EVENTS - 64; it++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t k = (rng >> 8) % 8, op = (rng >> 16) % 6;
        devio_outcome o;
        devio_seq_info info;
        devio_error err = {0};
        if (!seqs[k]) {
            seqs[k] = devio_test_seq(d);
            continue;
        }
        assert_int_equal(devio_seq_info_get(d, seqs[k], &info, &err), DEVIO_OK);
        int32_t tok[6];
        devio_test_tokens(tok, 6, it, V);
        uint32_t n = 1 + (rng >> 24) % 6;
        if (op <= 1 && !info.parked && info.len + n <= 96) {
            devio_row row = {.seq = seqs[k], .tokens = tok, .n_tokens = n};
            devio_plan plan = {.rows = &row, .n_rows = 1};
            uint64_t t;
            devio_step_result r;
            if (devio_launch(d, &plan, &t, &err) == DEVIO_OK) {
                assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
                devio_step_result_free(&r);
            }
        } else if (op == 2 && !info.parked) {
            uint32_t j = (k + 1) % 8;
            if (!seqs[j] && apply(d, DEVIO_EFFECT_FORK, seqs[k], 0, &o) == DEVIO_OK)
                seqs[j] = o.seq;
        } else if (op == 3 && !info.parked) {
            apply(d, DEVIO_EFFECT_TRUNCATE, seqs[k], (rng >> 20) % (info.len + 1), &o);
        } else if (op == 4) {
            apply(d, info.parked ? DEVIO_EFFECT_RESTORE : DEVIO_EFFECT_PARK, seqs[k], 0, &o);
        } else if (op == 5) {
            assert_int_equal(apply(d, DEVIO_EFFECT_FREE, seqs[k], 0, &o), DEVIO_OK);
            seqs[k] = 0;
        }
    }
    for (uint32_t k = 0; k < 8; k++)
        if (seqs[k]) {
            devio_outcome o;
            assert_int_equal(apply(d, DEVIO_EFFECT_FREE, seqs[k], 0, &o), DEVIO_OK);
        }
    assert_int_equal(l->n_stored, 0);
    assert_true(l->n > 100);
    devio_teardown(d, NULL);
    free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_in_order),
        cmocka_unit_test(test_events_balance),
    };
    return devio_run_tests("events", tests, sizeof tests / sizeof *tests, setup, teardown);
}
