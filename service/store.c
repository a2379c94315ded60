/* store.c - devio's SQLite file: schema migrations, a group-committing writer thread, history.
 * Never runs ticket SQL on a caller's thread; never holds the queue lock while SQLite works. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "device/status.h"
#include "service/store.h"

/* ---- schema ------------------------------------------------------------ */

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
};
#define SCHEMA_LATEST ((uint32_t)(sizeof migrations / sizeof migrations[0]))

/* Keys the store owns; meta_set refuses them so the invariants hold. */
static const char *const reserved_keys[] = {"schema_version", "epoch", "ticket_id_high"};

static const char *const ticket_statuses[] = {"in_flight", "ok", "failed", "aborted"};
static const char *const adapter_states[] = {"loaded", "unloaded", "stale", "failed"};

#define QUERY_LIMIT_MAX 1000u
#define FAIL_RANGES 64
#define FAIL_MSG_LEN 160

/* ---- types ------------------------------------------------------------- */

typedef enum wkind { W_LAUNCH, W_SETTLE, W_ABORT } wkind;

/* One queued write. Strings are copied into buf so the caller's record may
 * die as soon as the enqueue returns. */
typedef struct wrec {
    struct wrec *next;
    uint64_t n; /* write number */
    wkind kind;
    const char *status; /* points into ticket_statuses */
    int64_t id, launched_ms, settled_ms;
    uint32_t rows, tokens;
    int64_t queued_us, compute_us;
    const char *seqs, *error_code, *error_message; /* into buf, or NULL */
    char *fail;  /* SQLite's message when this write failed (malloc'd), or NULL */
    bool failed;
    char buf[];
} wrec;

/* A run of write numbers that failed, with the first message seen. */
typedef struct fail_range {
    uint64_t lo, hi;
    char msg[FAIL_MSG_LEN];
} fail_range;

/* Query shapes: one cached statement per combination of optional filters. */
enum { QF_STATUS = 1, QF_SINCE = 2, QF_UNTIL = 4, QF_BEFORE = 8, QF_COUNT = 16 };

struct devio_store {
    char *path;
    devio_store_options opt;
    uint64_t epoch;
    uint32_t schema_version;

    /* Queue state, guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t work;  /* writer waits here for records or stop */
    pthread_cond_t done;  /* waiters wait here for `committed` to move */
    wrec *head, *tail;
    uint64_t last_queued;  /* highest write number handed out */
    uint64_t committed;    /* every write <= this has been committed or failed */
    uint64_t next_id;      /* one more than the largest ticket id stored or queued */
    bool stopping;
    /* Ring of failed runs, oldest overwritten: a waiter must ask within 64
     * failure runs of its write, which holds since callers wait at once. */
    fail_range fails[FAIL_RANGES];
    unsigned nfails, fail_pos;

    /* Writer thread only (after open). */
    pthread_t thread;
    sqlite3 *wdb;
    sqlite3_stmt *st_begin, *st_commit, *st_rollback;
    sqlite3_stmt *st_launch, *st_settle, *st_abort, *st_trim, *st_high;
    int64_t rows_estimate;  /* ticket rows in the file, for retention */
    int64_t id_high;        /* largest ticket id committed */
    int64_t id_high_stored; /* ticket_id_high in meta; written only when rows are
                             * deleted and at close, since max(id) covers the rest */
    bool failing;           /* a failure was logged and nothing has succeeded since */
    bool trim_warned;       /* a trimming failure was logged */
    uint64_t failures_since_log;

    /* Caller-side connection for history, adapters and meta, guarded by rmu.
     * WAL lets it read while the writer holds its transaction. */
    pthread_mutex_t rmu;
    sqlite3 *rdb;
    sqlite3_stmt *st_query[QF_COUNT];
};

