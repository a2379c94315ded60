/* parked_awaits_test.c - service/tickets/parked_awaits.c with recording ops: resumed by a settle, by the timer, by close.
 * No sockets and no device: a "connection" is an int the ops count on. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "common/clock.h"
#include "service/tickets/parked_awaits.h"

/* Suspends and resumes per connection; touched under the table's lock or after a join. */
typedef struct conn {
    int suspends, resumes;
    int64_t resumed_at_us;
} conn;

static pthread_mutex_t conn_mu = PTHREAD_MUTEX_INITIALIZER;

static void rec_suspend(void *c)
{
    ((conn *)c)->suspends++;
}

static void rec_resume(void *c)
{
    pthread_mutex_lock(&conn_mu);
    ((conn *)c)->resumes++;
    ((conn *)c)->resumed_at_us = (int64_t)devio_clock_us();
    pthread_mutex_unlock(&conn_mu);
}

static const devio_waits_ops rec = {.suspend = rec_suspend, .resume = rec_resume};

static int resumes(conn *c)
{
    pthread_mutex_lock(&conn_mu);
    int n = c->resumes;
    pthread_mutex_unlock(&conn_mu);
    return n;
}

static void test_settle_resumes_its_ticket_only(void **state)
{
    (void)state;
    devio_waits ws;
    assert_int_equal(devio_waits_start(&ws, &rec, NULL), DEVIO_OK);
    conn a = {0}, b = {0};
    devio_wait wa, wb;
    devio_waits_enter(&ws, &wa, &a, 7, -1);
    devio_waits_enter(&ws, &wb, &b, 8, -1);
    assert_int_equal(devio_waits_park(&ws, &wa), DEVIO_WAIT_PARKED);
    assert_int_equal(devio_waits_park(&ws, &wb), DEVIO_WAIT_PARKED);
    assert_int_equal(a.suspends, 1);
    assert_int_equal(devio_waits_suspended(&ws), 2);
    devio_waits_settled(&ws, 7);
    assert_int_equal(resumes(&a), 1);
    assert_int_equal(resumes(&b), 0);
    assert_false(wa.listed);
    assert_int_equal(devio_waits_suspended(&ws), 1);
    devio_waits_settled(&ws, 7); /* again: nothing left to resume */
    assert_int_equal(resumes(&a), 1);
    devio_waits_settled(&ws, 8);
    assert_int_equal(resumes(&b), 1);
    devio_waits_stop(&ws);
    assert_int_equal(resumes(&a), 1);
}

/* The step settles after the handler looked and before it parked: no
 * suspend, a second look instead, so the wake is never lost. */
static void test_settle_before_park_is_a_recheck(void **state)
{
    (void)state;
    devio_waits ws;
    assert_int_equal(devio_waits_start(&ws, &rec, NULL), DEVIO_OK);
    conn a = {0};
    devio_wait w;
    devio_waits_enter(&ws, &w, &a, 3, -1);
    devio_waits_settled(&ws, 3);
    assert_int_equal(devio_waits_park(&ws, &w), DEVIO_WAIT_RECHECK);
    assert_int_equal(a.suspends, 0);
    assert_int_equal(resumes(&a), 0);
    assert_false(w.listed);
    devio_waits_leave(&ws, &w); /* not listed: left alone */
    devio_waits_stop(&ws);
}

/* A deadline passes while parked: the timer resumes the wait then, not before. */
static void test_timer_resumes_at_the_deadline(void **state)
{
    (void)state;
    devio_waits ws;
    assert_int_equal(devio_waits_start(&ws, &rec, NULL), DEVIO_OK);
    conn late = {0}, soon = {0};
    devio_wait wl, wsoon;
    int64_t now = (int64_t)devio_clock_us();
    devio_waits_enter(&ws, &wl, &late, 1, now + 400000);
    assert_int_equal(devio_waits_park(&ws, &wl), DEVIO_WAIT_PARKED);
    /* A nearer deadline parked after a farther one wakes the timer earlier. */
    devio_waits_enter(&ws, &wsoon, &soon, 2, now + 50000);
    assert_int_equal(devio_waits_park(&ws, &wsoon), DEVIO_WAIT_PARKED);
    for (int i = 0; i < 2000 && resumes(&soon) == 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000L}, NULL);
    assert_int_equal(resumes(&soon), 1);
    assert_true(soon.resumed_at_us >= now + 50000);
    assert_true(soon.resumed_at_us < now + 400000);
    assert_int_equal(resumes(&late), 0);
    for (int i = 0; i < 2000 && resumes(&late) == 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000L}, NULL);
    assert_int_equal(resumes(&late), 1);
    assert_true(late.resumed_at_us >= now + 400000);
    assert_int_equal(devio_waits_suspended(&ws), 0);
    devio_waits_stop(&ws);
}

