/* store_test.c - the SQLite store's history: group-committed ticket rows, queries, paging,
 * retention, reopening, and writers on many threads. Adapters, metadata, schema and crashes
 * are in store_file_test.c; the fixture is store_fixture.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "common/clock.h"
#include "tests/store_fixture.h"

/* ---- tests ------------------------------------------------------------- */

static void test_new_db(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    assert_int_equal(devio_store_epoch(s), 1);
    assert_int_equal(devio_store_next_ticket_id(s), 1);
    assert_int_equal(devio_store_schema_version(s), 5);

    char buf[32];
    bool found = false;
    devio_error err = {0};
    assert_int_equal(devio_store_meta_get(s, "schema_version", buf, sizeof buf, &found, &err),
                     DEVIO_OK);
    assert_true(found);
    assert_string_equal(buf, "5");
    assert_int_equal(devio_store_meta_get(s, "epoch", buf, sizeof buf, &found, &err), DEVIO_OK);
    assert_string_equal(buf, "1");

    devio_ticket_page page = query(s, NULL, 0, 0, 0, 10);
    assert_int_equal(page.n, 0);
    assert_true(!page.has_next);
    devio_ticket_page_free(&page);
    devio_store_close(s);

    assert_int_equal(sql_int(c->path, "PRAGMA user_version"), 5);
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM sqlite_master WHERE type='table'"
                                      " AND name IN ('meta','tickets','adapters')"),
                     3);
    /* The file is left in WAL mode (a persistent property of the file). */
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open(c->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static void test_launch_settle_query(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    launch(s, 1, 1000);
    launch(s, 2, 1001);
    launch(s, 3, 1002);
    assert_int_equal(devio_store_next_ticket_id(s), 4);
    settle(s, 1, "ok", NULL, NULL);
    uint64_t n = settle(s, 2, "failed", "device_error", "boom");
    wait_ok(s, n);

    devio_ticket_page page = query(s, NULL, 0, 0, 0, 10);
    devio_ticket_row *t = page.rows;
    assert_int_equal(page.n, 3);
    assert_int_equal(id_at(&page, 0), 3);
    assert_int_equal(id_at(&page, 1), 2);
    assert_int_equal(id_at(&page, 2), 1);
    assert_true(!page.has_next);

    const devio_ticket_row *t3 = &t[0];
    assert_string_equal(t3->status, "in_flight");
    assert_false(t3->has_settled_ms);
    assert_false(t3->has_queued_us);
    assert_null(t3->error_code);
    assert_int_equal(t3->epoch, 1);
    assert_int_equal(t3->launched_ms, 1002);

    const devio_ticket_row *t2 = &t[1];
    assert_string_equal(t2->status, "failed");
    assert_non_null(t2->error_code);
    assert_string_equal(t2->error_code, "device_error");
    assert_string_equal(t2->error_message, "boom");

    const devio_ticket_row *t1 = &t[2];
    assert_string_equal(t1->status, "ok");
    assert_true(t1->has_settled_ms);
    assert_int_equal(t1->settled_ms, 5001);
    assert_int_equal(t1->rows, 2);
    assert_int_equal(t1->tokens, 17);
    assert_true(t1->has_queued_us && t1->has_compute_us);
    assert_int_equal(t1->queued_us, 10);
    assert_int_equal(t1->compute_us, 20);
    assert_int_equal(t1->n_seqs, 2);
    assert_int_equal(t1->seqs[0], 7);
    assert_int_equal(t1->seqs[1], 8);
    assert_null(t1->error_code);
    devio_ticket_page_free(&page);
    devio_store_close(s);
}

/* The sequence list is stored as the JSON text "[7,8]", as files written
 * before have it; text that is not such a list reads as no sequences. */
static void test_seqs_column(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    launch(s, 1, 1000);
    launch(s, 2, 1001);
    wait_ok(s, launch(s, 3, 1002));
    assert_int_equal(sql_int(c->path, "SELECT seqs = '[7,8]' FROM tickets WHERE id = 1"), 1);
    sql_exec(c->path, "UPDATE tickets SET seqs = '[9]' WHERE id = 2");
    sql_exec(c->path, "UPDATE tickets SET seqs = '[7,-8]' WHERE id = 3");
    devio_ticket_page page = query(s, NULL, 0, 0, 0, 10);
    assert_int_equal(page.n, 3);
    assert_int_equal(page.rows[0].n_seqs, 0); /* id 3: not a list of ids */
    assert_null(page.rows[0].seqs);
    assert_int_equal(page.rows[1].n_seqs, 1);
    assert_int_equal(page.rows[1].seqs[0], 9);
    assert_int_equal(page.rows[2].n_seqs, 2);
    assert_int_equal(page.rows[2].seqs[1], 8);
    devio_ticket_page_free(&page);
    devio_store_close(s);
}

/* A settle's answer is kept with its row and read back by id; a second
 * settle without one keeps it; an id with no row reads as none. */
static void test_answer_by_id(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    launch(s, 1, 1000);
    launch(s, 3, 1001);
    devio_ticket_record r = {.id = 1, .status = "ok", .settled_ms = 5, .answer = "{\"ticket\":1}"};
    wait_ok(s, devio_store_ticket_settled(s, &r));
    devio_ticket_record again = {.id = 1, .status = "reaped", .error_code = "ticket_reaped",
                                 .error_message = "lease"};
    wait_ok(s, devio_store_ticket_settled(s, &again));
    devio_ticket_page p;
    devio_error err = {0};
    assert_int_equal(devio_store_ticket_get(s, 1, &p, &err), DEVIO_OK);
    assert_int_equal(p.n, 1);
    assert_string_equal(p.rows[0].answer, "{\"ticket\":1}");
    assert_string_equal(p.rows[0].status, "reaped");
    devio_ticket_page_free(&p);
    assert_int_equal(devio_store_ticket_get(s, 3, &p, &err), DEVIO_OK);
    assert_int_equal(p.n, 1);
    assert_null(p.rows[0].answer);
    devio_ticket_page_free(&p);
    for (uint64_t id = 2; id <= 4; id += 2) {
        assert_int_equal(devio_store_ticket_get(s, id, &p, &err), DEVIO_OK);
        assert_int_equal(p.n, 0);
        devio_ticket_page_free(&p);
    }
    devio_store_close(s);
}

static void test_status_filter(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    for (uint64_t id = 1; id <= 6; id++)
        launch(s, id, 100);
    settle(s, 1, "ok", NULL, NULL);
    settle(s, 2, "failed", "device_error", "x");
    settle(s, 4, "ok", NULL, NULL);
    wait_ok(s, settle(s, 5, "failed", "device_error", "y"));

    devio_ticket_page p = query(s, "failed", 0, 0, 0, 10);
    assert_int_equal(p.n, 2);
    assert_int_equal(id_at(&p, 0), 5);
    assert_int_equal(id_at(&p, 1), 2);
    devio_ticket_page_free(&p);
    p = query(s, "in_flight", 0, 0, 0, 10);
    assert_int_equal(p.n, 2);
    assert_int_equal(id_at(&p, 0), 6);
    assert_int_equal(id_at(&p, 1), 3);
    devio_ticket_page_free(&p);
    p = query(s, "ok", 0, 0, 0, 10);
    assert_int_equal(p.n, 2);
    devio_ticket_page_free(&p);
    p = query(s, "aborted", 0, 0, 0, 10);
    assert_int_equal(p.n, 0);
    devio_ticket_page_free(&p);

    devio_ticket_query q = {.status = "done", .limit = 10};
    devio_ticket_page out = {.n = 1};
    devio_error err = {0};
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_E_INVALID);
    assert_null(out.rows);
    assert_int_equal(out.n, 0);
    devio_store_close(s);
}

