/* store_writer.c - ticket and key writes: the queue callers fill, the writer thread that group-commits it, retention.
 * Never runs SQL on a caller's thread; never holds the queue lock while SQLite works. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/log.h"
#include "common/clock.h"
#include "device/status.h"
#include "service/store/store_internal.h"

#define FIND_STATUS(v) store_find_name(store_ticket_statuses, STORE_N_STATUSES, (v))

devio_status store_writer_prepare(devio_store *s, devio_error *err)
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
         " queued_us, compute_us, error_code, error_message, request_id, answer)"
         " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"},
        {&s->st_settle,
         "UPDATE tickets SET status=?2, settled_ms=?3, queued_us=?4, compute_us=?5,"
         " error_code=?6, error_message=?7, answer=coalesce(?8, answer) WHERE id=?1"},
        {&s->st_abort,
         "UPDATE tickets SET status='aborted', settled_ms=?1, error_code='aborted',"
         " error_message=?2 WHERE status='in_flight' AND epoch=?3"},
        /* Oldest settled rows first; rows still in flight are never trimmed
         * so their settle finds them. Walks only the rows it deletes. */
        {&s->st_trim,
         "DELETE FROM tickets WHERE id IN (SELECT id FROM tickets"
         " WHERE status <> 'in_flight' ORDER BY id LIMIT ?1)"},
        {&s->st_mark, "UPDATE meta SET value=?2 WHERE key=?1"},
        {&s->st_beat,
         "INSERT OR REPLACE INTO meta(key, value) VALUES('store_heartbeat_ms', ?1)"},
        /* The first answer stays: a key is never recorded twice. */
        {&s->st_key,
         "INSERT OR IGNORE INTO idempotency_keys(key, request, digest, code, answer, created_ms)"
         " VALUES(?1, ?2, ?3, ?4, ?5, ?6)"},
        {&s->st_key_trim, "DELETE FROM idempotency_keys WHERE created_ms < ?1"},
        {&s->st_key_count_trim,
         "DELETE FROM idempotency_keys WHERE key IN (SELECT key FROM idempotency_keys"
         " ORDER BY created_ms LIMIT ?1)"},
        /* A launch and its key's row: both or neither. */
        {&s->st_savepoint, "SAVEPOINT launch_key"},
        {&s->st_release, "RELEASE launch_key"},
        {&s->st_rollback_to, "ROLLBACK TO launch_key"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (sqlite3_prepare_v3(s->wdb, tab[i].sql, -1, SQLITE_PREPARE_PERSISTENT, tab[i].st,
                               NULL) != SQLITE_OK)
            return store_sql_fail(err, s->wdb, s->path, "cannot prepare a statement");
    return DEVIO_OK;
}

void store_writer_finalize(devio_store *s)
{
    sqlite3_stmt *w[] = {s->st_begin, s->st_commit, s->st_rollback, s->st_launch,
                         s->st_settle, s->st_abort,  s->st_trim,
                         s->st_beat,  s->st_key,    s->st_key_trim, s->st_mark,
                         s->st_key_count_trim, s->st_savepoint, s->st_release,
                         s->st_rollback_to};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        sqlite3_finalize(w[i]);
}

/* ---- enqueue ----------------------------------------------------------- */

static uint64_t enqueue(devio_store *s, store_wrec *w)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(w);
        return 0;
    }
    w->n = ++s->last_queued;
    if (w->kind == STORE_W_LAUNCH && (uint64_t)w->id >= s->next_id)
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
static const char *put_str(store_wrec *w, size_t *pos, const char *p)
{
    if (!p)
        return NULL;
    size_t n = strlen(p) + 1;
    char *d = w->buf + *pos;
    memcpy(d, p, n);
    *pos += n;
    return d;
}

/* The seqs column: the sequence ids as a compact JSON array, "[7,8]"
 * (store_history.c:parse_seqs reads it back). Ids are below 2^63 (the
 * device counts them up from 1), so each is a JSON integer. Caller frees
 * with free(); NULL when out of memory. */