/* Close hands back every suspended connection and refuses to park more. */
static void test_close_resumes_all_and_refuses(void **state)
{
    (void)state;
    devio_waits ws;
    assert_int_equal(devio_waits_start(&ws, &rec, NULL), DEVIO_OK);
    conn c[3] = {{0}};
    devio_wait w[3];
    for (int i = 0; i < 2; i++) {
        devio_waits_enter(&ws, &w[i], &c[i], (uint64_t)i + 1, -1);
        assert_int_equal(devio_waits_park(&ws, &w[i]), DEVIO_WAIT_PARKED);
    }
    devio_waits_enter(&ws, &w[2], &c[2], 9, -1);
    devio_waits_close(&ws);
    assert_int_equal(resumes(&c[0]), 1);
    assert_int_equal(resumes(&c[1]), 1);
    assert_int_equal(devio_waits_park(&ws, &w[2]), DEVIO_WAIT_CLOSED);
    assert_int_equal(c[2].suspends, 0);
    assert_false(w[2].listed);
    devio_waits_stop(&ws);
}

/* A write wait is resumed by the batch that writes it or a later one, never by
 * a settle; a wait for ticket 9 is not resumed by write 9. */
static void test_write_waits(void **state)
{
    (void)state;
    devio_waits ws;
    assert_int_equal(devio_waits_start(&ws, &rec, NULL), DEVIO_OK);
    conn a = {0}, b = {0}, t = {0};
    devio_wait wa, wb, wt;
    devio_waits_enter_write(&ws, &wa, &a, 5);
    devio_waits_enter_write(&ws, &wb, &b, 9);
    devio_waits_enter(&ws, &wt, &t, 9, -1);
    assert_int_equal(devio_waits_park(&ws, &wa), DEVIO_WAIT_PARKED);
    assert_int_equal(devio_waits_park(&ws, &wb), DEVIO_WAIT_PARKED);
    assert_int_equal(devio_waits_park(&ws, &wt), DEVIO_WAIT_PARKED);
    assert_true(devio_waits_watching(&ws, 9));
    assert_false(devio_waits_watching(&ws, 5));
    devio_waits_settled(&ws, 5);
    assert_int_equal(resumes(&a), 0);
    devio_waits_written(&ws, 8);
    assert_int_equal(resumes(&a), 1);
    assert_int_equal(resumes(&b), 0);
    assert_int_equal(resumes(&t), 0);
    devio_waits_written(&ws, 20);
    assert_int_equal(resumes(&b), 1);
    assert_int_equal(resumes(&t), 0);
    /* Written between enter and park: the park says look again. */
    conn c = {0};
    devio_wait wc;
    devio_waits_enter_write(&ws, &wc, &c, 21);
    devio_waits_written(&ws, 21);
    assert_int_equal(devio_waits_park(&ws, &wc), DEVIO_WAIT_RECHECK);
    assert_int_equal(c.suspends, 0);
    devio_waits_settled(&ws, 9);
    assert_int_equal(resumes(&t), 1);
    assert_false(devio_waits_watching(&ws, 9));
    devio_waits_stop(&ws);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_waits),
        cmocka_unit_test(test_settle_resumes_its_ticket_only),
        cmocka_unit_test(test_settle_before_park_is_a_recheck),
        cmocka_unit_test(test_timer_resumes_at_the_deadline),
        cmocka_unit_test(test_close_resumes_all_and_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
