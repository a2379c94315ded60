/* store_internal.h - the state the store's files share: the devio_store struct, the write queue and small SQLite helpers.
 * Private to service/store*.c; nothing outside the store may include it. */
#ifndef DEVIO_STORE_INTERNAL_H
#define DEVIO_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <sqlite3.h>

#include "service/store/store.h"

#define STORE_FAIL_RANGES 64
#define STORE_FAIL_MSG_LEN 160
/* Ticket ids reserved in meta at a time: one extra UPDATE per this many launches. */
#define STORE_ID_RANGE 1024
/* While writes fail: the writer tries a heartbeat this often, and logs at most
 * one line per STORE_LOG_EVERY_US. */
#define STORE_BEAT_US 1000000u
#define STORE_LOG_EVERY_US 10000000u

/* Ids other than tickets' that stored answers name: their marks in meta. */
enum { STORE_ID_SEQ, STORE_ID_LOGITS, STORE_N_ID_KINDS };
extern const char *const store_id_marks[STORE_N_ID_KINDS]; /* "seq_id_high", "logits_id_high" */

/* The ticket statuses of the schema's CHECK; [0] is "in_flight". */
#define STORE_N_STATUSES 5
extern const char *const store_ticket_statuses[STORE_N_STATUSES];

typedef enum store_wkind { STORE_W_LAUNCH, STORE_W_SETTLE, STORE_W_ABORT, STORE_W_KEY } store_wkind;

/* One queued write. Strings are copied into buf so the caller's record may
 * die as soon as the enqueue returns. */
typedef struct store_wrec {
    struct store_wrec *next;
    uint64_t n; /* write number */
    store_wkind kind;
    const char *status; /* points into store_ticket_statuses */
    int64_t id, launched_ms, settled_ms;
    uint32_t rows, tokens;
    int64_t queued_us, compute_us;
    const char *seqs, *error_code, *error_message, *request_id, *answer; /* into buf, or NULL */
    const char *key, *request, *digest; /* STORE_W_KEY, and STORE_W_LAUNCH with a key: into buf */
    const char *key_answer;             /* the key's answer text, into buf */
    int64_t key_ms;                     /* the key's row's creation time, unix ms */
    uint32_t code;                      /* the key's answer's HTTP status */
    char *fail;  /* SQLite's message when this write failed (malloc'd), or NULL */
    bool failed;
    char buf[];
} store_wrec;

/* A run of write numbers that failed, with the first message seen. */
typedef struct store_fail_range {
    uint64_t lo, hi;
    char msg[STORE_FAIL_MSG_LEN];
} store_fail_range;

/* History query shapes: one cached statement per combination of optional filters. */
enum { STORE_QF_STATUS = 1, STORE_QF_SINCE = 2, STORE_QF_UNTIL = 4, STORE_QF_BEFORE = 8,
       STORE_QF_COUNT = 16 };

struct devio_store {
    char *path;
    int lock_fd;           /* the file opened for its flock (one server per file), -1 = none;
                            * closed only after both connections (see store.c) */
    devio_store_options opt;
    uint64_t epoch;
    uint32_t schema_version;

    /* Queue state, guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t work;  /* writer waits here for records or stop */
    pthread_cond_t done;  /* waiters wait here for `committed` to move */
    store_wrec *head, *tail;
    uint64_t last_queued;  /* highest write number handed out */
    uint64_t committed;    /* every write <= this has been committed or failed */
    uint64_t next_id;      /* one more than the largest ticket id stored or queued */
    bool stopping;
    /* Health (store_health.c), written by the writer under mu. */
    bool unwritable;       /* the last transaction or heartbeat failed */
    bool gone;             /* the path no longer names the opened file: unwritable for good */
    uint64_t errors;       /* writes and heartbeats that failed since open */
    int64_t last_success_ms; /* unix ms of the last commit (open's included) */
    char why[STORE_FAIL_MSG_LEN]; /* SQLite's message of the last failure */
    devio_hist commit_seconds; /* see devio_store_health */
    /* Ring of failed runs, oldest overwritten: a waiter must ask within 64
     * failure runs of its write, which holds since callers wait at once. */
    store_fail_range fails[STORE_FAIL_RANGES];
    unsigned nfails, fail_pos;

    /* Writer thread only (after open). */
    pthread_t thread;
    dev_t file_dev;        /* the opened file, as stat(path) found it at open */
    ino_t file_ino;
    sqlite3 *wdb;
    sqlite3_stmt *st_begin, *st_commit, *st_rollback;
    sqlite3_stmt *st_launch, *st_settle, *st_abort, *st_trim, *st_beat;
    sqlite3_stmt *st_key, *st_key_trim, *st_key_count_trim;
    sqlite3_stmt *st_savepoint, *st_release, *st_rollback_to;
    int64_t rows_estimate;  /* ticket rows in the file, for retention */
    int64_t keys_estimate;  /* idempotency key rows in the file, for key_retention */
    int64_t id_reserved;    /* ticket_id_high in meta as committed: every id written
                             * lies at or below it (advanced STORE_ID_RANGE at a time) */
    /* The sequence and logits handle ids: the highest handed out (any thread,
     * devio_store_ids_used) and the marks in meta as committed, kept above
     * them in every transaction that may name them. */
    _Atomic uint64_t ids_used[STORE_N_ID_KINDS];
    int64_t ids_reserved[STORE_N_ID_KINDS];
    sqlite3_stmt *st_mark;
    bool trim_warned;       /* a trimming failure was logged */
    uint64_t failed_run;    /* writes failed since writes last succeeded */
    uint64_t suppressed;    /* failures not logged since last_log_us */
    uint64_t last_log_us;   /* when the last failure line was written (monotonic) */
    uint64_t last_beat_us;  /* when the writer last tried a write (monotonic) */