/* ---- small utilities --------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *find_name(const char *const *names, size_t n, const char *v)
{
    if (!v)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], v) == 0)
            return names[i];
    return NULL;
}
#define FIND(names, v) find_name((names), sizeof(names) / sizeof((names)[0]), (v))

static devio_status sql_fail(devio_error *err, sqlite3 *db, const char *path, const char *what)
{
    return devio_fail(err, DEVIO_E_IO, "ticket store %s: %s: %s", path, what,
                      db ? sqlite3_errmsg(db) : "out of memory");
}

/* Run SQL text with no results (pragmas, DDL); the caller reports errors. */
static int exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* A single integer from a one-row query; *found false when no row. */
static int query_int(sqlite3 *db, const char *sql, int64_t *v, bool *found)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(st);
    if (found)
        *found = rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL;
    if (rc == SQLITE_ROW) {
        *v = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

static int meta_put_int(sqlite3 *db, const char *key, int64_t v)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db,
                                "INSERT INTO meta(key, value) VALUES(?1, ?2)"
                                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    char txt[32];
    snprintf(txt, sizeof txt, "%" PRId64, v);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, txt, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Pragmas shared by both connections. synchronous=NORMAL in WAL mode makes a
 * commit durable against a crash of this process (the WAL frames are in the
 * OS before COMMIT returns), which is what history needs; only a power loss
 * can drop the last few commits, and never corrupts the file. */
static int configure(sqlite3 *db, uint32_t busy_ms)
{
    int rc = sqlite3_busy_timeout(db, (int)(busy_ms > INT32_MAX ? INT32_MAX : busy_ms));
    if (rc == SQLITE_OK)
        rc = exec(db, "PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL;");
    return rc;
}

static devio_status open_conn(const char *path, uint32_t busy_ms, sqlite3 **out, devio_error *err)
{
    sqlite3 *db = NULL;
    /* NOMUTEX: each connection is used by one thread at a time under our own
     * locks, so SQLite's per-connection mutex would be pure overhead. */
    int rc = sqlite3_open_v2(path, &db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        devio_status st = sql_fail(err, db, path, "cannot open");
        sqlite3_close(db);
        *out = NULL;
        return st;
    }
    sqlite3_extended_result_codes(db, 1);
    if (configure(db, busy_ms) != SQLITE_OK) {
        devio_status st = sql_fail(err, db, path, "cannot configure");
        sqlite3_close(db);
        *out = NULL;
        return st;
    }
    *out = db;
    return DEVIO_OK;
}

/* ---- open: migrate, bump epoch, abort leftovers ------------------------ */

static devio_status set_wal(devio_store *s, devio_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->wdb, "PRAGMA journal_mode=WAL", -1, &st, NULL) != SQLITE_OK)
        return sql_fail(err, s->wdb, s->path, "cannot read the journal mode");
    int rc = sqlite3_step(st);
    char mode[16] = "";
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(mode, sizeof mode, "%s", (const char *)sqlite3_column_text(st, 0));
    devio_status out = DEVIO_OK;
    if (rc != SQLITE_ROW)
        out = sql_fail(err, s->wdb, s->path, "cannot switch to WAL");
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

    if (exec(db, "BEGIN IMMEDIATE") != SQLITE_OK)
        return sql_fail(err, db, s->path, "cannot begin the open transaction");

    if (query_int(db, "PRAGMA user_version", &v, NULL) != SQLITE_OK) {
        st = sql_fail(err, db, s->path, "cannot read the schema version");
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
        if (exec(db, migrations[ver]) != SQLITE_OK) {
            char what[64];
            snprintf(what, sizeof what, "migration to schema version %u failed", ver + 1);
            st = sql_fail(err, db, s->path, what);
            goto out_rollback;
        }
        char pragma[48];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%u", ver + 1);
        if (exec(db, pragma) != SQLITE_OK ||
            meta_put_int(db, "schema_version", (int64_t)ver + 1) != SQLITE_OK) {
            st = sql_fail(err, db, s->path, "cannot record the schema version");
            goto out_rollback;
        }
    }
    s->schema_version = SCHEMA_LATEST;

    v = 0;
    if (query_int(db, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='epoch'", &v, NULL) !=
            SQLITE_OK ||
        meta_put_int(db, "epoch", v + 1) != SQLITE_OK) {
        st = sql_fail(err, db, s->path, "cannot advance the epoch");
        goto out_rollback;
    }
    s->epoch = (uint64_t)v + 1;

    /* settled_ms stays NULL: when the earlier process died is unknown. */
    if (exec(db, "UPDATE tickets SET status='aborted', error_code='aborted',"
                 " error_message='process ended before the ticket settled'"
                 " WHERE status='in_flight'") != SQLITE_OK) {
        st = sql_fail(err, db, s->path, "cannot abort tickets left in flight");
        goto out_rollback;
    }

    /* The high-water mark survives history being trimmed or deleted, so ids
     * are never reused across restarts. */
    int64_t hi = 0, maxid = 0;
    if (query_int(db, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='ticket_id_high'", &hi,
                  NULL) != SQLITE_OK ||
        query_int(db, "SELECT max(id) FROM tickets", &maxid, &found) != SQLITE_OK ||
        query_int(db, "SELECT count(*) FROM tickets", &s->rows_estimate, NULL) != SQLITE_OK) {
        st = sql_fail(err, db, s->path, "cannot read the ticket ids");
        goto out_rollback;
    }
    if (found && maxid > hi)
        hi = maxid;
    if (meta_put_int(db, "ticket_id_high", hi) != SQLITE_OK) {
        st = sql_fail(err, db, s->path, "cannot record the ticket id high-water mark");
        goto out_rollback;
    }
    s->id_high = s->id_high_stored = hi;
    s->next_id = (uint64_t)hi + 1;

    if (exec(db, "COMMIT") != SQLITE_OK) {
        st = sql_fail(err, db, s->path, "cannot commit the open transaction");
        goto out_rollback;
    }
    return DEVIO_OK;

out_rollback:
    exec(db, "ROLLBACK");
    return st;
}

