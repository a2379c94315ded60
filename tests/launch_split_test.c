/* launch_split_test.c - devio_launch and devio_await in halves: reserve/commit/cancel and await begin/end.
 * A cancelled reservation leaves the device exactly as before, a reserved ticket cannot be awaited and holds
 * back what waits for launched steps, a held result is awaitable again when given back. Real tiny model, ref backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref/ref_backend.h"
#include "tests/testutil.h"

typedef struct ctx {
    devio_fixture fx;
    devio_device *dev;
} ctx;

static int setup(void **state)
{
    static ctx c;
    memset(&c, 0, sizeof c);
    if (devio_fixture_preset(&c.fx, "tiny", DEVIO_F32, 5) != 0)
        return -1;
    devio_config cfg = devio_config_default();
    cfg.max_depth = 2;
    cfg.first_ticket_id = 100;
    if (devio_open(c.fx.model, &devio_ref_backend, &cfg, &c.dev, NULL) != DEVIO_OK)
        return -1;
    *state = &c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    devio_teardown(c->dev, NULL);
    devio_fixture_free(&c->fx);
    return 0;
}

static void sleep_ms(long ms)
{
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL);
}

static const int32_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};

static void test_reserve_cancel_changes_nothing(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, b = 0, t1 = 0, t2 = 0, t3 = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    assert_int_equal(devio_seq_create(c->dev, &b, NULL), DEVIO_OK);
    devio_row ra = {.seq = a, .tokens = toks, .n_tokens = 17, .logits = DEVIO_LOGITS_ALL};
    devio_plan pa = {.rows = &ra, .n_rows = 1};
    devio_facts f0 = devio_facts_get(c->dev);

    assert_int_equal(devio_launch_reserve(c->dev, &pa, &t1, NULL), DEVIO_OK);
    assert_int_equal(t1, 100);
    devio_facts f1 = devio_facts_get(c->dev);
    assert_true(f1.blocks_free < f0.blocks_free);
    assert_int_equal(f1.tickets_in_flight, 1);
    devio_seq_info info;
    assert_int_equal(devio_seq_info_get(c->dev, a, &info, NULL), DEVIO_OK);
    assert_int_equal(info.len, 17);
    assert_int_equal(info.busy_ticket, t1);
    /* Not launched yet: unknown to await, and its sequence is busy. */
    devio_step_result r;
    devio_error err = {0};
    assert_int_equal(devio_await(c->dev, t1, 0, &r, &err), DEVIO_E_UNKNOWN_TICKET);
    assert_int_equal(devio_launch_reserve(c->dev, &pa, &t2, &err), DEVIO_E_SEQ_BUSY);
    /* It counts toward max_depth (2). */
    devio_row rb = {.seq = b, .tokens = toks, .n_tokens = 1};
    devio_plan pb = {.rows = &rb, .n_rows = 1};
    assert_int_equal(devio_launch(c->dev, &pb, &t2, NULL), DEVIO_OK);
    assert_int_equal(t2, 101);
    uint64_t c3 = 0;
    assert_int_equal(devio_seq_create(c->dev, &c3, NULL), DEVIO_OK);
    devio_row rc = {.seq = c3, .tokens = toks, .n_tokens = 1};
    devio_plan pc = {.rows = &rc, .n_rows = 1};
    assert_int_equal(devio_launch(c->dev, &pc, &t3, &err), DEVIO_E_DEPTH_EXCEEDED);

    devio_launch_cancel(c->dev, t1);
    assert_int_equal(devio_await(c->dev, t2, -1, &r, NULL), DEVIO_OK);
    devio_step_result_free(&r);
    devio_facts f2 = devio_facts_get(c->dev);
    assert_int_equal(devio_seq_info_get(c->dev, a, &info, NULL), DEVIO_OK);
    assert_int_equal(info.len, 0);
    assert_int_equal(info.blocks, 0);
    assert_int_equal(info.busy_ticket, 0);
    assert_int_equal(f2.tickets_in_flight, 0);
    assert_int_equal(f2.logits_live, f0.logits_live);
    /* b holds one block now; a gave everything back. */
    assert_int_equal(f2.blocks_free, f0.blocks_free - 1);
    /* Cancelled ids are never handed out again; committing it is refused. */
    assert_int_equal(devio_launch_commit(c->dev, t1, &err), DEVIO_E_UNKNOWN_TICKET);
    assert_int_equal(devio_launch(c->dev, &pa, &t3, NULL), DEVIO_OK);
    assert_int_equal(t3, 102);
    assert_int_equal(devio_await(c->dev, t3, -1, &r, NULL), DEVIO_OK);
    assert_int_equal(r.rows[0].len, 17);
    devio_step_result_free(&r);
}

