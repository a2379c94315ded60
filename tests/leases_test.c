/* leases_test.c - service/tickets/leases.c with recording ops: a lease runs from the settle, a closed
 * connection reaps at once, a taken ticket is never reaped, a failed reap is tried again, jobs run.
 * No device and no store: the ops only record what the reaper asked. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "common/clock.h"
#include "service/tickets/leases.h"

typedef struct rec {
    pthread_mutex_t mu;
    uint64_t reaped[16];
    bool closed[16];
    int64_t at_us[16];
    int n;
    int retries_left; /* answer RETRY this many times first */
    uint64_t finished;
} rec;

static devio_reap rec_reap(void *ctx, uint64_t ticket, bool closed)
{
    rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    devio_reap out = DEVIO_REAP_DONE;
    if (r->retries_left > 0) {
        r->retries_left--;
        out = DEVIO_REAP_RETRY;
    } else if (r->n < 16) {
        r->reaped[r->n] = ticket;
        r->closed[r->n] = closed;
        r->at_us[r->n] = (int64_t)devio_clock_us();
        r->n++;
    }
    pthread_mutex_unlock(&r->mu);
    return out;
}

static void rec_finish(void *ctx, devio_ticket_op *op)
{
    rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->finished = op->ticket;
    pthread_mutex_unlock(&r->mu);
}

static const devio_leases_ops ops = {.reap = rec_reap, .finish = rec_finish};

static int reaped(rec *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L},
              NULL);
}

/* Wait (bounded) for n reaps. */
static void wait_reaped(rec *r, int n)
{
    for (int i = 0; i < 500 && reaped(r) < n; i++)
        sleep_ms(10);
    assert_int_equal(reaped(r), n);
}

static void test_lease_runs_from_the_settle(void **state)
{
    (void)state;
    rec r = {.mu = PTHREAD_MUTEX_INITIALIZER};
    devio_leases ls;
    assert_int_equal(devio_leases_start(&ls, 100, &ops, &r, NULL), DEVIO_OK);
    devio_leases_add(&ls, 7);
    devio_leases_add(&ls, 8);
    sleep_ms(200); /* not settled: never due */
    assert_int_equal(reaped(&r), 0);
    int64_t t0 = (int64_t)devio_clock_us();
    devio_leases_settled(&ls, 7);
    devio_leases_settled(&ls, 8);
    devio_leases_taken(&ls, 8); /* an await took 8 */
    wait_reaped(&r, 1);
    assert_int_equal(r.reaped[0], 7);
    assert_false(r.closed[0]);
    assert_true(r.at_us[0] - t0 >= 100000);
    sleep_ms(150);
    assert_int_equal(reaped(&r), 1);
    devio_leases_stop(&ls);
}

static void test_closed_reaps_once_settled(void **state)
{
    (void)state;
    rec r = {.mu = PTHREAD_MUTEX_INITIALIZER};
    devio_leases ls;
    assert_int_equal(devio_leases_start(&ls, 0, &ops, &r, NULL), DEVIO_OK); /* no lease */
    devio_leases_add(&ls, 3);
    devio_leases_add(&ls, 4);
    devio_leases_closed(&ls, 3);
    sleep_ms(50);
    assert_int_equal(reaped(&r), 0); /* closed but not settled */
    devio_leases_settled(&ls, 3);
    devio_leases_settled(&ls, 4); /* no lease: 4 stays */
    wait_reaped(&r, 1);
    assert_int_equal(r.reaped[0], 3);
    assert_true(r.closed[0]);
    sleep_ms(100);
    assert_int_equal(reaped(&r), 1);
    devio_leases_stop(&ls);
}

static void test_retry_and_clear(void **state)
{
    (void)state;
    rec r = {.mu = PTHREAD_MUTEX_INITIALIZER, .retries_left = 1};
    devio_leases ls;
    assert_int_equal(devio_leases_start(&ls, 0, &ops, &r, NULL), DEVIO_OK);
    devio_leases_add(&ls, 11);
    devio_leases_closed(&ls, 11);
    int64_t t0 = (int64_t)devio_clock_us();
    devio_leases_settled(&ls, 11);
    wait_reaped(&r, 1); /* the first try answered RETRY; the second, a second later, reaps */
    assert_true(r.at_us[0] - t0 >= 900000);
    devio_leases_add(&ls, 12);
    devio_leases_clear(&ls);
    devio_leases_closed(&ls, 12); /* forgotten: nothing to reap */
    devio_leases_settled(&ls, 12);
    sleep_ms(100);
    assert_int_equal(reaped(&r), 1);
    devio_leases_stop(&ls);
}

static void test_jobs_run_before_stop(void **state)
{
    (void)state;
    rec r = {.mu = PTHREAD_MUTEX_INITIALIZER};
    devio_leases ls;
    assert_int_equal(devio_leases_start(&ls, 1000, &ops, &r, NULL), DEVIO_OK);
    devio_ticket_op op = {.phase = DEVIO_OP_LAUNCHING, .ticket = 21, .write = 3};
    assert_true(devio_leases_finish(&ls, &op));
    devio_leases_stop(&ls); /* finishes the queued job first */
    assert_int_equal(r.finished, 21);
    devio_leases_stop(&ls); /* idempotent */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lease_runs_from_the_settle),
        cmocka_unit_test(test_closed_reaps_once_settled),
        cmocka_unit_test(test_retry_and_clear),
        cmocka_unit_test(test_jobs_run_before_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