static void test_time_window(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    uint64_t n = 0;
    for (uint64_t id = 1; id <= 10; id++)
        n = launch(s, id, (int64_t)id * 1000);
    wait_ok(s, n);

    devio_ticket_page p = query(s, NULL, 3000, 6000, 0, 100);
    assert_int_equal(p.n, 3);
    assert_int_equal(id_at(&p, 0), 5);
    assert_int_equal(id_at(&p, 2), 3);
    devio_ticket_page_free(&p);
    p = query(s, NULL, 8000, 0, 0, 100);
    assert_int_equal(p.n, 3);
    assert_int_equal(id_at(&p, 0), 10);
    devio_ticket_page_free(&p);
    p = query(s, NULL, 0, 2001, 0, 100);
    assert_int_equal(p.n, 2);
    assert_int_equal(id_at(&p, 0), 2);
    devio_ticket_page_free(&p);
    p = query(s, "in_flight", 4000, 4001, 0, 100);
    assert_int_equal(p.n, 1);
    assert_int_equal(id_at(&p, 0), 4);
    devio_ticket_page_free(&p);

    devio_ticket_query q = {.since_ms = 5000, .until_ms = 4000, .limit = 10};
    devio_ticket_page out;
    assert_int_equal(devio_store_tickets_query(s, &q, &out, NULL), DEVIO_E_INVALID);
    devio_store_close(s);
}

