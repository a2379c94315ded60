/* store_schema.c - opening the store's file: connections, WAL, schema migrations, epoch, leftovers aborted.
 * Everything open changes happens in one transaction; it must never reuse a ticket id or accept a newer schema. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "device/status.h"
#include "service/store/store_internal.h"

/* migrations[i] moves the schema from version i to version i+1, inside the
 * open transaction. A new schema version is one more entry here; the version
 * a file is at is PRAGMA user_version (part of the database header, so it
 * commits or rolls back with the migration), mirrored into meta. */
static const char *const migrations[] = {
    /* 0 -> 1: the initial schema */
    "CREATE TABLE meta("
    "  key TEXT PRIMARY KEY,"
    "  value TEXT NOT NULL);"
    "CREATE TABLE tickets("
    "  id INTEGER PRIMARY KEY,"
    "  epoch INTEGER NOT NULL,"
    "  status TEXT NOT NULL CHECK(status IN ('in_flight','ok','failed','aborted')),"
    "  launched_ms INTEGER NOT NULL,"
    "  settled_ms INTEGER,"
    "  rows INTEGER NOT NULL DEFAULT 0,"
    "  tokens INTEGER NOT NULL DEFAULT 0,"
    "  seqs TEXT,"
    "  queued_us INTEGER,"
    "  compute_us INTEGER,"
    "  error_code TEXT,"
    "  error_message TEXT);"
    "CREATE INDEX tickets_status_id ON tickets(status, id);"
    "CREATE INDEX tickets_launched ON tickets(launched_ms);"
    "CREATE TABLE adapters("
    "  name TEXT PRIMARY KEY,"
    "  path TEXT NOT NULL,"
    "  rank INTEGER NOT NULL,"
    "  alpha REAL NOT NULL,"
    "  scale REAL NOT NULL,"
    "  targets TEXT NOT NULL,"
    "  sha256 TEXT,"
    "  size INTEGER NOT NULL DEFAULT 0,"
    "  state TEXT NOT NULL CHECK(state IN ('loaded','unloaded','stale','failed')),"
    "  pinned INTEGER NOT NULL DEFAULT 0 CHECK(pinned IN (0,1)),"
    "  loaded_ms INTEGER NOT NULL DEFAULT 0,"
    "  last_used_ms INTEGER NOT NULL DEFAULT 0,"
    "  reason TEXT);"
    "INSERT INTO meta(key, value) VALUES('epoch', '0'), ('ticket_id_high', '0');",
    /* 1 -> 2: the request id of the launch (X-Request-Id), NULL for rows before it */
    "ALTER TABLE tickets ADD COLUMN request_id TEXT;",
    /* 2 -> 3: status 'reaped' (settled by the server for nobody). SQLite cannot
     * change a CHECK in place: the table is copied into one that allows it. */
    "CREATE TABLE tickets_v3("
    "  id INTEGER PRIMARY KEY,"
    "  epoch INTEGER NOT NULL,"
    "  status TEXT NOT NULL CHECK(status IN ('in_flight','ok','failed','aborted','reaped')),"
    "  launched_ms INTEGER NOT NULL,"
    "  settled_ms INTEGER,"
    "  rows INTEGER NOT NULL DEFAULT 0,"
    "  tokens INTEGER NOT NULL DEFAULT 0,"
    "  seqs TEXT,"
    "  queued_us INTEGER,"
    "  compute_us INTEGER,"
    "  error_code TEXT,"
    "  error_message TEXT,"
    "  request_id TEXT);"
    "INSERT INTO tickets_v3 SELECT id, epoch, status, launched_ms, settled_ms, rows, tokens, seqs,"
    "  queued_us, compute_us, error_code, error_message, request_id FROM tickets;"
    "DROP TABLE tickets;"
    "ALTER TABLE tickets_v3 RENAME TO tickets;"
    "CREATE INDEX tickets_status_id ON tickets(status, id);"
    "CREATE INDEX tickets_launched ON tickets(launched_ms);",
    /* 3 -> 4: the answer a settle gave (the step result's JSON), NULL before */
    "ALTER TABLE tickets ADD COLUMN answer TEXT;",
    /* 4 -> 5: the answers given to requests that carried an Idempotency-Key */
    "CREATE TABLE idempotency_keys("
    "  key TEXT PRIMARY KEY,"
    "  request TEXT NOT NULL,"
    "  digest TEXT NOT NULL,"
    "  code INTEGER NOT NULL,"
    "  answer TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE INDEX idempotency_keys_created ON idempotency_keys(created_ms);",
};
#define SCHEMA_LATEST ((uint32_t)(sizeof migrations / sizeof migrations[0]))

