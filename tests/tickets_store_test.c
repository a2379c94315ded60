/* tickets_store_test.c - launch and await when the history cannot be written: refused with store_unavailable, nothing launched, results kept.
 * Real device, real store; the file refuses writes through RLIMIT_FSIZE (SIGXFSZ ignored) like a full disk.
 * No assertion runs while the limit is on (cmocka writes its output to a file too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tests/tickets_fixture.h"

/* The file-size limit and SIGXFSZ handler to restore after a fault. */
static struct rlimit saved_limit;
static void (*saved_sig)(int);

typedef tickets_ctx ctx;


/* The history file stops taking writes (true on success). */
static bool disk_full(void)
{
    if (getrlimit(RLIMIT_FSIZE, &saved_limit) != 0)
        return false;
    saved_sig = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {.rlim_cur = 1, .rlim_max = saved_limit.rlim_max};
    return setrlimit(RLIMIT_FSIZE, &lim) == 0;
}

static bool disk_ok(void)
{
    bool ok = setrlimit(RLIMIT_FSIZE, &saved_limit) == 0;
    signal(SIGXFSZ, saved_sig);
    return ok;
}

/* The store's heartbeat finds it writable again (at most 3 s). */
static bool writable_again(ctx *c)
{
    for (int i = 0; i < 150 && !devio_store_writable(c->store); i++)
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000000L}, NULL);
    return devio_store_writable(c->store);
}

static size_t rows_in_history(ctx *c)
{
    devio_ticket_query q = {.limit = 100};
    devio_ticket_page p;
    assert_int_equal(devio_store_tickets_query(c->store, &q, &p, NULL), DEVIO_OK);
    size_t n = p.n;
    devio_ticket_page_free(&p);
    return n;
}

/* A launch whose row fails launches nothing; a second one is refused before
 * reserving; after recovery ids keep rising. */
static void test_launch_refused_nothing_launched(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, t1 = 0, t2 = 0, t3 = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    int32_t toks[] = {1, 2, 3};
    devio_row row = {.seq = a, .tokens = toks, .n_tokens = 3, .logits = DEVIO_LOGITS_LAST};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    devio_facts before = devio_facts_get(c->dev);

    bool full = disk_full();
    devio_error e1 = {0}, e2 = {0};
    devio_status s1 = devio_tickets_launch(&c->t, c->dev, &plan, NULL, &t1, &e1);
    devio_facts during = devio_facts_get(c->dev);
    devio_seq_info info = {0};
    devio_status si = devio_seq_info_get(c->dev, a, &info, NULL);
    devio_status s2 = devio_tickets_launch(&c->t, c->dev, &plan, NULL, &t2, &e2);
    bool lifted = disk_ok();

    assert_true(full && lifted);
    assert_int_equal(s1, DEVIO_E_STORE_UNAVAILABLE);
    assert_non_null(strstr(e1.message, "nothing was launched"));
    assert_int_equal(t1, 0);
    assert_int_equal(s2, DEVIO_E_STORE_UNAVAILABLE);
    assert_int_equal(during.blocks_free, before.blocks_free);
    assert_int_equal(during.tickets_in_flight, 0);
    assert_int_equal(during.logits_live, before.logits_live);
    assert_int_equal(si, DEVIO_OK);
    assert_int_equal(info.len, 0);
    assert_int_equal(info.busy_ticket, 0);
    assert_int_equal(c->metrics.tickets_launched, 0);

    assert_true(writable_again(c));
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &t3, NULL), DEVIO_OK);
    assert_true(t3 >= 1);
    devio_step_result r;
    assert_int_equal(devio_tickets_await(&c->t, c->dev, t3, -1, &r, NULL), DEVIO_OK);
    assert_int_equal(r.rows[0].len, 3);
    devio_step_result_free(&r);
    assert_int_equal(rows_in_history(c), 1);
}

/* An await whose row fails keeps the ticket settled and awaitable; the
 * result comes once the store writes again, as with a plain await. */