static void test_pagination(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    uint64_t n = 0;
    for (uint64_t id = 1; id <= 25; id++)
        n = launch(s, id, 100);
    wait_ok(s, n);

    int64_t expect = 25;
    uint64_t before = 0;
    int pages = 0;
    size_t sizes[3] = {10, 10, 5};
    for (;;) {
        devio_ticket_page p = query(s, NULL, 0, 0, before, 10);
        assert_true(pages < 3);
        assert_int_equal(p.n, sizes[pages]);
        for (size_t i = 0; i < p.n; i++)
            assert_int_equal(id_at(&p, i), expect--);
        pages++;
        if (!p.has_next) {
            devio_ticket_page_free(&p);
            break;
        }
        assert_int_equal(p.next, id_at(&p, p.n - 1));
        before = p.next;
        devio_ticket_page_free(&p);
    }
    assert_int_equal(pages, 3);
    assert_int_equal(expect, 0);

    /* Exactly a full last page: next is null, not a page of nothing. */
    devio_ticket_page p = query(s, NULL, 0, 0, 0, 25);
    assert_int_equal(p.n, 25);
    assert_true(!p.has_next);
    devio_ticket_page_free(&p);
    devio_store_close(s);
}

static void test_limit_bounds(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    devio_error err = {0};
    devio_ticket_page out;
    devio_ticket_query q = {.limit = 0};
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_E_INVALID);
    assert_string_equal(err.detail_key, "limit");
    assert_null(out.rows);
    q.limit = 1001;
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_E_INVALID);
    q.limit = 1000;
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_OK);
    devio_ticket_page_free(&out);
    q.limit = 1;
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_OK);
    devio_ticket_page_free(&out);
    q.before_id = (uint64_t)INT64_MAX + 1;
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_E_INVALID);
    q.before_id = 0;
    q.since_ms = -1;
    assert_int_equal(devio_store_tickets_query(s, &q, &out, &err), DEVIO_E_INVALID);
    devio_store_close(s);
}