static devio_status prepare_writer(devio_store *s, devio_error *err)
{
    struct {
        sqlite3_stmt **st;
        const char *sql;
    } tab[] = {
        {&s->st_begin, "BEGIN IMMEDIATE"},
        {&s->st_commit, "COMMIT"},
        {&s->st_rollback, "ROLLBACK"},
        {&s->st_launch,
         "INSERT INTO tickets(id, epoch, status, launched_ms, settled_ms, rows, tokens, seqs,"
         " queued_us, compute_us, error_code, error_message)"
         " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"},
        {&s->st_settle,
         "UPDATE tickets SET status=?2, settled_ms=?3, queued_us=?4, compute_us=?5,"
         " error_code=?6, error_message=?7 WHERE id=?1"},
        {&s->st_abort,
         "UPDATE tickets SET status='aborted', settled_ms=?1, error_code='aborted',"
         " error_message=?2 WHERE status='in_flight' AND epoch=?3"},
        /* Oldest settled rows first; rows still in flight are never trimmed
         * so their settle finds them. Walks only the rows it deletes. */
        {&s->st_trim,
         "DELETE FROM tickets WHERE id IN (SELECT id FROM tickets"
         " WHERE status <> 'in_flight' ORDER BY id LIMIT ?1)"},
        {&s->st_high, "UPDATE meta SET value=?1 WHERE key='ticket_id_high'"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (sqlite3_prepare_v3(s->wdb, tab[i].sql, -1, SQLITE_PREPARE_PERSISTENT, tab[i].st,
                               NULL) != SQLITE_OK)
            return sql_fail(err, s->wdb, s->path, "cannot prepare a statement");
    return DEVIO_OK;
}

static void *writer_main(void *arg);
static int store_high(devio_store *s, int64_t id);

devio_store_options devio_store_options_default(void)
{
    return (devio_store_options){.retention = 0, .busy_timeout_ms = 5000};
}

static void finalize_all(devio_store *s)
{
    sqlite3_stmt *w[] = {s->st_begin,  s->st_commit, s->st_rollback, s->st_launch, s->st_settle,
                         s->st_abort,  s->st_trim,   s->st_high};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        sqlite3_finalize(w[i]);
    for (int i = 0; i < QF_COUNT; i++)
        sqlite3_finalize(s->st_query[i]);
}

devio_status devio_store_open(const char *path, const devio_store_options *o,
                              devio_store **out, devio_error *err)
{
    devio_status st;
    if (!out)
        return devio_fail(err, DEVIO_E_INVALID, "devio_store_open: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return devio_fail(err, DEVIO_E_INVALID, "ticket store path is empty");

    devio_store *s = calloc(1, sizeof *s);
    if (!s)
        return devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: out of memory", path);
    s->opt = o ? *o : devio_store_options_default();
    if (s->opt.busy_timeout_ms == 0) /* a zeroed options struct means the default */
        s->opt.busy_timeout_ms = 5000;
    s->path = strdup(path);
    if (!s->path) {
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: out of memory", path);
        goto out_free;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: cannot create a mutex", path);
        goto out_free;
    }
    if (pthread_mutex_init(&s->rmu, NULL) != 0) {
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: cannot create a mutex", path);
        goto out_mu;
    }
    if (pthread_cond_init(&s->work, NULL) != 0) {
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: cannot create a condition", path);
        goto out_rmu;
    }
    if (pthread_cond_init(&s->done, NULL) != 0) {
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: cannot create a condition", path);
        goto out_work;
    }

    st = open_conn(path, s->opt.busy_timeout_ms, &s->wdb, err);
    if (st != DEVIO_OK)
        goto out_done;
    st = set_wal(s, err);
    if (st != DEVIO_OK)
        goto out_close;
    st = open_txn(s, err);
    if (st != DEVIO_OK)
        goto out_close;
    st = prepare_writer(s, err);
    if (st != DEVIO_OK)
        goto out_close;
    st = open_conn(path, s->opt.busy_timeout_ms, &s->rdb, err);
    if (st != DEVIO_OK)
        goto out_close;
    int prc = pthread_create(&s->thread, NULL, writer_main, s);
    if (prc != 0) {
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: cannot start the writer: %s", path,
                        strerror(prc));
        goto out_close;
    }
    *out = s;
    return DEVIO_OK;

out_close:
    finalize_all(s);
    sqlite3_close(s->rdb);
    sqlite3_close(s->wdb);
out_done:
    pthread_cond_destroy(&s->done);
out_work:
    pthread_cond_destroy(&s->work);
out_rmu:
    pthread_mutex_destroy(&s->rmu);
out_mu:
    pthread_mutex_destroy(&s->mu);
out_free:
    free(s->path);
    free(s);
    return st;
}

void devio_store_close(devio_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* the writer drains the queue before it returns */

    /* Keep the high-water mark even if history is deleted while we are down.
     * Best effort: after a crash, open's max(id) recovers it. */
    if (s->id_high > s->id_high_stored && store_high(s, s->id_high) != SQLITE_DONE)
        fprintf(stderr, "devio store %s: cannot record the ticket id high-water mark: %s\n",
                s->path, sqlite3_errmsg(s->wdb));

    finalize_all(s);
    /* The last connection to close checkpoints the WAL into the file. */
    sqlite3_close(s->rdb);
    sqlite3_close(s->wdb);
    pthread_cond_destroy(&s->done);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->mu);
    free(s->path);
    free(s);
}

uint64_t devio_store_epoch(const devio_store *s)
{
    return s ? s->epoch : 0;
}

uint32_t devio_store_schema_version(const devio_store *s)
{
    return s ? s->schema_version : 0;
}

uint64_t devio_store_next_ticket_id(const devio_store *s)
{
    if (!s)
        return 0;
    /* The store is const to the caller but next_id moves under mu; the object
     * was allocated mutable, so locking through a cast is well defined. */
    devio_store *m = (devio_store *)s;
    pthread_mutex_lock(&m->mu);
    uint64_t v = m->next_id;
    pthread_mutex_unlock(&m->mu);
    return v;
}

/* ---- enqueue ----------------------------------------------------------- */

static uint64_t enqueue(devio_store *s, wrec *w)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(w);
        return 0;
    }
    w->n = ++s->last_queued;
    if (w->kind == W_LAUNCH && (uint64_t)w->id >= s->next_id)
        s->next_id = (uint64_t)w->id + 1;
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    uint64_t n = w->n;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return n;
}

static size_t slen(const char *p)
{
    return p ? strlen(p) + 1 : 0;
}

/* Copy p into the record's buffer at *pos; NULL stays NULL. */
static const char *put_str(wrec *w, size_t *pos, const char *p)
{
    if (!p)
        return NULL;
    size_t n = strlen(p) + 1;
    char *d = w->buf + *pos;
    memcpy(d, p, n);
    *pos += n;
    return d;
}

