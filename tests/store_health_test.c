/* store_health_test.c - the store when its file cannot take writes, and the ticket id ranges it reserves.
 * The file is real; writes fail through the process's RLIMIT_FSIZE (SIGXFSZ ignored), exactly as on a
 * full disk, and succeed again once the limit is lifted. The fixture is store_fixture.h. */
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
#include <unistd.h>

#include "device/devio.h"
#include "tests/store_fixture.h"

static int64_t meta_high(const ctx *c)
{
    return sql_int(c->path, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='ticket_id_high'");
}

/* The mark moves a range ahead in the launch row's own transaction, only
 * when an id passes it; a new process starts past the whole range. */
static void test_id_ranges(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    assert_int_equal(devio_store_next_ticket_id(s), 1);
    assert_int_equal(meta_high(c), 0);
    wait_ok(s, launch(s, 1, 1));
    assert_int_equal(meta_high(c), 1024);
    uint64_t n = 0;
    for (uint64_t id = 2; id <= 1024; id++)
        n = launch(s, id, 1);
    wait_ok(s, n);
    assert_int_equal(meta_high(c), 1024);
    wait_ok(s, launch(s, 1025, 1));
    assert_int_equal(meta_high(c), 2048);
    /* A settle whose launch row is missing inserts its row: it reserves too. */
    devio_ticket_record r = {.id = 5000, .status = "ok", .launched_ms = 1, .settled_ms = 2};
    wait_ok(s, devio_store_ticket_settled(s, &r));
    assert_int_equal(meta_high(c), 5000 + 1023);
    devio_store_close(s);

    s = open_store(c, 0);
    assert_int_equal(devio_store_next_ticket_id(s), 6024);
    devio_store_close(s);
    /* Emptied history: the mark alone keeps ids from coming back. */
    sql_exec(c->path, "DELETE FROM tickets");
    s = open_store(c, 0);
    assert_int_equal(devio_store_next_ticket_id(s), 6024);
    devio_store_close(s);

    /* A file written before ranges (mark below max(id)) starts past max(id). */
    sql_exec(c->path, "INSERT INTO tickets(id, epoch, status, launched_ms) VALUES(9000, 1, 'ok', 1)");
    s = open_store(c, 0);
    assert_int_equal(devio_store_next_ticket_id(s), 9001);
    devio_store_close(s);
}

/* Poll until the store's writability is `want`, at most `ms`. */
static bool wait_writable(devio_store *s, bool want, int ms)
{
    for (int i = 0; i < ms / 20; i++) {
        if (devio_store_writable(s) == want)
            return true;
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000000L}, NULL);
    }
    return devio_store_writable(s) == want;
}

/* Writes fail while the file may not grow: waits report it, health says so
 * and counts; the heartbeat finds the file writable again by itself. */
static void test_unwritable_then_recovers(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    wait_ok(s, launch(s, 1, 1));
    devio_store_health h0;
    devio_store_health_get(s, &h0);
    assert_true(h0.writable);
    assert_int_equal(h0.errors, 0);
    assert_true(h0.last_success_ms > 0);
    assert_string_equal(h0.reason, "");

    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    /* No assertion while limited: cmocka's own output is a file too. */
    struct rlimit lim = {.rlim_cur = 1, .rlim_max = old.rlim_max};
    int set = setrlimit(RLIMIT_FSIZE, &lim);
    devio_error err = {0};
    devio_status st1 = devio_store_wait(s, launch(s, 2, 2), &err);
    bool down = wait_writable(s, false, 2000);
    devio_store_health h1;
    devio_store_health_get(s, &h1);
    /* The heartbeat keeps trying (and failing) about once a second. */
    nanosleep(&(struct timespec){.tv_sec = 1, .tv_nsec = 500 * 1000000L}, NULL);
    devio_store_health h2;
    devio_store_health_get(s, &h2);
    int unset = setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);

    assert_int_equal(set, 0);
    assert_int_equal(unset, 0);
    assert_int_equal(st1, DEVIO_E_IO);
    assert_non_null(strstr(err.message, c->path));
    assert_true(down);
    assert_false(h1.writable);
    assert_true(h1.errors >= 1);
    assert_true(h1.reason[0] != '\0');
    assert_false(h2.writable);
    assert_true(h2.errors > h1.errors);
    assert_int_equal(h2.last_success_ms, h0.last_success_ms);

    /* Lifted: a heartbeat commits within about a second, with nothing queued. */
    assert_true(wait_writable(s, true, 3000));
    devio_store_health h3;
    devio_store_health_get(s, &h3);
    assert_true(h3.last_success_ms >= h0.last_success_ms);
    assert_true(h3.errors >= h2.errors); /* a counter never falls */
    wait_ok(s, launch(s, 3, 3));
    devio_store_close(s);
    /* Ticket 2 never committed; 1 and 3 did. */
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM tickets WHERE id=2"), 0);
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM tickets WHERE id IN (1,3)"), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_id_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_then_recovers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