static void test_await_keeps_result(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, t = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    int32_t toks[] = {4, 5};
    devio_row row = {.seq = a, .tokens = toks, .n_tokens = 2, .has_sample = true,
                     .sample = {.temperature = 0, .top_p = 1}};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &t, NULL), DEVIO_OK);
    devio_step_result r0;
    assert_int_equal(devio_await(c->dev, t, -1, &r0, NULL), DEVIO_OK); /* the reference answer */
    devio_step_result_free(&r0);
    assert_int_equal(devio_apply(c->dev, &(devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a,
                                                         .len = 0},
                                 &(devio_outcome){0}, NULL),
                     DEVIO_OK);
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &t, NULL), DEVIO_OK);

    bool full = disk_full();
    devio_step_result r1 = {0}, r2 = {0};
    devio_error e1 = {0};
    devio_status s1 = devio_tickets_await(&c->t, c->dev, t, -1, &r1, &e1);
    devio_facts during = devio_facts_get(c->dev);
    devio_seq_info info = {0};
    devio_seq_info_get(c->dev, a, &info, NULL);
    bool lifted = disk_ok();

    assert_true(full && lifted);
    assert_int_equal(s1, DEVIO_E_STORE_UNAVAILABLE);
    assert_string_equal(e1.detail_key, "ticket");
    assert_int_equal(e1.detail_val, (int64_t)t);
    assert_null(r1.rows);
    assert_int_equal(during.tickets_in_flight, 1);
    assert_int_equal(info.busy_ticket, t);
    assert_int_equal(c->metrics.tickets_ok, 0);

    assert_true(writable_again(c));
    assert_int_equal(devio_tickets_await(&c->t, c->dev, t, -1, &r2, NULL), DEVIO_OK);
    assert_int_equal(r2.ticket, t);
    assert_int_equal(r2.rows[0].len, 2);
    assert_true(r2.rows[0].sampled);
    devio_step_result_free(&r2);
    assert_int_equal(c->metrics.tickets_ok, 1);
    assert_int_equal(devio_tickets_await(&c->t, c->dev, t, -1, &r2, NULL),
                     DEVIO_E_TICKET_CONSUMED);
    devio_ticket_query q = {.status = "ok", .limit = 10};
    devio_ticket_page p;
    assert_int_equal(devio_store_tickets_query(c->store, &q, &p, NULL), DEVIO_OK);
    assert_int_equal(p.n, 1);
    assert_int_equal(p.rows[0].id, t);
    devio_ticket_page_free(&p);
}

/* A step whose result cannot be written names its ticket: it can be awaited later. */
static void test_step_names_its_ticket(void **state)
{
    ctx *c = *state;
    uint64_t a = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    int32_t tok = 7;
    devio_row row = {.seq = a, .tokens = &tok, .n_tokens = 1};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    /* Launch under a working store, fail only the settle: launch then await by hand. */
    uint64_t t = 0;
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &t, NULL), DEVIO_OK);
    bool full = disk_full();
    devio_step_result r = {0};
    devio_error e = {0};
    devio_status s = devio_tickets_step(&c->t, c->dev, &plan, NULL, &r, &e); /* seq busy: refused */
    devio_status s2 = devio_tickets_await(&c->t, c->dev, t, -1, &r, &e);
    bool lifted = disk_ok();
    assert_true(full && lifted);
    assert_true(s == DEVIO_E_STORE_UNAVAILABLE || s == DEVIO_E_SEQ_BUSY);
    assert_int_equal(s2, DEVIO_E_STORE_UNAVAILABLE);
    assert_int_equal(e.detail_val, (int64_t)t);
    assert_true(writable_again(c));
    assert_int_equal(devio_tickets_await(&c->t, c->dev, t, -1, &r, NULL), DEVIO_OK);
    devio_step_result_free(&r);
}

/* A case on a fresh model, store and device. */
#define WITH_CTX(f) cmocka_unit_test_setup_teardown(f, tickets_ctx_setup, tickets_ctx_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        WITH_CTX(test_launch_refused_nothing_launched),
        WITH_CTX(test_await_keeps_result),
        WITH_CTX(test_step_names_its_ticket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
