/* store_file_test.c - the SQLite store's file: adapter rows, metadata, schema versions and
 * migration, open errors, and a crash that loses no committed row. The fixture is store_fixture.h. */
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

#include "tests/store_fixture.h"

static void fill_adapter(devio_adapter_record *a, const char *name, uint32_t rank,
                         devio_adapter_state state)
{
    *a = (devio_adapter_record){.rank = rank, .alpha = 16.0f, .scale = 2.0f, .size = 4096,
                                .state = state, .pinned = true, .loaded_ms = 1234,
                                .last_used_ms = 5678};
    devio_adapter_record_set(a->name, sizeof a->name, name);
    devio_adapter_record_set(a->path, sizeof a->path, "/adapters/x");
    devio_adapter_record_set(a->targets, sizeof a->targets, "q_proj,v_proj");
    devio_adapter_record_set(a->sha256, sizeof a->sha256, "ab12");
}

static void test_adapters(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    devio_error err = {0};
    devio_adapter_record a;
    fill_adapter(&a, "beta", 8, DEVIO_ADAPTER_LOADED);
    assert_int_equal(devio_store_adapter_put(s, &a, &err), DEVIO_OK);
    fill_adapter(&a, "alpha", 8, DEVIO_ADAPTER_LOADED);
    assert_int_equal(devio_store_adapter_put(s, &a, &err), DEVIO_OK);
    fill_adapter(&a, "beta", 4, DEVIO_ADAPTER_FAILED);
    a.pinned = false;
    devio_adapter_record_set(a.reason, sizeof a.reason, "bad shape");
    assert_int_equal(devio_store_adapter_put(s, &a, &err), DEVIO_OK); /* replaces */

    devio_adapter_record *list = NULL;
    size_t n = 0;
    assert_int_equal(devio_store_adapters_list(s, &list, &n, &err), DEVIO_OK);
    assert_int_equal(n, 2);
    const devio_adapter_record *a0 = &list[0], *a1 = &list[1];
    assert_string_equal(a0->name, "alpha");
    assert_true(a0->pinned);
    assert_string_equal(a0->reason, "");
    assert_string_equal(a0->targets, "q_proj,v_proj");
    assert_true(a0->alpha == 16.0f);
    assert_int_equal(a0->size, 4096);
    assert_string_equal(a1->name, "beta");
    assert_int_equal(a1->rank, 4);
    assert_int_equal(a1->state, DEVIO_ADAPTER_FAILED);
    assert_string_equal(a1->reason, "bad shape");
    assert_false(a1->pinned);
    free(list);

    /* One row by name; a name with no row is not an error. */
    bool found = false;
    assert_int_equal(devio_store_adapter_get(s, "beta", &a, &found, &err), DEVIO_OK);
    assert_true(found);
    assert_int_equal(a.rank, 4);
    assert_int_equal(a.loaded_ms, 1234);
    assert_int_equal(a.last_used_ms, 5678);
    assert_string_equal(a.sha256, "ab12");
    assert_int_equal(devio_store_adapter_get(s, "delta", &a, &found, &err), DEVIO_OK);
    assert_false(found);

    fill_adapter(&a, "gamma", 8, (devio_adapter_state)99); /* no such state */
    assert_int_equal(devio_store_adapter_put(s, &a, &err), DEVIO_E_INVALID);
    fill_adapter(&a, "gamma", 8, DEVIO_ADAPTER_LOADED);
    a.alpha = NAN;
    assert_int_equal(devio_store_adapter_put(s, &a, &err), DEVIO_E_INVALID);

    assert_int_equal(devio_store_adapter_delete(s, "beta", &err), DEVIO_OK);
    assert_int_equal(devio_store_adapter_delete(s, "beta", &err), DEVIO_E_UNKNOWN_ADAPTER);
    assert_non_null(strstr(err.message, "beta"));
    devio_store_close(s);

    s = open_store(c, 0); /* rows persist */
    assert_int_equal(devio_store_adapters_list(s, &list, &n, &err), DEVIO_OK);
    assert_int_equal(n, 1);
    assert_string_equal(list[0].name, "alpha");
    free(list);
    devio_store_close(s);
}