static wrec *make_rec(wkind kind, const devio_ticket_record *r, const char *status)
{
    const char *seqs = kind == W_LAUNCH ? r->seqs : NULL;
    size_t extra = slen(seqs) + slen(r->error_code) + slen(r->error_message);
    wrec *w = calloc(1, sizeof *w + extra);
    if (!w)
        return NULL;
    size_t pos = 0;
    w->kind = kind;
    w->status = status;
    w->id = (int64_t)r->id;
    w->launched_ms = r->launched_ms;
    w->settled_ms = r->settled_ms;
    w->rows = r->rows;
    w->tokens = r->tokens;
    w->queued_us = r->queued_us > INT64_MAX ? INT64_MAX : (int64_t)r->queued_us;
    w->compute_us = r->compute_us > INT64_MAX ? INT64_MAX : (int64_t)r->compute_us;
    w->seqs = put_str(w, &pos, seqs);
    w->error_code = put_str(w, &pos, r->error_code);
    w->error_message = put_str(w, &pos, r->error_message);
    return w;
}

/* A malformed record (NULL, id 0 or past INT64_MAX, unknown status) is a
 * caller bug; it is refused here (0) rather than failing later in SQL. */
uint64_t devio_store_ticket_launched(devio_store *s, const devio_ticket_record *r)
{
    if (!s || !r || r->id == 0 || r->id > INT64_MAX)
        return 0;
    const char *status = r->status ? FIND(ticket_statuses, r->status) : ticket_statuses[0];
    if (!status)
        return 0;
    wrec *w = make_rec(W_LAUNCH, r, status);
    return w ? enqueue(s, w) : 0;
}

uint64_t devio_store_ticket_settled(devio_store *s, const devio_ticket_record *r)
{
    if (!s || !r || r->id == 0 || r->id > INT64_MAX)
        return 0;
    const char *status = r->status ? FIND(ticket_statuses, r->status)
                                   : (r->error_code ? "failed" : "ok");
    if (!status || status == ticket_statuses[0]) /* settling into in_flight means nothing */
        return 0;
    wrec *w = make_rec(W_SETTLE, r, status);
    if (!w)
        return 0;
    if (w->settled_ms == 0) /* a settled row always carries a time */
        w->settled_ms = now_ms();
    return enqueue(s, w);
}

uint64_t devio_store_abort_in_flight(devio_store *s, const char *reason)
{
    if (!s)
        return 0;
    devio_ticket_record r = {.id = 0,
                             .error_message = reason ? reason : "device torn down",
                             .settled_ms = now_ms()};
    wrec *w = make_rec(W_ABORT, &r, "aborted");
    return w ? enqueue(s, w) : 0;
}

/* ---- wait -------------------------------------------------------------- */