typedef struct applier {
    devio_device *dev;
    devio_effect e;
    atomic_bool done;
    devio_status st;
} applier;

static void *apply_main(void *arg)
{
    applier *ap = arg;
    devio_outcome o = {0};
    ap->st = devio_apply(ap->dev, &ap->e, &o, NULL);
    devio_outcome_free(&o);
    atomic_store(&ap->done, true);
    return NULL;
}

/* Apply e on a thread of its own while ticket t stays reserved for 150 ms, then commit t:
 * whether the effect had finished before the commit. */
static bool done_before_commit(ctx *c, devio_effect e, uint64_t t)
{
    applier ap = {.dev = c->dev, .e = e};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, apply_main, &ap), 0);
    sleep_ms(150);
    bool early = atomic_load(&ap.done);
    assert_int_equal(devio_launch_commit(c->dev, t, NULL), DEVIO_OK);
    pthread_join(th, NULL);
    assert_int_equal(ap.st, DEVIO_OK);
    return early;
}

/* A reserved launch holds up only the effects that could give back or write over a block its
 * plan copies from: a fork or a free of another sequence runs at once, a free of the
 * sequence whose shared block the launch copies (copy-on-write) waits for its commit, and the
 * copy then reads what the block held. */
static void test_effect_waits_only_for_a_reservation_it_touches(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, b = 0, t = 0;
    devio_outcome o = {0};
    devio_step_result r;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    assert_int_equal(devio_seq_create(c->dev, &b, NULL), DEVIO_OK);
    devio_row ra = {.seq = a, .tokens = toks, .n_tokens = 2};
    devio_plan pa = {.rows = &ra, .n_rows = 1};
    assert_int_equal(devio_launch_reserve(c->dev, &pa, &t, NULL), DEVIO_OK);
    assert_true(done_before_commit(c, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = b}, t));
    assert_int_equal(devio_await(c->dev, t, -1, &r, NULL), DEVIO_OK);
    devio_step_result_free(&r);
    /* a (2 tokens, a partial block) forked into f and g: a launch on either copies that block
     * first, from a. Freeing b meanwhile runs at once; freeing a waits for the commit. */
    uint64_t kids[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(devio_apply(c->dev, &(devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a},
                                     &o, NULL),
                         DEVIO_OK);
        kids[i] = o.seq;
        devio_outcome_free(&o);
    }
    uint32_t vocab = c->fx.model->cfg.vocab_size;
    float *lg[2] = {malloc(vocab * sizeof(float)), malloc(vocab * sizeof(float))};
    devio_effect frees[2] = {{.kind = DEVIO_EFFECT_FREE, .seq = b},
                             {.kind = DEVIO_EFFECT_FREE, .seq = a}};
    for (int i = 0; i < 2; i++) {
        devio_row rk = {.seq = kids[i], .tokens = toks + 2, .n_tokens = 1,
                        .logits = DEVIO_LOGITS_LAST};
        devio_plan pk = {.rows = &rk, .n_rows = 1};
        assert_int_equal(devio_launch_reserve(c->dev, &pk, &t, NULL), DEVIO_OK);
        assert_true(done_before_commit(c, frees[i], t) == (i == 0));
        assert_int_equal(devio_await(c->dev, t, -1, &r, NULL), DEVIO_OK);
        assert_int_equal(devio_logits_read(c->dev, r.rows[0].logits, 0, 1, lg[i], NULL, NULL),
                         DEVIO_OK);
        devio_step_result_free(&r);
    }
    /* g's copy read the block a held, though a was freed right after the commit. */
    assert_memory_equal(lg[0], lg[1], vocab * sizeof(float));
    free(lg[0]);
    free(lg[1]);
}