static void test_meta(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    devio_error err = {0};
    char buf[16];
    bool found = true;
    assert_int_equal(devio_store_meta_get(s, "model", buf, sizeof buf, &found, &err), DEVIO_OK);
    assert_false(found);
    assert_int_equal(devio_store_meta_set(s, "model", "tiny-llama", &err), DEVIO_OK);
    assert_int_equal(devio_store_meta_set(s, "model", "tiny-bamba", &err), DEVIO_OK);
    assert_int_equal(devio_store_meta_get(s, "model", buf, sizeof buf, &found, &err), DEVIO_OK);
    assert_true(found);
    assert_string_equal(buf, "tiny-bamba");
    char small[4];
    assert_int_equal(devio_store_meta_get(s, "model", small, sizeof small, &found, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_store_meta_set(s, "epoch", "7", &err), DEVIO_E_INVALID);
    assert_int_equal(devio_store_meta_set(s, "schema_version", "7", &err), DEVIO_E_INVALID);
    devio_store_close(s);
    s = open_store(c, 0);
    assert_int_equal(devio_store_meta_get(s, "model", buf, sizeof buf, &found, &err), DEVIO_OK);
    assert_string_equal(buf, "tiny-bamba");
    devio_store_close(s);
}

static void test_future_schema_refused(void **state)
{
    ctx *c = *state;
    sql_exec(c->path, "CREATE TABLE t(a); PRAGMA user_version=99;");
    devio_store *s = (devio_store *)1;
    devio_error err = {0};
    assert_int_equal(devio_store_open(c->path, NULL, &s, &err), DEVIO_E_IO);
    assert_null(s);
    assert_non_null(strstr(err.message, "99"));
    assert_non_null(strstr(err.message, "newer"));
    assert_non_null(strstr(err.message, c->path));
    /* Refusal changes nothing. */
    assert_int_equal(sql_int(c->path, "PRAGMA user_version"), 99);
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM sqlite_master WHERE name='tickets'"),
                     0);
}

static void test_migrate_from_version_0(void **state)
{
    ctx *c = *state;
    /* A database with something in it but no devio schema (version 0). */
    sql_exec(c->path, "CREATE TABLE other(a); INSERT INTO other VALUES(42);");
    devio_store *s = open_store(c, 0);
    assert_int_equal(devio_store_schema_version(s), 5);
    assert_int_equal(devio_store_epoch(s), 1);
    wait_ok(s, launch(s, 1, 1));
    devio_store_close(s);
    assert_int_equal(sql_int(c->path, "PRAGMA user_version"), 5);
    assert_int_equal(sql_int(c->path, "SELECT a FROM other"), 42);

    /* An empty (zero-byte) file is version 0 as well. */
    char p2[400];
    snprintf(p2, sizeof p2, "%s/empty.db", c->dir);
    FILE *f = fopen(p2, "w");
    assert_non_null(f);
    fclose(f);
    devio_store *s2 = NULL;
    devio_error err = {0};
    assert_int_equal(devio_store_open(p2, NULL, &s2, &err), DEVIO_OK);
    assert_int_equal(devio_store_schema_version(s2), 5);
    devio_store_close(s2);
    assert_true(integrity_ok(p2));
}

/* A version-1 file (tickets without request_id) moves to version 4 keeping
 * its rows, whose request_id reads back as none; new rows keep theirs. */
static void test_migrate_from_version_1(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    wait_ok(s, launch(s, 1, 1));
    devio_store_close(s);
    /* Back to what a version-1 build wrote: the column and the keys dropped, version 1. */
    sql_exec(c->path, "ALTER TABLE tickets DROP COLUMN request_id; DROP TABLE idempotency_keys;"
                      " PRAGMA user_version=1;"
                      " UPDATE meta SET value='1' WHERE key='schema_version';");
    s = open_store(c, 0);
    assert_int_equal(devio_store_schema_version(s), 5);
    devio_ticket_record r = {.id = 2, .status = "in_flight", .launched_ms = 2, .rows = 1,
                             .request_id = "req-\"7\""};
    wait_ok(s, devio_store_ticket_launched(s, &r));
    devio_ticket_page page = query(s, NULL, 0, 0, 0, 10);
    assert_int_equal(page.n, 2);
    assert_int_equal(page.rows[0].id, 2);
    assert_string_equal(page.rows[0].request_id, "req-\"7\"");
    assert_int_equal(page.rows[1].id, 1);
    assert_null(page.rows[1].request_id);
    devio_ticket_page_free(&page);
    /* Version 3 allows 'reaped', on the rows carried over as on new ones. */
    devio_ticket_record rp = {.id = 1, .status = "reaped", .error_code = "ticket_reaped",
                              .error_message = "lease"};
    wait_ok(s, devio_store_ticket_settled(s, &rp));
    page = query(s, "reaped", 0, 0, 0, 10);
    assert_int_equal(page.n, 1);
    assert_int_equal(page.rows[0].id, 1);
    assert_string_equal(page.rows[0].status, "reaped");
    devio_ticket_page_free(&page);
    devio_store_close(s);
    assert_int_equal(sql_int(c->path, "PRAGMA user_version"), 5);
    assert_true(integrity_ok(c->path));
}