devio_status devio_store_wait(devio_store *s, uint64_t n, devio_error *err)
{
    if (n == 0)
        return DEVIO_OK;
    if (!s)
        return devio_fail(err, DEVIO_E_INVALID, "devio_store_wait: store is NULL");
    pthread_mutex_lock(&s->mu);
    if (n > s->last_queued) {
        uint64_t last = s->last_queued;
        pthread_mutex_unlock(&s->mu);
        return devio_fail(err, DEVIO_E_INVALID,
                          "ticket store write %" PRIu64 " was never queued (last %" PRIu64 ")",
                          n, last);
    }
    while (s->committed < n)
        pthread_cond_wait(&s->done, &s->mu);
    devio_status st = DEVIO_OK;
    for (unsigned i = 0; i < s->nfails; i++) {
        const fail_range *f = &s->fails[i];
        if (n >= f->lo && n <= f->hi) {
            st = devio_fail(err, DEVIO_E_IO, "ticket store %s: write %" PRIu64 " failed: %s",
                            s->path, n, f->msg);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- writer thread ----------------------------------------------------- */

static int step_reset(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st); /* record strings are bound STATIC and freed after the batch */
    return rc;
}

static void bind_text_or_null(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

static int insert_row(devio_store *s, const wrec *w, bool settled)
{
    sqlite3_stmt *st = s->st_launch;
    sqlite3_bind_int64(st, 1, w->id);
    sqlite3_bind_int64(st, 2, (int64_t)s->epoch);
    sqlite3_bind_text(st, 3, w->status, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, w->launched_ms);
    bool in_flight = strcmp(w->status, "in_flight") == 0;
    if (w->settled_ms != 0 && !in_flight)
        sqlite3_bind_int64(st, 5, w->settled_ms);
    else
        sqlite3_bind_null(st, 5);
    sqlite3_bind_int64(st, 6, w->rows);
    sqlite3_bind_int64(st, 7, w->tokens);
    bind_text_or_null(st, 8, w->seqs);
    if (settled || !in_flight) {
        sqlite3_bind_int64(st, 9, w->queued_us);
        sqlite3_bind_int64(st, 10, w->compute_us);
    }
    bind_text_or_null(st, 11, w->error_code);
    bind_text_or_null(st, 12, w->error_message);
    return step_reset(st);
}

/* Apply one record inside the open transaction. *added counts new rows.
 * A settle changes status, settled_ms, timings and error only; rows, tokens
 * and seqs are those written at launch. */
static int apply(devio_store *s, wrec *w, int64_t *added, int64_t *max_id)
{
    int rc;
    switch (w->kind) {
    case W_LAUNCH:
        rc = insert_row(s, w, false);
        if (rc == SQLITE_DONE) {
            (*added)++;
            if (w->id > *max_id)
                *max_id = w->id;
        }
        return rc;
    case W_SETTLE: {
        sqlite3_stmt *st = s->st_settle;
        sqlite3_bind_int64(st, 1, w->id);
        sqlite3_bind_text(st, 2, w->status, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, w->settled_ms);
        sqlite3_bind_int64(st, 4, w->queued_us);
        sqlite3_bind_int64(st, 5, w->compute_us);
        bind_text_or_null(st, 6, w->error_code);
        bind_text_or_null(st, 7, w->error_message);
        rc = step_reset(st);
        if (rc != SQLITE_DONE || sqlite3_changes(s->wdb) > 0)
            return rc;
        /* No row (its launch write failed or was never made): record the
         * outcome anyway rather than lose it. */
        rc = insert_row(s, w, true);
        if (rc == SQLITE_DONE) {
            (*added)++;
            if (w->id > *max_id)
                *max_id = w->id;
        }
        return rc;
    }
    case W_ABORT: {
        sqlite3_stmt *st = s->st_abort;
        sqlite3_bind_int64(st, 1, w->settled_ms);
        bind_text_or_null(st, 2, w->error_message);
        sqlite3_bind_int64(st, 3, (int64_t)s->epoch);
        return step_reset(st);
    }
    }
    return SQLITE_MISUSE;
}

static void mark_failed(wrec *from, const wrec *to_excl, const char *msg)
{
    for (wrec *w = from; w != to_excl; w = w->next) {
        if (w->failed)
            continue;
        w->failed = true;
        w->fail = strdup(msg ? msg : "unknown SQLite error");
    }
}

static int store_high(devio_store *s, int64_t id)
{
    char txt[32];
    snprintf(txt, sizeof txt, "%" PRId64, id);
    sqlite3_bind_text(s->st_high, 1, txt, -1, SQLITE_TRANSIENT);
    return step_reset(s->st_high);
}

/* Trim the oldest settled rows once the table is `slack` past the limit, so
 * each trim deletes at least `slack` rows: cost per insert stays O(1) and the
 * table holds at most retention + slack rows (plus rows still in flight). */
static int retain(devio_store *s, int64_t *added, int64_t max_id, int64_t *stored)
{
    uint32_t keep = s->opt.retention;
    if (keep == 0)
        return SQLITE_DONE;
    int64_t slack = keep / 16;
    if (slack < 1)
        slack = 1;
    if (slack > 256)
        slack = 256;
    int64_t rows = s->rows_estimate + *added;
    if (rows <= (int64_t)keep + slack)
        return SQLITE_DONE;
    /* The rows about to go may hold the largest id; keep it in meta first, in
     * the same transaction, so a later open never hands an id out again. */
    int rc = SQLITE_DONE;
    if (max_id > *stored) {
        rc = store_high(s, max_id);
        if (rc != SQLITE_DONE)
            return rc;
        *stored = max_id;
    }
    sqlite3_bind_int64(s->st_trim, 1, rows - keep);
    rc = step_reset(s->st_trim);
    if (rc == SQLITE_DONE)
        *added -= sqlite3_changes(s->wdb);
    return rc;
}

/* Run one transaction over records from `first` on, stopping early only when
 * SQLite rolled the transaction back itself. Returns the first record not
 * attempted (NULL when all were). */
static wrec *run_txn(devio_store *s, wrec *first)
{
    int64_t added = 0, max_id = s->id_high, stored = s->id_high_stored;
    if (step_reset(s->st_begin) != SQLITE_DONE) {
        mark_failed(first, NULL, sqlite3_errmsg(s->wdb));
        return NULL;
    }
    wrec *w = first;
    for (; w; w = w->next) {
        if (apply(s, w, &added, &max_id) == SQLITE_DONE)
            continue;
        if (sqlite3_get_autocommit(s->wdb)) {
            /* SQLite abandoned the whole transaction (I/O error, disk full):
             * every write of it so far is lost. */
            mark_failed(first, w->next, sqlite3_errmsg(s->wdb));
            return w->next;
        }
        mark_failed(w, w->next, sqlite3_errmsg(s->wdb)); /* this statement only */
    }
    int rc = retain(s, &added, max_id, &stored);
    if (rc != SQLITE_DONE && !sqlite3_get_autocommit(s->wdb)) {
        /* Trimming is housekeeping: when it fails alone, the writes still
         * commit and the next batch tries again. */
        if (!s->trim_warned)
            fprintf(stderr, "devio store %s: trimming history failed: %s\n", s->path,
                    sqlite3_errmsg(s->wdb));
        s->trim_warned = true;
        rc = SQLITE_DONE;
    }
    if (rc == SQLITE_DONE)
        rc = step_reset(s->st_commit);
    if (rc != SQLITE_DONE) {
        mark_failed(first, NULL, sqlite3_errmsg(s->wdb));
        if (!sqlite3_get_autocommit(s->wdb))
            step_reset(s->st_rollback);
        return NULL;
    }
    s->rows_estimate += added;
    s->id_high = max_id;
    s->id_high_stored = stored;
    return NULL;
}

/* Record the batch's failures for waiters (under mu). Adjacent failures merge
 * so a failing disk costs one range, not one per write. */
static void note_failures(devio_store *s, const wrec *batch)
{
    for (const wrec *w = batch; w; w = w->next) {
        if (!w->failed)
            continue;
        fail_range *last = s->nfails
                               ? &s->fails[(s->fail_pos + FAIL_RANGES - 1) % FAIL_RANGES]
                               : NULL;
        if (last && last->hi + 1 == w->n) {
            last->hi = w->n;
            continue;
        }
        fail_range *f = &s->fails[s->fail_pos];
        s->fail_pos = (s->fail_pos + 1) % FAIL_RANGES;
        if (s->nfails < FAIL_RANGES)
            s->nfails++;
        f->lo = f->hi = w->n;
        snprintf(f->msg, sizeof f->msg, "%s", w->fail ? w->fail : "out of memory");
    }
}

/* Log the first failure of a run of failures, then one line when writes
 * succeed again, so a failing disk does not flood stderr. */
static void log_outcome(devio_store *s, const wrec *batch)
{
    uint64_t failed = 0, ok = 0;
    const wrec *first_fail = NULL;
    for (const wrec *w = batch; w; w = w->next) {
        if (w->failed) {
            failed++;
            if (!first_fail)
                first_fail = w;
        } else {
            ok++;
        }
    }
    if (failed && !s->failing) {
        fprintf(stderr, "devio store %s: write %" PRIu64 " failed: %s\n", s->path, first_fail->n,
                first_fail->fail ? first_fail->fail : "out of memory");
        s->failing = true;
    }
    s->failures_since_log += failed;
    if (ok && s->failing && !failed) {
        fprintf(stderr, "devio store %s: writes succeed again after %" PRIu64 " failed\n",
                s->path, s->failures_since_log);
        s->failing = false;
        s->failures_since_log = 0;
    }
}

static void *writer_main(void *arg)
{
    devio_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->work, &s->mu);
        if (!s->head)
            break; /* stopping and drained */
        /* Group commit: take everything queued, one transaction for all. */
        wrec *batch = s->head;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        for (wrec *from = batch; from;)
            from = run_txn(s, from);
        log_outcome(s, batch);
        uint64_t last = batch->n;
        for (wrec *w = batch; w; w = w->next)
            last = w->n;

        pthread_mutex_lock(&s->mu);
        note_failures(s, batch);
        s->committed = last;
        pthread_cond_broadcast(&s->done);
        pthread_mutex_unlock(&s->mu);

        while (batch) {
            wrec *next = batch->next;
            free(batch->fail);
            free(batch);
            batch = next;
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- history queries --------------------------------------------------- */

static sqlite3_stmt *query_stmt(devio_store *s, unsigned mask)
{
    if (s->st_query[mask])
        return s->st_query[mask];
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT id, epoch, status, launched_ms, settled_ms, rows, tokens, seqs,"
             " queued_us, compute_us, error_code, error_message FROM tickets WHERE 1%s%s%s%s"
             " ORDER BY id DESC LIMIT :limit",
             (mask & QF_STATUS) ? " AND status = :status" : "",
             (mask & QF_SINCE) ? " AND launched_ms >= :since" : "",
             (mask & QF_UNTIL) ? " AND launched_ms < :until" : "",
             (mask & QF_BEFORE) ? " AND id < :before" : "");
    if (sqlite3_prepare_v3(s->rdb, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->st_query[mask],
                           NULL) != SQLITE_OK) {
        sqlite3_finalize(s->st_query[mask]);
        s->st_query[mask] = NULL;
    }
    return s->st_query[mask];
}

static json_t *col_int_or_null(sqlite3_stmt *st, int i)
{
    if (sqlite3_column_type(st, i) == SQLITE_NULL)
        return json_null();
    return json_integer(sqlite3_column_int64(st, i));
}

static json_t *col_text_or_null(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? json_string((const char *)t) : json_null();
}

static json_t *ticket_json(sqlite3_stmt *st)
{
    json_t *seqs = NULL;
    const unsigned char *seqs_txt = sqlite3_column_text(st, 7);
    if (seqs_txt)
        seqs = json_loads((const char *)seqs_txt, JSON_DECODE_ANY, NULL);
    if (!seqs || !json_is_array(seqs)) {
        /* Text that is not an array is shown as an empty list rather than
         * failing the whole page. */
        json_decref(seqs);
        seqs = json_array();
    }
    json_t *error = json_null();
    if (sqlite3_column_type(st, 10) != SQLITE_NULL) {
        const unsigned char *msg = sqlite3_column_text(st, 11);
        json_decref(error);
        error = json_pack("{s:s, s:s}", "code", (const char *)sqlite3_column_text(st, 10),
                          "message", msg ? (const char *)msg : "");
    }
    return json_pack("{s:I, s:I, s:s, s:I, s:o, s:I, s:I, s:o, s:o, s:o, s:o}",
                     "id", (json_int_t)sqlite3_column_int64(st, 0),
                     "epoch", (json_int_t)sqlite3_column_int64(st, 1),
                     "status", (const char *)sqlite3_column_text(st, 2),
                     "launched_ms", (json_int_t)sqlite3_column_int64(st, 3),
                     "settled_ms", col_int_or_null(st, 4),
                     "rows", (json_int_t)sqlite3_column_int64(st, 5),
                     "tokens", (json_int_t)sqlite3_column_int64(st, 6),
                     "seqs", seqs,
                     "queued_us", col_int_or_null(st, 8),
                     "compute_us", col_int_or_null(st, 9),
                     "error", error);
}

static void bind_named_int(sqlite3_stmt *st, const char *name, int64_t v)
{
    int i = sqlite3_bind_parameter_index(st, name);
    if (i > 0)
        sqlite3_bind_int64(st, i, v);
}

devio_status devio_store_tickets_query(devio_store *s, const devio_ticket_query *q,
                                       json_t **out, devio_error *err)
{
    if (out)
        *out = NULL;
    if (!s || !q || !out)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: store, query or out is NULL");
    if (q->limit < 1 || q->limit > QUERY_LIMIT_MAX)
        return devio_fail_at(err, DEVIO_E_INVALID, "limit", q->limit,
                             "ticket query: limit must be 1..%u", QUERY_LIMIT_MAX);
    const char *status = NULL;
    if (q->status) {
        status = FIND(ticket_statuses, q->status);
        if (!status)
            return devio_fail(err, DEVIO_E_INVALID,
                              "ticket query: status must be in_flight, ok, failed or aborted");
    }
    if (q->since_ms < 0 || q->until_ms < 0)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: times must not be negative");
    if (q->since_ms && q->until_ms && q->until_ms < q->since_ms)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: until is before since");
    if (q->before_id > INT64_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: before_id is out of range");

    unsigned mask = (status ? QF_STATUS : 0) | (q->since_ms ? QF_SINCE : 0) |
                    (q->until_ms ? QF_UNTIL : 0) | (q->before_id ? QF_BEFORE : 0);
    devio_status rs = DEVIO_OK;
    json_t *list = json_array();
    if (!list)
        return devio_fail(err, DEVIO_E_NOMEM, "ticket query: out of memory");

    pthread_mutex_lock(&s->rmu);
    sqlite3_stmt *st = query_stmt(s, mask);
    if (!st) {
        rs = sql_fail(err, s->rdb, s->path, "cannot prepare the history query");
        goto out_unlock;
    }
    if (status)
        sqlite3_bind_text(st, sqlite3_bind_parameter_index(st, ":status"), status, -1,
                          SQLITE_STATIC);
    bind_named_int(st, ":since", q->since_ms);
    bind_named_int(st, ":until", q->until_ms);
    bind_named_int(st, ":before", (int64_t)q->before_id);
    /* One row more than asked tells whether a next page exists. */
    bind_named_int(st, ":limit", (int64_t)q->limit + 1);

    uint32_t n = 0;
    int64_t last_id = 0;
    bool more = false;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == q->limit) {
            more = true;
            break;
        }
        json_t *t = ticket_json(st);
        if (!t || json_array_append_new(list, t) != 0) {
            rs = devio_fail(err, DEVIO_E_NOMEM, "ticket query: out of memory");
            goto out_reset;
        }
        last_id = sqlite3_column_int64(st, 0);
        n++;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        rs = sql_fail(err, s->rdb, s->path, "history query failed");
        goto out_reset;
    }
    json_t *res = json_pack("{s:o, s:o}", "tickets", list, "next",
                            more ? json_integer(last_id) : json_null());
    list = NULL; /* json_pack took it, even on failure */
    if (!res) {
        rs = devio_fail(err, DEVIO_E_NOMEM, "ticket query: out of memory");
        goto out_reset;
    }
    *out = res;

out_reset:
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    json_decref(list);
    return rs;
}

/* ---- adapters ---------------------------------------------------------- */

devio_status devio_store_adapter_put(devio_store *s, const devio_adapter_record *r,
                                     devio_error *err)
{
    if (!s || !r)
        return devio_fail(err, DEVIO_E_INVALID, "adapter put: store or record is NULL");
    if (!r->name || !*r->name)
        return devio_fail(err, DEVIO_E_INVALID, "adapter put: name is empty");
    if (!r->path)
        return devio_fail(err, DEVIO_E_INVALID, "adapter %s: path is NULL", r->name);
    const char *state = FIND(adapter_states, r->state);
    if (!state)
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter %s: state must be loaded, unloaded, stale or failed", r->name);
    /* SQLite stores NaN as NULL, which the NOT NULL columns would refuse with
     * a less helpful message. */
    if (!isfinite(r->alpha) || !isfinite(r->scale))
        return devio_fail(err, DEVIO_E_INVALID, "adapter %s: alpha and scale must be finite",
                          r->name);
    if (r->size > INT64_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "adapter %s: size is out of range", r->name);

    devio_status rs = DEVIO_OK;
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    /* IMMEDIATE takes the write lock up front, so the busy timeout applies
     * instead of a deadlock against the writer thread. */
    if (exec(s->rdb, "BEGIN IMMEDIATE") != SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "adapter put: cannot begin");
        goto out_unlock;
    }
    if (sqlite3_prepare_v2(s->rdb,
                           "INSERT OR REPLACE INTO adapters(name, path, rank, alpha, scale,"
                           " targets, sha256, size, state, pinned, loaded_ms, last_used_ms,"
                           " reason) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12,"
                           " ?13)",
                           -1, &st, NULL) != SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "adapter put: cannot prepare");
        goto out_rollback;
    }
    sqlite3_bind_text(st, 1, r->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, r->rank);
    sqlite3_bind_double(st, 4, r->alpha);
    sqlite3_bind_double(st, 5, r->scale);
    sqlite3_bind_text(st, 6, r->targets ? r->targets : "", -1, SQLITE_STATIC);
    bind_text_or_null(st, 7, r->sha256);
    sqlite3_bind_int64(st, 8, (int64_t)r->size);
    sqlite3_bind_text(st, 9, state, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 10, r->pinned ? 1 : 0);
    sqlite3_bind_int64(st, 11, r->loaded_ms);
    sqlite3_bind_int64(st, 12, r->last_used_ms);
    bind_text_or_null(st, 13, r->reason);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rs = sql_fail(err, s->rdb, s->path, "adapter put failed");
        goto out_rollback;
    }
    if (exec(s->rdb, "COMMIT") != SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "adapter put: cannot commit");
        goto out_rollback;
    }
    goto out_finalize;