/* Pragmas shared by both connections. synchronous=NORMAL in WAL mode makes a
 * commit durable against a crash of this process (the WAL frames are in the
 * OS before COMMIT returns), which is what history needs; only a power loss
 * can drop the last few commits, and never corrupts the file. */
static int configure(sqlite3 *db, uint32_t busy_ms)
{
    int rc = sqlite3_busy_timeout(db, (int)(busy_ms > INT32_MAX ? INT32_MAX : busy_ms));
    if (rc == SQLITE_OK)
        rc = store_exec(db, "PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL;");
    return rc;
}

devio_status store_connect(const char *path, uint32_t busy_ms, sqlite3 **out, devio_error *err)
{
    sqlite3 *db = NULL;
    *out = NULL;
    /* NOMUTEX: each connection is used by one thread at a time under our own
     * locks, so SQLite's per-connection mutex would be pure overhead. */
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        devio_status st = store_sql_fail(err, db, path, "cannot open");
        sqlite3_close(db);
        return st;
    }
    sqlite3_extended_result_codes(db, 1);
    if (configure(db, busy_ms) != SQLITE_OK) {
        devio_status st = store_sql_fail(err, db, path, "cannot configure");
        sqlite3_close(db);
        return st;
    }
    *out = db;
    return DEVIO_OK;
}

static int meta_put_int(sqlite3 *db, const char *key, int64_t v)
{
    char txt[32];
    snprintf(txt, sizeof txt, "%" PRId64, v);
    return store_meta_put(db, key, txt);
}

/* For a file from before the marks, the largest id of each kind its rows
 * name: the sequences of launch rows and answers, the logits handles of
 * answers, the sequences of keyed answers (create, fork). */
static const char *const legacy_ids[STORE_N_ID_KINDS] = {
    "SELECT max(v) FROM ("
    " SELECT max(j.value) AS v FROM tickets t, json_each(t.seqs) j WHERE json_valid(t.seqs)"
    " UNION ALL SELECT max(json_extract(answer, '$.seq')) FROM idempotency_keys"
    "  WHERE json_valid(answer))",
    "SELECT max(json_extract(r.value, '$.logits')) FROM tickets t, json_each(t.answer, '$.rows') r"
    " WHERE t.answer IS NOT NULL AND json_valid(t.answer)",
};

/* The sequence and logits id marks (store.h, devio_store_first_ids), each
 * recorded in meta once this open commits. */
static devio_status read_id_marks(devio_store *s, sqlite3 *db, devio_error *err)
{
    for (int k = 0; k < STORE_N_ID_KINDS; k++) {
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='%s'",
                 store_id_marks[k]);
        int64_t hi = 0;
        bool found = false;
        if (store_query_int(db, sql, &hi, &found) != SQLITE_OK ||
            (!found && store_query_int(db, legacy_ids[k], &hi, NULL) != SQLITE_OK) ||
            meta_put_int(db, store_id_marks[k], hi < 0 ? 0 : hi) != SQLITE_OK)
            return store_sql_fail(err, db, s->path, "cannot read the sequence and logits ids");
        s->ids_reserved[k] = hi < 0 ? 0 : hi;
        atomic_store(&s->ids_used[k], (uint64_t)s->ids_reserved[k]);
    }
    return DEVIO_OK;
}

static devio_status set_wal(devio_store *s, devio_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->wdb, "PRAGMA journal_mode=WAL", -1, &st, NULL) != SQLITE_OK)
        return store_sql_fail(err, s->wdb, s->path, "cannot read the journal mode");
    int rc = sqlite3_step(st);
    char mode[16] = "";
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(mode, sizeof mode, "%s", (const char *)sqlite3_column_text(st, 0));
    devio_status out = DEVIO_OK;
    if (rc != SQLITE_ROW)
        out = store_sql_fail(err, s->wdb, s->path, "cannot switch to WAL");
    else if (strcmp(mode, "wal") != 0)
        out = devio_fail(err, DEVIO_E_IO,
                         "ticket store %s: journal mode is '%s', WAL is required", s->path, mode);
    sqlite3_finalize(st);
    return out;
}