static void test_open_errors(void **state)
{
    ctx *c = *state;
    char p[400];
    snprintf(p, sizeof p, "%s/missing/sub/devio.db", c->dir);
    devio_store *s = (devio_store *)1;
    devio_error err = {0};
    assert_int_equal(devio_store_open(p, NULL, &s, &err), DEVIO_E_IO);
    assert_null(s);
    assert_non_null(strstr(err.message, p));

    /* A file that is not a database. */
    FILE *f = fopen(c->path, "w");
    assert_non_null(f);
    for (int i = 0; i < 64; i++)
        fputs("this is not an SQLite file\n", f);
    fclose(f);
    assert_int_equal(devio_store_open(c->path, NULL, &s, &err), DEVIO_E_IO);
    assert_null(s);
    assert_non_null(strstr(err.message, c->path));
    unlink(c->path);

    assert_int_equal(devio_store_open(NULL, NULL, &s, &err), DEVIO_E_INVALID);
    devio_store_close(NULL);
}

/* One store per file: a second open of a file a store holds is refused,
 * through a link too, naming the file; SQLite's own readers are not stopped;
 * once the first closes, the file opens again. */
static void test_one_store_per_file(void **state)
{
    ctx *c = *state;
    devio_store *s = open_store(c, 0);
    char link[400];
    snprintf(link, sizeof link, "%s/link.db", c->dir);
    assert_int_equal(symlink(c->path, link), 0);
    const char *paths[] = {c->path, link};
    for (size_t i = 0; i < 2; i++) {
        devio_store *s2 = (devio_store *)1;
        devio_error err = {0};
        assert_int_equal(devio_store_open(paths[i], NULL, &s2, &err), DEVIO_E_IO);
        assert_null(s2);
        char want[600];
        snprintf(want, sizeof want, "ticket store %s: another process holds this file",
                 paths[i]);
        if (!strstr(err.message, want))
            fail_msg("refused with '%s', expected '%s'", err.message, want);
    }
    assert_int_equal(sql_int(c->path, "PRAGMA user_version"), 5);
    assert_int_equal(devio_store_epoch(s), 1);
    devio_store_close(s);
    s = open_store(c, 0);
    assert_int_equal(devio_store_epoch(s), 2);
    devio_store_close(s);
    unlink(link);
}

/* A child writes and waits, then dies by SIGKILL without closing; everything
 * it waited for must be there and the file must be sound. */
static void test_crash_safety(void **state)
{
    ctx *c = *state;
    enum { N = 200, M = 3 };
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        devio_store *s = NULL;
        if (devio_store_open(c->path, NULL, &s, NULL) != DEVIO_OK)
            _exit(2);
        for (uint64_t id = 1; id <= N; id++) {
            devio_ticket_record r = {.id = id, .launched_ms = (int64_t)id, .seqs = seq1,
                                     .n_seqs = 1};
            if (devio_store_wait(s, devio_store_ticket_launched(s, &r), NULL) != DEVIO_OK)
                _exit(3);
            r.status = "ok";
            r.settled_ms = (int64_t)id + 1;
            if (devio_store_wait(s, devio_store_ticket_settled(s, &r), NULL) != DEVIO_OK)
                _exit(4);
        }
        for (uint64_t id = N + 1; id <= N + M; id++) {
            devio_ticket_record r = {.id = id, .launched_ms = (int64_t)id};
            if (devio_store_wait(s, devio_store_ticket_launched(s, &r), NULL) != DEVIO_OK)
                _exit(5);
        }
        /* Queued but never waited for: may or may not be there, never half. */
        for (uint64_t id = N + M + 1; id <= N + M + 50; id++) {
            devio_ticket_record r = {.id = id, .launched_ms = (int64_t)id};
            devio_store_ticket_launched(s, &r);
        }
        raise(SIGKILL); /* dies here, store open, WAL not checkpointed */
        _exit(6);       /* cppcheck-suppress unreachableCode */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);

    char wal[400];
    snprintf(wal, sizeof wal, "%s-wal", c->path);
    assert_int_equal(access(wal, F_OK), 0); /* recovery really goes through the WAL */

    devio_store *s = open_store(c, 0);
    assert_int_equal(devio_store_epoch(s), 2);
    assert_true(devio_store_next_ticket_id(s) >= N + M + 1);
    devio_ticket_page p = query(s, "ok", 0, 0, 0, 1000);
    assert_int_equal(p.n, N);
    assert_int_equal(id_at(&p, 0), N);
    assert_int_equal(id_at(&p, N - 1), 1);
    devio_ticket_page_free(&p);
    p = query(s, "in_flight", 0, 0, 0, 1000);
    assert_int_equal(p.n, 0);
    devio_ticket_page_free(&p);
    p = query(s, "aborted", 0, 0, 0, 1000);
    size_t aborted = p.n;
    assert_true(aborted >= M && aborted <= M + 50);
    devio_ticket_page_free(&p);
    devio_store_close(s);
    assert_true(integrity_ok(c->path));
    assert_int_equal(sql_int(c->path, "SELECT count(*) - count(DISTINCT id) FROM tickets"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_adapters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_meta, setup, teardown),
        cmocka_unit_test_setup_teardown(test_future_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_from_version_0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_from_version_1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_store_per_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_safety, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