static char *seqs_text(const uint64_t *seqs, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((json_int_t)seqs[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    char *t = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    return t;
}

static store_wrec *make_rec(store_wkind kind, const devio_ticket_record *r, const char *status)
{
    bool has_seqs = kind == STORE_W_LAUNCH && r->seqs; /* no seqs: NULL in the row */
    char *seqs = has_seqs ? seqs_text(r->seqs, r->n_seqs) : NULL;
    if (has_seqs && !seqs)
        return NULL;
    const devio_key_record *k = kind == STORE_W_LAUNCH ? r->key : NULL;
    if (k && (!k->key || !k->request || !k->digest || !k->answer)) {
        free(seqs);
        return NULL;
    }
    size_t extra = slen(seqs) + slen(r->error_code) + slen(r->error_message) +
                   slen(r->request_id) + slen(r->answer) +
                   (k ? slen(k->key) + slen(k->request) + slen(k->digest) + slen(k->answer) : 0);
    store_wrec *w = calloc(1, sizeof *w + extra);
    if (!w) {
        free(seqs);
        return NULL;
    }
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
    free(seqs);
    w->error_code = put_str(w, &pos, r->error_code);
    w->error_message = put_str(w, &pos, r->error_message);
    w->request_id = put_str(w, &pos, r->request_id);
    w->answer = put_str(w, &pos, r->answer);
    if (k) {
        w->key = put_str(w, &pos, k->key);
        w->request = put_str(w, &pos, k->request);
        w->digest = put_str(w, &pos, k->digest);
        w->key_answer = put_str(w, &pos, k->answer);
        w->code = k->code;
        w->key_ms = k->created_ms ? k->created_ms : devio_unix_ms();
    }
    return w;
}

/* A malformed record (NULL, id 0 or past INT64_MAX, unknown status) is a
 * caller bug; it is refused here (0) rather than failing later in SQL. */
uint64_t devio_store_ticket_launched(devio_store *s, const devio_ticket_record *r)
{
    if (!s || !r || r->id == 0 || r->id > INT64_MAX)
        return 0;
    const char *status = r->status ? FIND_STATUS(r->status) : store_ticket_statuses[0];
    if (!status)
        return 0;
    store_wrec *w = make_rec(STORE_W_LAUNCH, r, status);
    return w ? enqueue(s, w) : 0;
}

uint64_t devio_store_ticket_settled(devio_store *s, const devio_ticket_record *r)
{
    if (!s || !r || r->id == 0 || r->id > INT64_MAX)
        return 0;
    const char *status = r->status ? FIND_STATUS(r->status)
                                   : (r->error_code ? "failed" : "ok");
    if (!status || status == store_ticket_statuses[0]) /* settling into in_flight means nothing */
        return 0;
    store_wrec *w = make_rec(STORE_W_SETTLE, r, status);
    if (!w)
        return 0;
    if (w->settled_ms == 0) /* a settled row always carries a time */
        w->settled_ms = devio_unix_ms();
    return enqueue(s, w);
}

uint64_t devio_store_abort_in_flight(devio_store *s, const char *reason)
{
    if (!s)
        return 0;
    devio_ticket_record r = {.id = 0,
                             .error_message = reason ? reason : "device torn down",
                             .settled_ms = devio_unix_ms()};
    store_wrec *w = make_rec(STORE_W_ABORT, &r, "aborted");
    return w ? enqueue(s, w) : 0;
}

uint64_t devio_store_key_put(devio_store *s, const devio_key_record *r)
{
    if (!s || !r || !r->key || !r->request || !r->digest || !r->answer)
        return 0;
    store_wrec *w = calloc(1, sizeof *w + slen(r->key) + slen(r->request) + slen(r->digest) +
                                  slen(r->answer));
    if (!w)
        return 0;
    size_t pos = 0;
    w->kind = STORE_W_KEY;
    w->key = put_str(w, &pos, r->key);
    w->request = put_str(w, &pos, r->request);
    w->digest = put_str(w, &pos, r->digest);
    w->key_answer = put_str(w, &pos, r->answer);
    w->code = r->code;
    w->key_ms = r->created_ms ? r->created_ms : devio_unix_ms();
    return enqueue(s, w);
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
        const store_fail_range *f = &s->fails[i];
        if (n >= f->lo && n <= f->hi) {
            st = devio_fail(err, DEVIO_E_IO, "ticket store %s: write %" PRIu64 " failed: %s",
                            s->path, n, f->msg);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

bool devio_store_done(devio_store *s, uint64_t n)
{
    if (!s || n == 0)
        return true;
    pthread_mutex_lock(&s->mu);
    bool done = s->committed >= n;
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* ---- writer thread ----------------------------------------------------- */

static int insert_row(devio_store *s, const store_wrec *w, bool settled)
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
    store_bind_text_or_null(st, 8, w->seqs);
    if (settled || !in_flight) {
        sqlite3_bind_int64(st, 9, w->queued_us);
        sqlite3_bind_int64(st, 10, w->compute_us);
    }
    store_bind_text_or_null(st, 11, w->error_code);
    store_bind_text_or_null(st, 12, w->error_message);
    store_bind_text_or_null(st, 13, w->request_id);
    store_bind_text_or_null(st, 14, w->answer);
    return store_step_reset(st);
}

/* insert_row, counting the new row for retention. An id past the reserved
 * high-water mark first moves the mark a range ahead, in the same
 * transaction, so no committed row ever lies above the mark. */
static int insert_counted(devio_store *s, const store_wrec *w, bool settled, int64_t *added,
                          int64_t *reserved)
{
    if (w->id > *reserved) {
        int64_t mark = w->id > INT64_MAX - STORE_ID_RANGE ? INT64_MAX
                                                          : w->id + STORE_ID_RANGE - 1;
        int rc = store_writer_mark(s, "ticket_id_high", mark);
        if (rc != SQLITE_DONE)
            return rc;
        *reserved = mark;
    }
    int rc = insert_row(s, w, settled);
    if (rc == SQLITE_DONE)
        (*added)++;
    return rc;
}

/* The key row of w (a key write, or a launch with its key), created at
 * w->key_ms; the first row of a key stays. Keys past their time go as
 * new ones come (the index walks only them). *keys counts new rows. */
static int put_key(devio_store *s, const store_wrec *w, int64_t *keys)
{
    sqlite3_bind_int64(s->st_key_trim, 1, w->key_ms - DEVIO_KEY_KEEP_MS);
    int rc = store_step_reset(s->st_key_trim);
    if (rc != SQLITE_DONE)
        return rc;
    *keys -= sqlite3_changes(s->wdb);
    sqlite3_stmt *st = s->st_key;
    sqlite3_bind_text(st, 1, w->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, w->request, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, w->digest, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, w->code);
    sqlite3_bind_text(st, 5, w->key_answer, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, w->key_ms);
    rc = store_step_reset(st);
    if (rc == SQLITE_DONE)
        *keys += sqlite3_changes(s->wdb);
    return rc;
}

/* A launch row with its key's, in a savepoint: a statement that fails alone
 * takes the other back too. */
static int launch_with_key(devio_store *s, store_wrec *w, int64_t *added, int64_t *reserved,
                           int64_t *keys)
{
    int rc = store_step_reset(s->st_savepoint);
    if (rc != SQLITE_DONE)
        return rc;
    int64_t a = *added, k = *keys, r = *reserved;
    rc = insert_counted(s, w, false, added, reserved);
    if (rc == SQLITE_DONE)
        rc = put_key(s, w, keys);
    if (rc == SQLITE_DONE)
        return store_step_reset(s->st_release);
    if (!sqlite3_get_autocommit(s->wdb)) {
        store_step_reset(s->st_rollback_to);
        store_step_reset(s->st_release);
    }
    *added = a;
    *keys = k;
    *reserved = r;
    return rc;
}

/* Apply one record inside the open transaction. *added counts new ticket
 * rows, *keys new key rows. A settle changes status, settled_ms, timings
 * and error only; rows, tokens and seqs are those written at launch. */
static int apply(devio_store *s, store_wrec *w, int64_t *added, int64_t *reserved,
                 int64_t *keys)
{
    int rc;
    switch (w->kind) {
    case STORE_W_LAUNCH:
        if (w->key)
            return launch_with_key(s, w, added, reserved, keys);
        return insert_counted(s, w, false, added, reserved);
    case STORE_W_SETTLE: {
        sqlite3_stmt *st = s->st_settle;
        sqlite3_bind_int64(st, 1, w->id);
        sqlite3_bind_text(st, 2, w->status, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, w->settled_ms);
        sqlite3_bind_int64(st, 4, w->queued_us);
        sqlite3_bind_int64(st, 5, w->compute_us);
        store_bind_text_or_null(st, 6, w->error_code);
        store_bind_text_or_null(st, 7, w->error_message);
        store_bind_text_or_null(st, 8, w->answer);
        rc = store_step_reset(st);
        if (rc != SQLITE_DONE || sqlite3_changes(s->wdb) > 0)
            return rc;
        /* No row (its launch write failed or was never made): record the
         * outcome anyway rather than lose it. */
        return insert_counted(s, w, true, added, reserved);
    }
    case STORE_W_KEY:
        return put_key(s, w, keys);
    case STORE_W_ABORT: {
        sqlite3_stmt *st = s->st_abort;
        sqlite3_bind_int64(st, 1, w->settled_ms);
        store_bind_text_or_null(st, 2, w->error_message);
        sqlite3_bind_int64(st, 3, (int64_t)s->epoch);
        return store_step_reset(st);
    }
    }
    return SQLITE_MISUSE;
}

static void mark_failed(store_wrec *from, const store_wrec *to_excl, const char *msg)
{
    for (store_wrec *w = from; w != to_excl; w = w->next) {
        if (w->failed)
            continue;
        w->failed = true;
        w->fail = strdup(msg ? msg : "unknown SQLite error");
    }
}

int store_writer_mark(devio_store *s, const char *key, int64_t value)
{
    char txt[32];
    snprintf(txt, sizeof txt, "%" PRId64, value);
    sqlite3_bind_text(s->st_mark, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s->st_mark, 2, txt, -1, SQLITE_TRANSIENT);
    return store_step_reset(s->st_mark);
}

/* Delete the oldest rows with `trim` once a table of `rows` is `slack` past
 * `keep`, so each trim deletes at least `slack` rows: cost per insert stays
 * O(1) and the table holds at most keep + slack rows. *added drops by the
 * rows deleted. keep 0: no bound. */
static int trim_to(devio_store *s, sqlite3_stmt *trim, uint32_t keep, int64_t rows,
                   int64_t *added)
{
    if (keep == 0)
        return SQLITE_DONE;
    int64_t slack = keep / 16;
    if (slack < 1)
        slack = 1;
    if (slack > 256)
        slack = 256;
    if (rows <= (int64_t)keep + slack)
        return SQLITE_DONE;
    sqlite3_bind_int64(trim, 1, rows - keep);
    int rc = store_step_reset(trim);
    if (rc == SQLITE_DONE)
        *added -= sqlite3_changes(s->wdb);
    return rc;
}

/* Retention: the oldest settled ticket rows (rows still in flight are never
 * trimmed, so their settle finds them), then the oldest key rows. The
 * ticket rows about to go may hold the largest id: the reserved high-water
 * mark in meta lies at or above it, so a later open never hands it out. */
static int retain(devio_store *s, int64_t *added, int64_t *keys)
{
    int rc = trim_to(s, s->st_trim, s->opt.retention, s->rows_estimate + *added, added);
    if (rc == SQLITE_DONE)
        rc = trim_to(s, s->st_key_count_trim, s->opt.key_retention, s->keys_estimate + *keys,
                     keys);
    return rc;
}

/* Move the sequence and logits id marks a range past the ids handed out so
 * far, when those passed them: every id a write of this transaction names was
 * handed out before the write was queued. *marks: the marks as written. */
static int keep_marks_ahead(devio_store *s, int64_t marks[STORE_N_ID_KINDS])
{
    for (int k = 0; k < STORE_N_ID_KINDS; k++) {
        uint64_t used = atomic_load(&s->ids_used[k]);
        marks[k] = s->ids_reserved[k];
        if (used <= (uint64_t)marks[k])
            continue;
        marks[k] = used > (uint64_t)(INT64_MAX - STORE_ID_RANGE) ? INT64_MAX
                                                                  : (int64_t)used + STORE_ID_RANGE;
        int rc = store_writer_mark(s, store_id_marks[k], marks[k]);
        if (rc != SQLITE_DONE)
            return rc;
    }
    return SQLITE_DONE;
}

/* Run one transaction over records from `first` on, stopping early only when
 * SQLite rolled the transaction back itself. Returns the first record not
 * attempted (NULL when all were); *committed is set when the transaction
 * committed. */
static store_wrec *run_txn(devio_store *s, store_wrec *first, bool *committed)
{
    int64_t added = 0, keys = 0, reserved = s->id_reserved, marks[STORE_N_ID_KINDS];
    if (store_step_reset(s->st_begin) != SQLITE_DONE) {
        mark_failed(first, NULL, sqlite3_errmsg(s->wdb));
        return NULL;
    }
    if (keep_marks_ahead(s, marks) != SQLITE_DONE) {
        /* No write of this batch may commit with an id past the marks. */
        mark_failed(first, NULL, sqlite3_errmsg(s->wdb));
        if (!sqlite3_get_autocommit(s->wdb))
            store_step_reset(s->st_rollback);
        return NULL;
    }
    store_wrec *w = first;
    for (; w; w = w->next) {
        if (apply(s, w, &added, &reserved, &keys) == SQLITE_DONE)
            continue;
        if (sqlite3_get_autocommit(s->wdb)) {
            /* SQLite abandoned the whole transaction (I/O error, disk full):
             * every write of it so far is lost. */
            mark_failed(first, w->next, sqlite3_errmsg(s->wdb));
            return w->next;
        }
        mark_failed(w, w->next, sqlite3_errmsg(s->wdb)); /* this statement only */
    }
    int rc = retain(s, &added, &keys);
    if (rc != SQLITE_DONE && !sqlite3_get_autocommit(s->wdb)) {
        /* Trimming is housekeeping: when it fails alone, the writes still
         * commit and the next batch tries again. */
        if (!s->trim_warned)
            devio_log(DEVIO_LOG_WARN, "store", "ticket store %s: trimming history failed: %s",
                      s->path, sqlite3_errmsg(s->wdb));
        s->trim_warned = true;
        rc = SQLITE_DONE;
    }
    if (rc == SQLITE_DONE)
        rc = store_step_reset(s->st_commit);
    if (rc != SQLITE_DONE) {
        mark_failed(first, NULL, sqlite3_errmsg(s->wdb));
        if (!sqlite3_get_autocommit(s->wdb))
            store_step_reset(s->st_rollback);
        return NULL;
    }
    s->rows_estimate += added;
    s->keys_estimate += keys;
    s->id_reserved = reserved;
    memcpy(s->ids_reserved, marks, sizeof marks);
    *committed = true;
    return NULL;
}

/* Record the batch's failures for waiters (under mu). Adjacent failures merge
 * so a failing disk costs one range, not one per write. */
static void note_failures(devio_store *s, const store_wrec *batch)
{
    for (const store_wrec *w = batch; w; w = w->next) {
        if (!w->failed)
            continue;
        unsigned prev = (s->fail_pos + STORE_FAIL_RANGES - 1) % STORE_FAIL_RANGES;
        store_fail_range *last = s->nfails ? &s->fails[prev] : NULL;
        if (last && last->hi + 1 == w->n) {
            last->hi = w->n;
            continue;
        }
        store_fail_range *f = &s->fails[s->fail_pos];
        s->fail_pos = (s->fail_pos + 1) % STORE_FAIL_RANGES;
        if (s->nfails < STORE_FAIL_RANGES)
            s->nfails++;
        f->lo = f->hi = w->n;
        snprintf(f->msg, sizeof f->msg, "%s", w->fail ? w->fail : "out of memory");
    }
}

/* Failed writes of the batch and the first one's message. */
static uint64_t count_failed(const store_wrec *batch, const char **msg)
{
    uint64_t failed = 0;
    *msg = NULL;
    for (const store_wrec *w = batch; w; w = w->next)
        if (w->failed && failed++ == 0)
            *msg = w->fail ? w->fail : "out of memory";
    return failed;
}

/* Nothing queued and the store unwritable: sleep until the next heartbeat is
 * due (or work or stop comes), then try it. Called and returns with mu held. */
static void idle_beat(devio_store *s)
{
    struct timespec at;
    if (!store_health_beat_due(s, &at)) {
        pthread_cond_timedwait(&s->work, &s->mu, &at);
        return;
    }
    pthread_mutex_unlock(&s->mu);
    char msg[STORE_FAIL_MSG_LEN] = "";
    bool ok = store_health_beat(s, msg, sizeof msg);
    pthread_mutex_lock(&s->mu);
    store_health_note(s, ok, ok ? 0 : 1, msg);
}

void *store_writer_main(void *arg)
{
    devio_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping) {
            if (s->unwritable)
                idle_beat(s);
            else
                pthread_cond_wait(&s->work, &s->mu);
        }
        if (!s->head)
            break; /* stopping and drained */
        /* Group commit: take everything queued, one transaction for all. */
        store_wrec *batch = s->head;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        bool committed = false;
        uint64_t t0 = devio_clock_us();
        char gone[STORE_FAIL_MSG_LEN];
        if (store_health_file_gone(s, gone, sizeof gone))
            mark_failed(batch, NULL, gone);
        else
            for (store_wrec *from = batch; from;)
                from = run_txn(s, from, &committed);
        double took_s = (double)(devio_clock_us() - t0) / 1e6;
        const char *msg;
        uint64_t failed = count_failed(batch, &msg);
        uint64_t last = batch->n;
        for (store_wrec *w = batch; w; w = w->next)
            last = w->n;

        pthread_mutex_lock(&s->mu);
        store_health_note(s, committed, failed, msg);
        if (committed)
            devio_hist_observe(&s->commit_seconds, took_s);
        note_failures(s, batch);
        s->committed = last;
        pthread_cond_broadcast(&s->done);
        pthread_mutex_unlock(&s->mu);
        if (s->opt.on_written)
            s->opt.on_written(s->opt.on_written_ctx, last);

        while (batch) {
            store_wrec *next = batch->next;
            free(batch->fail);
            free(batch);
            batch = next;
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

