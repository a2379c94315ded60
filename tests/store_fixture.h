/* store_fixture.h - what the store tests (store_test.c, store_file_test.c) share: a fresh
 * directory per test whose database must pass PRAGMA integrity_check at teardown, an opened
 * store, raw SQL on the file through a second connection, and ticket rows written and read.
 * Test-only: every helper asserts through cmocka, so a step that goes wrong fails its test. */
#ifndef DEVIO_STORE_FIXTURE_H
#define DEVIO_STORE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "service/store/store.h"

typedef struct ctx {
    char dir[256];
    char path[300];
} ctx;

/* PRAGMA integrity_check through a connection of its own; 1 when "ok". */
int integrity_ok(const char *path);

/* cmocka setup and teardown: a fresh directory under $TEST_TMPDIR (or /tmp) holding
 * devio.db; teardown fails the test when the file it leaves is unsound. */
int setup(void **state);
int teardown(void **state);

/* The store at c->path with `retention` rows kept, asserted to open. */
devio_store *open_store(const ctx *c, uint32_t retention);
/* A single integer from raw SQL on the file (a second connection); -1 without a row. */
int64_t sql_int(const char *path, const char *sql);
void sql_exec(const char *path, const char *sql);
/* devio_store_wait(s, n) asserted to succeed. */
void wait_ok(devio_store *s, uint64_t n);

/* Sequence lists the ticket helpers use: {7, 8} and {1}. */
extern const uint64_t seqs78[2], seq1[1];

/* An in-flight ticket row `id` (2 rows, 17 tokens, sequences 7 and 8); its write number. */
uint64_t launch(devio_store *s, uint64_t id, int64_t launched_ms);
/* Settles ticket `id` with `status` (and error code and message, or NULL); its write number. */
uint64_t settle(devio_store *s, uint64_t id, const char *status, const char *code,
                const char *msg);
/* One page of history, asserted to succeed; the caller frees it. */
devio_ticket_page query(devio_store *s, const char *status, int64_t since, int64_t until,
                        uint64_t before, uint32_t limit);
/* The id of row i of `page`, asserted in range. */
int64_t id_at(const devio_ticket_page *page, size_t i);

#endif