typedef struct awaiter {
    devio_device *dev;
    uint64_t ticket;
    devio_status st;
    uint32_t len;
} awaiter;

static void *await_main(void *arg)
{
    awaiter *aw = arg;
    devio_step_result r;
    aw->st = devio_await(aw->dev, aw->ticket, 5000, &r, NULL);
    if (aw->st == DEVIO_OK) {
        aw->len = r.rows[0].len;
        devio_step_result_free(&r);
    }
    return NULL;
}

/* A held result given back is awaitable again, by a waiting caller too. */
static void test_await_given_back(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, t = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    devio_row ra = {.seq = a, .tokens = toks, .n_tokens = 3};
    devio_plan pa = {.rows = &ra, .n_rows = 1};
    assert_int_equal(devio_launch(c->dev, &pa, &t, NULL), DEVIO_OK);
    devio_step_result r;
    bool held = false;
    assert_int_equal(devio_await_begin(c->dev, t, -1, &r, &held, NULL), DEVIO_OK);
    assert_true(held);
    assert_int_equal(r.rows[0].len, 3);
    devio_step_result_free(&r);
    /* Held: another look finds it pending, a waiting await waits. */
    devio_error err = {0};
    bool h2 = true;
    assert_int_equal(devio_await_begin(c->dev, t, 0, &r, &h2, &err), DEVIO_E_TICKET_PENDING);
    assert_false(h2);
    awaiter aw = {.dev = c->dev, .ticket = t};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, await_main, &aw), 0);
    sleep_ms(100);
    devio_await_end(c->dev, t, DEVIO_AWAIT_KEEP);
    pthread_join(th, NULL);
    assert_int_equal(aw.st, DEVIO_OK);
    assert_int_equal(aw.len, 3);
    assert_int_equal(devio_facts_get(c->dev).tickets_in_flight, 0);
    assert_int_equal(devio_await(c->dev, t, 0, &r, &err), DEVIO_E_TICKET_CONSUMED);
    devio_seq_info info;
    assert_int_equal(devio_seq_info_get(c->dev, a, &info, NULL), DEVIO_OK);
    assert_int_equal(info.busy_ticket, 0);
    assert_int_equal(info.len, 3);
}

/* A dropped answer ends the ticket and releases the logits handles its rows
 * made; the sequence keeps the tokens the step appended. */
static void test_await_dropped(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, t = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    devio_row ra = {.seq = a, .tokens = toks, .n_tokens = 3, .logits = DEVIO_LOGITS_ALL};
    devio_plan pa = {.rows = &ra, .n_rows = 1};
    assert_int_equal(devio_launch(c->dev, &pa, &t, NULL), DEVIO_OK);
    devio_step_result r;
    bool held = false;
    assert_int_equal(devio_await_begin(c->dev, t, -1, &r, &held, NULL), DEVIO_OK);
    assert_true(held);
    uint64_t h = r.rows[0].logits;
    assert_true(h != 0);
    devio_step_result_free(&r);
    assert_int_equal(devio_facts_get(c->dev).logits_live, 1);
    devio_await_end(c->dev, t, DEVIO_AWAIT_DROP);
    devio_facts f = devio_facts_get(c->dev);
    assert_int_equal(f.logits_live, 0);
    assert_int_equal(f.tickets_in_flight, 0);
    float row[1];
    uint32_t n = 0;
    assert_int_equal(devio_logits_read(c->dev, h, 0, 0, row, &n, NULL), DEVIO_E_UNKNOWN_LOGITS);
    devio_seq_info info;
    assert_int_equal(devio_seq_info_get(c->dev, a, &info, NULL), DEVIO_OK);
    assert_int_equal(info.len, 3);
    assert_int_equal(info.busy_ticket, 0);
    devio_error err = {0};
    assert_int_equal(devio_await(c->dev, t, 0, &r, &err), DEVIO_E_TICKET_CONSUMED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reserve_cancel_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_effect_waits_only_for_a_reservation_it_touches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_await_given_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_await_dropped, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
