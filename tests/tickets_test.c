/* tickets_test.c - service/tickets/tickets.c over the real device and a real store: rows, metrics, and what is not recorded.
 * A tiny written model in a temp directory; the store lives beside it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "tests/tickets_fixture.h"

typedef tickets_ctx ctx;


/* The newest history row. */
static devio_ticket_page newest(ctx *c, const char *status)
{
    devio_ticket_query q = {.status = status, .limit = 10};
    devio_ticket_page p;
    assert_int_equal(devio_store_tickets_query(c->store, &q, &p, NULL), DEVIO_OK);
    return p;
}

static void test_launch_await_rows_and_metrics(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, b = 0, ticket = 0;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    assert_int_equal(devio_seq_create(c->dev, &b, NULL), DEVIO_OK);
    int32_t toks[] = {1, 2, 3};
    devio_row rows[] = {{.seq = a, .tokens = toks, .n_tokens = 3},
                        {.seq = b, .tokens = toks, .n_tokens = 2}};
    devio_plan plan = {.rows = rows, .n_rows = 2};
    devio_error err = {0};
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &ticket, &err), DEVIO_OK);
    assert_int_equal(c->metrics.tickets_launched, 1);

    /* The row is committed when launch returns: read-your-writes. */
    devio_ticket_page p = newest(c, "in_flight");
    assert_int_equal(p.n, 1);
    assert_int_equal(p.rows[0].id, ticket);
    assert_int_equal(p.rows[0].rows, 2);
    assert_int_equal(p.rows[0].tokens, 5);
    assert_int_equal(p.rows[0].n_seqs, 2);
    assert_int_equal(p.rows[0].seqs[0], a);
    assert_int_equal(p.rows[0].seqs[1], b);
    devio_ticket_page_free(&p);

    devio_step_result r;
    assert_int_equal(devio_tickets_await(&c->t, c->dev, ticket, -1, &r, &err), DEVIO_OK);
    assert_int_equal(r.ticket, ticket);
    assert_int_equal(r.n_rows, 2);
    p = newest(c, "ok");
    assert_int_equal(p.n, 1);
    assert_int_equal(p.rows[0].id, ticket);
    assert_true(p.rows[0].has_settled_ms && p.rows[0].has_compute_us);
    assert_int_equal(p.rows[0].compute_us, r.compute_us);
    devio_ticket_page_free(&p);
    assert_int_equal(c->metrics.tickets_ok, 1);
    assert_int_equal(c->metrics.tokens_prefill, r.n_tokens); /* rows of 3 and 2 tokens */
    assert_int_equal(c->metrics.tokens_decode, 0);
    assert_int_equal(c->metrics.step_seconds.count, 1);
    devio_step_result_free(&r);

    /* A second await changes nothing: consumed, no row, no metric. */
    assert_int_equal(devio_tickets_await(&c->t, c->dev, ticket, -1, &r, &err),
                     DEVIO_E_TICKET_CONSUMED);
    assert_int_equal(c->metrics.tickets_ok + c->metrics.tickets_failed, 1);
    p = newest(c, NULL);
    assert_int_equal(p.n, 1);
    devio_ticket_page_free(&p);

    /* Step is the two in a row. */
    assert_int_equal(devio_tickets_step(&c->t, c->dev, &plan, NULL, &r, &err), DEVIO_OK);
    devio_step_result_free(&r);
    p = newest(c, "ok");
    assert_int_equal(p.n, 2);
    devio_ticket_page_free(&p);
    assert_int_equal(c->metrics.tickets_launched, 2);
    assert_int_equal(c->metrics.tickets_ok, 2);
}

static void test_refused_launch_writes_nothing(void **state)
{
    ctx *c = *state;
    int32_t tok = 1;
    devio_row row = {.seq = 999999, .tokens = &tok, .n_tokens = 1};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t ticket = 0;
    devio_error err = {0};
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &ticket, &err),
                     DEVIO_E_UNKNOWN_SEQ);
    assert_int_equal(c->metrics.tickets_launched, 0);
    devio_ticket_page p = newest(c, NULL);
    assert_int_equal(p.n, 0);
    devio_ticket_page_free(&p);
    devio_step_result r;
    assert_int_equal(devio_tickets_await(&c->t, c->dev, 12345, 0, &r, &err),
                     DEVIO_E_UNKNOWN_TICKET);
    assert_int_equal(c->metrics.tickets_failed, 0);
}

static void test_aborted_at_teardown(void **state)
{
    ctx *c = *state;
    uint64_t a = 0, ticket = 0;
    int32_t tok = 1;
    assert_int_equal(devio_seq_create(c->dev, &a, NULL), DEVIO_OK);
    devio_row row = {.seq = a, .tokens = &tok, .n_tokens = 1};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    assert_int_equal(devio_tickets_launch(&c->t, c->dev, &plan, NULL, &ticket, NULL), DEVIO_OK);
    uint32_t aborted = 0;
    devio_teardown(c->dev, &aborted);
    c->dev = NULL;
    assert_int_equal(aborted, 1);
    devio_tickets_aborted(&c->t, aborted, "device torn down");
    assert_int_equal(c->metrics.tickets_aborted, 1);
    devio_ticket_page p = newest(c, "aborted");
    assert_int_equal(p.n, 1);
    assert_int_equal(p.rows[0].id, ticket);
    assert_string_equal(p.rows[0].error_message, "device torn down");
    devio_ticket_page_free(&p);
}

/* A case on a fresh model, store and device. */
#define WITH_CTX(f) cmocka_unit_test_setup_teardown(f, tickets_ctx_setup, tickets_ctx_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        WITH_CTX(test_launch_await_rows_and_metrics),
        WITH_CTX(test_refused_launch_writes_nothing),
        WITH_CTX(test_aborted_at_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