/* Everything open does to the file happens in this one transaction, so a
 * crash during open leaves the file as the last process left it. */
static devio_status open_txn(devio_store *s, devio_error *err)
{
    sqlite3 *db = s->wdb;
    devio_status st;
    int64_t v = 0;
    bool found = false;

    if (store_exec(db, "BEGIN IMMEDIATE") != SQLITE_OK)
        return store_sql_fail(err, db, s->path, "cannot begin the open transaction");

    if (store_query_int(db, "PRAGMA user_version", &v, NULL) != SQLITE_OK) {
        st = store_sql_fail(err, db, s->path, "cannot read the schema version");
        goto out_rollback;
    }
    if (v < 0 || v > (int64_t)SCHEMA_LATEST) {
        st = devio_fail(err, DEVIO_E_IO,
                        "ticket store %s: schema version %" PRId64
                        " is newer than this build supports (%u); use a newer devio",
                        s->path, v, SCHEMA_LATEST);
        goto out_rollback;
    }
    for (uint32_t ver = (uint32_t)v; ver < SCHEMA_LATEST; ver++) {
        if (store_exec(db, migrations[ver]) != SQLITE_OK) {
            char what[64];
            snprintf(what, sizeof what, "migration to schema version %u failed", ver + 1);
            st = store_sql_fail(err, db, s->path, what);
            goto out_rollback;
        }
        char pragma[48];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%u", ver + 1);
        if (store_exec(db, pragma) != SQLITE_OK ||
            meta_put_int(db, "schema_version", (int64_t)ver + 1) != SQLITE_OK) {
            st = store_sql_fail(err, db, s->path, "cannot record the schema version");
            goto out_rollback;
        }
    }
    s->schema_version = SCHEMA_LATEST;

    v = 0;
    if (store_query_int(db, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='epoch'", &v,
                        NULL) != SQLITE_OK ||
        meta_put_int(db, "epoch", v + 1) != SQLITE_OK) {
        st = store_sql_fail(err, db, s->path, "cannot advance the epoch");
        goto out_rollback;
    }
    s->epoch = (uint64_t)v + 1;

    /* settled_ms stays NULL: when the earlier process died is unknown. */
    if (store_exec(db, "UPDATE tickets SET status='aborted', error_code='aborted',"
                       " error_message='process ended before the ticket settled'"
                       " WHERE status='in_flight'") != SQLITE_OK) {
        st = store_sql_fail(err, db, s->path, "cannot abort tickets left in flight");
        goto out_rollback;
    }

    /* The high-water mark survives history being trimmed or deleted, so ids
     * are never reused across restarts: this process starts past it (past the
     * whole range the last one reserved, used or not). A file from a build
     * that kept no range may hold ids above it: max(id) covers those. */
    int64_t hi = 0, maxid = 0;
    if (store_query_int(db, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='ticket_id_high'",
                        &hi, NULL) != SQLITE_OK ||
        store_query_int(db, "SELECT max(id) FROM tickets", &maxid, &found) != SQLITE_OK ||
        store_query_int(db, "SELECT count(*) FROM tickets", &s->rows_estimate, NULL) !=
            SQLITE_OK ||
        store_query_int(db, "SELECT count(*) FROM idempotency_keys", &s->keys_estimate, NULL) !=
            SQLITE_OK) {
        st = store_sql_fail(err, db, s->path, "cannot read the ticket ids");
        goto out_rollback;
    }
    if (found && maxid > hi)
        hi = maxid;
    if (meta_put_int(db, "ticket_id_high", hi) != SQLITE_OK) {
        st = store_sql_fail(err, db, s->path, "cannot record the ticket id high-water mark");
        goto out_rollback;
    }
    s->id_reserved = hi;
    s->next_id = (uint64_t)hi + 1;
    st = read_id_marks(s, db, err);
    if (st != DEVIO_OK)
        goto out_rollback;
    s->last_success_ms = devio_unix_ms();

    if (store_exec(db, "COMMIT") != SQLITE_OK) {
        st = store_sql_fail(err, db, s->path, "cannot commit the open transaction");
        goto out_rollback;
    }
    return DEVIO_OK;

out_rollback:
    store_exec(db, "ROLLBACK");
    return st;
}

devio_status store_schema_open(devio_store *s, devio_error *err)
{
    devio_status st = set_wal(s, err);
    return st == DEVIO_OK ? open_txn(s, err) : st;
}