out_rollback:
    if (!sqlite3_get_autocommit(s->rdb))
        exec(s->rdb, "ROLLBACK");
out_finalize:
    sqlite3_finalize(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    return rs;
}

devio_status devio_store_adapter_delete(devio_store *s, const char *name, devio_error *err)
{
    if (!s || !name)
        return devio_fail(err, DEVIO_E_INVALID, "adapter delete: store or name is NULL");
    devio_status rs = DEVIO_OK;
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    if (sqlite3_prepare_v2(s->rdb, "DELETE FROM adapters WHERE name = ?1", -1, &st, NULL) !=
        SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "adapter delete: cannot prepare");
        goto out_unlock;
    }
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE)
        rs = sql_fail(err, s->rdb, s->path, "adapter delete failed");
    else if (sqlite3_changes(s->rdb) == 0)
        rs = devio_fail(err, DEVIO_E_UNKNOWN_ADAPTER, "no adapter named '%s' is stored", name);
    sqlite3_finalize(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    return rs;
}

devio_status devio_store_adapters_list(devio_store *s, json_t **out, devio_error *err)
{
    if (out)
        *out = NULL;
    if (!s || !out)
        return devio_fail(err, DEVIO_E_INVALID, "adapter list: store or out is NULL");
    json_t *list = json_array();
    if (!list)
        return devio_fail(err, DEVIO_E_NOMEM, "adapter list: out of memory");
    devio_status rs = DEVIO_OK;
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    if (sqlite3_prepare_v2(s->rdb,
                           "SELECT name, path, rank, alpha, scale, targets, sha256, size, state,"
                           " pinned, loaded_ms, last_used_ms, reason FROM adapters ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "adapter list: cannot prepare");
        goto out_unlock;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *a = json_pack(
            "{s:s, s:s, s:I, s:f, s:f, s:s, s:o, s:I, s:s, s:b, s:I, s:I, s:o}",
            "name", (const char *)sqlite3_column_text(st, 0),
            "path", (const char *)sqlite3_column_text(st, 1),
            "rank", (json_int_t)sqlite3_column_int64(st, 2),
            "alpha", sqlite3_column_double(st, 3),
            "scale", sqlite3_column_double(st, 4),
            "targets", (const char *)sqlite3_column_text(st, 5),
            "sha256", col_text_or_null(st, 6),
            "size", (json_int_t)sqlite3_column_int64(st, 7),
            "state", (const char *)sqlite3_column_text(st, 8),
            "pinned", sqlite3_column_int(st, 9) != 0,
            "loaded_ms", (json_int_t)sqlite3_column_int64(st, 10),
            "last_used_ms", (json_int_t)sqlite3_column_int64(st, 11),
            "reason", col_text_or_null(st, 12));
        if (!a || json_array_append_new(list, a) != 0) {
            rs = devio_fail(err, DEVIO_E_NOMEM, "adapter list: out of memory");
            goto out_finalize;
        }
    }
    if (rc != SQLITE_DONE) {
        rs = sql_fail(err, s->rdb, s->path, "adapter list failed");
        goto out_finalize;
    }
    *out = list;
    list = NULL;
out_finalize:
    sqlite3_finalize(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    json_decref(list);
    return rs;
}

/* ---- meta -------------------------------------------------------------- */

devio_status devio_store_meta_get(devio_store *s, const char *key, char *buf, size_t len,
                                  bool *found, devio_error *err)
{
    if (found)
        *found = false;
    if (!s || !key || !buf || len == 0 || !found)
        return devio_fail(err, DEVIO_E_INVALID, "meta get: an argument is NULL or empty");
    buf[0] = '\0';
    devio_status rs = DEVIO_OK;
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    if (sqlite3_prepare_v2(s->rdb, "SELECT value FROM meta WHERE key = ?1", -1, &st, NULL) !=
        SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "meta get: cannot prepare");
        goto out_unlock;
    }
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const unsigned char *v = sqlite3_column_text(st, 0);
        size_t n = (size_t)sqlite3_column_bytes(st, 0);
        *found = true;
        if (n + 1 > len) {
            rs = devio_fail(err, DEVIO_E_INVALID,
                            "meta get: value of '%s' is %zu bytes, the buffer holds %zu", key, n,
                            len - 1);
        } else {
            memcpy(buf, v ? (const char *)v : "", n);
            buf[n] = '\0';
        }
    } else if (rc != SQLITE_DONE) {
        rs = sql_fail(err, s->rdb, s->path, "meta get failed");
    }
    sqlite3_finalize(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    return rs;
}

devio_status devio_store_meta_set(devio_store *s, const char *key, const char *value,
                                  devio_error *err)
{
    if (!s || !key || !*key || !value)
        return devio_fail(err, DEVIO_E_INVALID, "meta set: store, key or value is NULL or empty");
    if (FIND(reserved_keys, key))
        return devio_fail(err, DEVIO_E_INVALID, "meta set: '%s' is kept by the store itself",
                          key);
    devio_status rs = DEVIO_OK;
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    if (sqlite3_prepare_v2(s->rdb,
                           "INSERT INTO meta(key, value) VALUES(?1, ?2)"
                           " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                           -1, &st, NULL) != SQLITE_OK) {
        rs = sql_fail(err, s->rdb, s->path, "meta set: cannot prepare");
        goto out_unlock;
    }
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE)
        rs = sql_fail(err, s->rdb, s->path, "meta set failed");
    sqlite3_finalize(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    return rs;
}