static void test_bad_records_and_waits(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    devio_ticket_record r = {.id = 0, .launched_ms = 1};
    assert_int_equal(devio_store_ticket_launched(s, &r), 0);
    r.id = 1;
    r.status = "running";
    assert_int_equal(devio_store_ticket_launched(s, &r), 0);
    assert_int_equal(devio_store_ticket_settled(s, &r), 0);
    r.status = "in_flight";
    assert_int_equal(devio_store_ticket_settled(s, &r), 0); /* a settle cannot be in flight */
    r.status = NULL; /* defaults to in_flight */
    uint64_t n = devio_store_ticket_launched(s, &r);
    assert_true(n > 0);
    assert_int_equal(devio_store_ticket_launched(NULL, &r), 0);

    devio_error err = {0};
    assert_int_equal(devio_store_wait(s, 0, &err), DEVIO_OK);
    assert_int_equal(devio_store_wait(s, n + 100, &err), DEVIO_E_INVALID);
    wait_ok(s, n);

    /* A repeated id fails alone; the writes around it still commit. */
    uint64_t dup = launch(s, 1, 2);
    uint64_t after = launch(s, 2, 3);
    assert_int_equal(devio_store_wait(s, dup, &err), DEVIO_E_IO);
    assert_non_null(strstr(err.message, "UNIQUE"));
    assert_non_null(strstr(err.message, c->path));
    wait_ok(s, after);

    /* A settle whose launch row is missing still records the outcome. */
    wait_ok(s, settle(s, 9, "ok", NULL, NULL));
    devio_ticket_page p = query(s, "ok", 0, 0, 0, 10);
    assert_int_equal(p.n, 1);
    assert_int_equal(id_at(&p, 0), 9);
    devio_ticket_page_free(&p);
    /* A settle without a status is "ok", or "failed" with an error code. */
    devio_ticket_record f = {.id = 2, .error_code = "device_error", .error_message = "m"};
    wait_ok(s, devio_store_ticket_settled(s, &f));
    p = query(s, "failed", 0, 0, 0, 10);
    assert_int_equal(p.n, 1);
    assert_int_equal(id_at(&p, 0), 2);
    devio_ticket_page_free(&p);
    devio_store_close(s);
}

/* A key's answer is written once (the first wins), read back with what it
 * answered, and forgotten after DEVIO_KEY_KEEP_MS; across a reopen too. */
static void test_idempotency_keys(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    devio_error err = {0};
    devio_key_record a = {.key = "k1", .request = "POST /v1/sequences", .digest = "d1",
                          .code = 201, .answer = "{\"seq\":7}"};
    wait_ok(s, devio_store_key_put(s, &a));
    devio_key_record b = a;
    b.answer = "{\"seq\":8}";
    wait_ok(s, devio_store_key_put(s, &b));
    devio_key_record old = {.key = "k0", .request = "POST /v1/effects", .digest = "d0",
                            .code = 200, .answer = "{}",
                            .created_ms = devio_unix_ms() - DEVIO_KEY_KEEP_MS - 1000};
    wait_ok(s, devio_store_key_put(s, &old));
    devio_key_record none = {0};
    assert_int_equal(devio_store_key_put(s, &none), 0);
    devio_store_close(s);
    s = open_store(c, 0);
    devio_key_record got;
    bool found = false;
    assert_int_equal(devio_store_key_get(s, "k1", &got, &found, &err), DEVIO_OK);
    assert_true(found);
    assert_string_equal(got.answer, "{\"seq\":7}");
    assert_string_equal(got.request, "POST /v1/sequences");
    assert_string_equal(got.digest, "d1");
    assert_int_equal(got.code, 201);
    devio_key_record_free(&got);
    assert_int_equal(devio_store_key_get(s, "k0", &got, &found, &err), DEVIO_OK);
    assert_false(found);
    assert_int_equal(devio_store_key_get(s, "nope", &got, &found, &err), DEVIO_OK);
    assert_false(found);
    /* A newer key's write deletes the expired one from the file. */
    devio_key_record d = {.key = "k2", .request = "POST /v1/launch", .digest = "d2", .code = 202,
                          .answer = "{\"ticket\":1}"};
    wait_ok(s, devio_store_key_put(s, &d));
    devio_store_close(s);
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM idempotency_keys"), 2);
}

