/* store_fixture.c - the store tests' shared fixture (see store_fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "tests/store_fixture.h"
#include "tests/testutil.h"

/* ---- fixtures ---------------------------------------------------------- */

/* PRAGMA integrity_check through a connection of its own; 1 when "ok". */
int integrity_ok(const char *path)
{
    sqlite3 *db = NULL;
    int ok = 0;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            ok = strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return ok;
}

int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(c->dir, sizeof c->dir, "%s/devio_store_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(c->dir)) {
        free(c);
        return -1;
    }
    snprintf(c->path, sizeof c->path, "%s/devio.db", c->dir);
    *state = c;
    return 0;
}

int teardown(void **state)
{
    ctx *c = *state;
    struct stat st;
    /* Whatever a test did, the file it leaves must be sound. */
    int ok = stat(c->path, &st) != 0 || integrity_ok(c->path);
    devio_rmtree(c->dir);
    free(c);
    return ok ? 0 : -1;
}

devio_store *open_store(const ctx *c, uint32_t retention)
{
    devio_store_options o = devio_store_options_default();
    o.retention = retention;
    devio_store *s = NULL;
    devio_error err = {0};
    devio_status st = devio_store_open(c->path, &o, &s, &err);
    if (st != DEVIO_OK)
        print_message("open failed: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
    assert_non_null(s);
    return s;
}

/* A single integer from raw SQL on the file (a second connection). */
int64_t sql_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

void sql_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

void wait_ok(devio_store *s, uint64_t n)
{
    devio_error err = {0};
    assert_true(n > 0);
    devio_status st = devio_store_wait(s, n, &err);
    if (st != DEVIO_OK)
        print_message("wait failed: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
}

const uint64_t seqs78[2] = {7, 8}, seq1[1] = {1};

uint64_t launch(devio_store *s, uint64_t id, int64_t launched_ms)
{
    devio_ticket_record r = {.id = id, .status = "in_flight", .launched_ms = launched_ms,
                             .rows = 2, .tokens = 17, .seqs = seqs78, .n_seqs = 2};
    uint64_t n = devio_store_ticket_launched(s, &r);
    assert_true(n > 0);
    return n;
}

uint64_t settle(devio_store *s, uint64_t id, const char *status, const char *code,
                       const char *msg)
{
    devio_ticket_record r = {.id = id, .status = status, .settled_ms = 5000 + (int64_t)id,
                             .queued_us = 10, .compute_us = 20, .error_code = code,
                             .error_message = msg};
    uint64_t n = devio_store_ticket_settled(s, &r);
    assert_true(n > 0);
    return n;
}

devio_ticket_page query(devio_store *s, const char *status, int64_t since, int64_t until,
                               uint64_t before, uint32_t limit)
{
    devio_ticket_query q = {.status = status, .since_ms = since, .until_ms = until,
                            .before_id = before, .limit = limit};
    devio_ticket_page out;
    devio_error err = {0};
    devio_status st = devio_store_tickets_query(s, &q, &out, &err);
    if (st != DEVIO_OK)
        print_message("query failed: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
    assert_true(out.n == 0 || out.rows != NULL);
    return out;
}

int64_t id_at(const devio_ticket_page *page, size_t i)
{
    assert_true(i < page->n);
    return (int64_t)page->rows[i].id;
}