    /* Caller-side connection for history, adapters and meta, guarded by rmu.
     * WAL lets it read while the writer holds its transaction. */
    pthread_mutex_t rmu;
    sqlite3 *rdb;
    sqlite3_stmt *st_query[STORE_QF_COUNT];

    /* Point reads by key or ticket id (lookups), guarded by lmu: called on
     * HTTP threads, so this connection never writes and its lock is never
     * held by anything that waits on another process's lock (adapter writes
     * hold rmu). WAL readers do not wait for writers. */
    pthread_mutex_t lmu;
    sqlite3 *ldb;
    sqlite3_stmt *st_key_get, *st_ticket_get;
};

/* ---- helpers (store_sql.c) ------------------------------------------------ */

/* DEVIO_E_IO "ticket store PATH: WHAT: sqlite message". */
devio_status store_sql_fail(devio_error *err, sqlite3 *db, const char *path, const char *what);
/* Prepare sql on the reader connection (the caller holds rmu); on failure
 * DEVIO_E_IO "WHAT: cannot prepare: ..." and *st NULL. */
devio_status store_prepare(devio_store *s, const char *sql, sqlite3_stmt **st, const char *what,
                           devio_error *err);
/* SQL text with no results (pragmas, DDL, BEGIN/COMMIT); the caller reports errors. */
int store_exec(sqlite3 *db, const char *sql);
/* A single integer from a one-row query; *found (may be NULL) false when no row or NULL. */
int store_query_int(sqlite3 *db, const char *sql, int64_t *v, bool *found);
/* Insert or replace a meta row on db (either connection); SQLITE_OK or the error. */
int store_meta_put(sqlite3 *db, const char *key, const char *value);
void store_bind_text_or_null(sqlite3_stmt *st, int i, const char *v);
/* Step, reset and clear a prepared statement; the step's result code. */
int store_step_reset(sqlite3_stmt *st);
/* The entry of names[0..n) equal to v (the static string), or NULL. */
const char *store_find_name(const char *const *names, size_t n, const char *v);

/* ---- open (store_schema.c) ------------------------------------------------ */

/* A connection configured for the store (busy timeout, pragmas). */
devio_status store_connect(const char *path, uint32_t busy_ms, sqlite3 **out, devio_error *err);
/* On s->wdb: WAL, migrations, epoch, aborted-at-start, the ticket id high-water mark,
 * in one transaction. Fills s->schema_version, epoch, rows_estimate, id_reserved, next_id. */
devio_status store_schema_open(devio_store *s, devio_error *err);

/* ---- writer (store_writer.c) ---------------------------------------------- */

devio_status store_writer_prepare(devio_store *s, devio_error *err);
void *store_writer_main(void *arg);
/* Record the id high-water mark `key` of meta ('ticket_id_high', or one of
 * store_id_marks) on the writer connection; SQLITE_DONE on success. */
int store_writer_mark(devio_store *s, const char *key, int64_t value);
void store_writer_finalize(devio_store *s);

/* ---- health (store_health.c), writer thread only ----------------------------- */

/* Empty health and commit-time histogram, at open (before the writer runs). */
void store_health_init(devio_store *s);
/* A batch ended: `committed` whether a transaction of it committed, `failed`
 * writes of it failed (msg: the first failure's message). Updates the
 * health under mu (the caller holds it) and writes the rate-limited log line. */
void store_health_note(devio_store *s, bool committed, uint64_t failed, const char *msg);
/* While unwritable, with nothing queued: whether a heartbeat is due now, else
 * the absolute CLOCK_REALTIME time to wake for it in *at. Caller holds mu. */
bool store_health_beat_due(devio_store *s, struct timespec *at);
/* One tiny transaction (meta 'store_heartbeat_ms'); caller does not hold mu.
 * Returns whether it committed, with SQLite's message in msg when not. */
bool store_health_beat(devio_store *s, char *msg, size_t len);
/* Whether the path no longer names the file opened (unlinked or replaced);
 * then msg says so. Once true, s->gone stays set (under mu). Writer thread. */
bool store_health_file_gone(devio_store *s, char *msg, size_t len);

/* ---- history (store_history.c) -------------------------------------------- */

/* Prepare the lookups' statements on s->ldb (at open). */
devio_status store_lookups_prepare(devio_store *s, devio_error *err);
void store_history_finalize(devio_store *s);

#endif