static void test_reopen(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    for (uint64_t id = 1; id <= 5; id++)
        launch(s, id, 100 + (int64_t)id);
    settle(s, 1, "ok", NULL, NULL);
    settle(s, 2, "ok", NULL, NULL);
    wait_ok(s, settle(s, 3, "failed", "device_error", "bad"));
    devio_store_close(s);

    s = open_store(c, 0);
    assert_int_equal(devio_store_epoch(s), 2);
    /* The first process reserved ids up to 1024 with its first launch row. */
    assert_int_equal(devio_store_next_ticket_id(s), 1025);
    devio_ticket_page p = query(s, "aborted", 0, 0, 0, 10);
    assert_int_equal(p.n, 2);
    assert_int_equal(id_at(&p, 0), 5);
    assert_int_equal(id_at(&p, 1), 4);
    assert_string_equal(p.rows[0].error_code, "aborted");
    assert_non_null(strstr(p.rows[0].error_message, "process ended"));
    devio_ticket_page_free(&p);
    p = query(s, "ok", 0, 0, 0, 10);
    assert_int_equal(p.n, 2);
    assert_int_equal(p.rows[0].settled_ms, 5002);
    assert_int_equal(p.rows[0].epoch, 1);
    devio_ticket_page_free(&p);
    p = query(s, "failed", 0, 0, 0, 10);
    assert_int_equal(p.n, 1);
    devio_ticket_page_free(&p);
    /* New tickets carry the new epoch. */
    wait_ok(s, launch(s, 6, 200));
    p = query(s, NULL, 0, 0, 0, 1);
    assert_int_equal(p.rows[0].epoch, 2);
    devio_ticket_page_free(&p);
    devio_store_close(s);

    /* Ids never repeat even when the history itself is emptied. */
    sql_exec(c->path, "DELETE FROM tickets");
    s = open_store(c, 0);
    assert_int_equal(devio_store_epoch(s), 3);
    assert_int_equal(devio_store_next_ticket_id(s), 1025);
    devio_store_close(s);
}

static void test_close_flushes(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    for (uint64_t id = 1; id <= 300; id++) {
        launch(s, id, 1);
        settle(s, id, "ok", NULL, NULL);
    }
    devio_store_close(s); /* no wait: close must commit what was queued */
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM tickets WHERE status='ok'"), 300);
}

static void test_abort_in_flight(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    launch(s, 1, 1);
    launch(s, 2, 2);
    launch(s, 3, 3);
    settle(s, 2, "ok", NULL, NULL);
    uint64_t n = devio_store_abort_in_flight(s, "teardown");
    assert_true(n > 0);
    uint64_t later = launch(s, 4, 4); /* queued after the abort: untouched */
    wait_ok(s, n);
    wait_ok(s, later);
    devio_ticket_page p = query(s, "aborted", 0, 0, 0, 10);
    assert_int_equal(p.n, 2);
    assert_int_equal(id_at(&p, 0), 3);
    assert_int_equal(id_at(&p, 1), 1);
    const devio_ticket_row *t = &p.rows[0];
    assert_true(t->has_settled_ms);
    assert_string_equal(t->error_code, "aborted");
    assert_string_equal(t->error_message, "teardown");
    devio_ticket_page_free(&p);
    p = query(s, "in_flight", 0, 0, 0, 10);
    assert_int_equal(p.n, 1);
    assert_int_equal(id_at(&p, 0), 4);
    devio_ticket_page_free(&p);
    devio_store_close(s);
}

static void test_retention(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 10);
    launch(s, 1, 1); /* stays in flight: must survive trimming */
    uint64_t n = 0;
    for (uint64_t id = 2; id <= 601; id++) {
        launch(s, id, (int64_t)id);
        n = settle(s, id, "ok", NULL, NULL);
        if (id % 50 == 0)
            wait_ok(s, n); /* several batches, several trims */
    }
    wait_ok(s, n);
    /* The reserved high-water mark covers every deleted id. */
    assert_true(sql_int(c->path, "SELECT CAST(value AS INTEGER) FROM meta"
                                 " WHERE key='ticket_id_high'") >=
                sql_int(c->path, "SELECT min(id) FROM tickets WHERE status='ok'") - 1);
    devio_ticket_page p = query(s, "ok", 0, 0, 0, 1000);
    size_t kept = p.n;
    /* At most retention + slack (1 for a retention of 10) settled rows. */
    assert_true(kept >= 9 && kept <= 11);
    for (size_t i = 0; i < kept; i++)
        assert_int_equal(id_at(&p, i), 601 - (int64_t)i); /* the newest */
    devio_ticket_page_free(&p);
    p = query(s, "in_flight", 0, 0, 0, 10);
    assert_int_equal(p.n, 1);
    assert_int_equal(id_at(&p, 0), 1);
    devio_ticket_page_free(&p);
    devio_store_close(s);
    assert_true(sql_int(c->path, "SELECT count(*) FROM tickets") <= 12);

    /* Trimming never lowers the next id. */
    s = open_store(c, 0);
    assert_int_equal(devio_store_next_ticket_id(s), 1025);
    devio_store_close(s);
}

typedef struct worker {
    devio_store *s;
    _Atomic uint64_t *next_id;
    int count;
    int failures;
} worker;

/* The server's pattern per ticket: launch, wait, settle, wait. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < w->count; i++) {
        uint64_t id = atomic_fetch_add(w->next_id, 1);
        devio_ticket_record r = {.id = id, .launched_ms = (int64_t)id, .rows = 1, .tokens = 1,
                                 .seqs = seq1, .n_seqs = 1};
        if (devio_store_wait(w->s, devio_store_ticket_launched(w->s, &r), NULL) != DEVIO_OK)
            w->failures++;
        r.status = "ok";
        r.settled_ms = (int64_t)id + 1;
        uint64_t n = devio_store_ticket_settled(w->s, &r);
        if (n == 0 || devio_store_wait(w->s, n, NULL) != DEVIO_OK)
            w->failures++;
    }
    return NULL;
}

static double run_workers(devio_store *s, int threads, int total, uint64_t first_id)
{
    _Atomic uint64_t next = first_id;
    pthread_t th[16];
    worker w[16];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++) {
        w[i] = (worker){.s = s, .next_id = &next, .count = total / threads};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

static void test_many_threads(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    run_workers(s, 8, 2000, 1);
    assert_int_equal(devio_store_next_ticket_id(s), 2001);

    /* Every id 1..2000 comes back once through the paged history. */
    static unsigned char seen[2001];
    memset(seen, 0, sizeof seen);
    uint64_t before = 0;
    size_t total = 0;
    for (;;) {
        devio_ticket_page p = query(s, "ok", 0, 0, before, 1000);
        for (size_t i = 0; i < p.n; i++) {
            int64_t id = id_at(&p, i);
            assert_true(id >= 1 && id <= 2000);
            assert_int_equal(seen[id], 0);
            seen[id] = 1;
            total++;
        }
        before = p.has_next ? p.next : 0;
        devio_ticket_page_free(&p);
        if (!before)
            break;
    }
    assert_int_equal(total, 2000);
    devio_store_close(s);
    assert_int_equal(sql_int(c->path, "SELECT count(DISTINCT id) FROM tickets"), 2000);
}

/* Throughput of the server's per-ticket pattern (2 writes, 2 waits). The
 * figures are printed; the assertion is only that every write committed. */
static void test_throughput(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    const int n1 = 2000, n8 = 8000;
    double t1 = run_workers(s, 1, n1, 1);
    double t8 = run_workers(s, 8, n8, (uint64_t)n1 + 1);
    print_message("store: 1 thread  %.0f tickets/s (%.0f writes/s)\n", n1 / t1, 2 * n1 / t1);
    print_message("store: 8 threads %.0f tickets/s (%.0f writes/s)\n", n8 / t8, 2 * n8 / t8);
    devio_store_close(s);
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM tickets WHERE status='ok'"),
                     n1 + n8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_new_db, setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch_settle_query, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seqs_column, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_answer_by_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_time_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pagination, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limit_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_records_and_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_flushes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_throughput, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
