/* store_history.c - ticket history pages (the filtered, newest-first reads behind GET /v1/tickets), and lookups of one ticket or idempotency key.
 * Reads committed rows into structs (pages on the reader connection, lookups on their own); it never writes and never speaks JSON. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/clock.h"
#include "device/status.h"
#include "service/store/store_internal.h"

#define QUERY_LIMIT_MAX 1000u

/* The columns read_row reads, in its order. */
#define TICKET_COLUMNS                                                                   \
    "SELECT id, epoch, status, launched_ms, settled_ms, rows, tokens, seqs, queued_us,"  \
    " compute_us, error_code, error_message, request_id, answer FROM tickets"

static sqlite3_stmt *query_stmt(devio_store *s, unsigned mask)
{
    if (s->st_query[mask])
        return s->st_query[mask];
    char sql[512];
    snprintf(sql, sizeof sql,
             TICKET_COLUMNS " WHERE 1%s%s%s%s"
             " ORDER BY id DESC LIMIT :limit",
             (mask & STORE_QF_STATUS) ? " AND status = :status" : "",
             (mask & STORE_QF_SINCE) ? " AND launched_ms >= :since" : "",
             (mask & STORE_QF_UNTIL) ? " AND launched_ms < :until" : "",
             (mask & STORE_QF_BEFORE) ? " AND id < :before" : "");
    if (sqlite3_prepare_v3(s->rdb, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->st_query[mask],
                           NULL) != SQLITE_OK) {
        sqlite3_finalize(s->st_query[mask]);
        s->st_query[mask] = NULL;
    }
    return s->st_query[mask];
}

devio_status store_lookups_prepare(devio_store *s, devio_error *err)
{
    if (sqlite3_prepare_v3(s->ldb, TICKET_COLUMNS " WHERE id = ?1", -1,
                           SQLITE_PREPARE_PERSISTENT, &s->st_ticket_get, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->ldb,
                           "SELECT request, digest, code, answer, created_ms FROM idempotency_keys"
                           " WHERE key = ?1 AND created_ms >= ?2",
                           -1, SQLITE_PREPARE_PERSISTENT, &s->st_key_get, NULL) != SQLITE_OK)
        return store_sql_fail(err, s->ldb, s->path, "cannot prepare the lookups");
    return DEVIO_OK;
}

void store_history_finalize(devio_store *s)
{
    for (int i = 0; i < STORE_QF_COUNT; i++)
        sqlite3_finalize(s->st_query[i]);
    sqlite3_finalize(s->st_ticket_get);
    sqlite3_finalize(s->st_key_get);
}

/* The seqs text store_writer.c:seqs_text writes ("[7,8]", a JSON array) as
 * ids. Text that is not a non-empty array of non-negative integers gives an
 * empty list rather than failing the whole page; -1 only when out of memory. */
static int parse_seqs(const char *t, uint64_t **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    if (!t)
        return 0;
    json_error_t e;
    json_t *a = json_loads(t, 0, &e);
    if (!a)
        return json_error_code(&e) == json_error_out_of_memory ? -1 : 0;
    size_t k = json_is_array(a) ? json_array_size(a) : 0;
    for (size_t i = 0; i < k; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            k = 0;
    }
    uint64_t *v = k > 0 ? malloc(k * sizeof *v) : NULL;
    int rc = k > 0 && !v ? -1 : 0;
    for (size_t i = 0; v && i < k; i++)
        v[i] = (uint64_t)json_integer_value(json_array_get(a, i));
    json_decref(a);
    *out = v;
    *n = v ? (uint32_t)k : 0; /* a list that long was written from a uint32_t count */
    return rc;
}

static char *column_dup(sqlite3_stmt *st, int i, bool *oom)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    char *d = t ? strdup((const char *)t) : NULL;
    *oom |= t && !d;
    return d;
}

/* One result row into *r; -1 on out of memory (what was taken is freed with the page). */
static int read_row(sqlite3_stmt *st, devio_ticket_row *r)
{
    bool oom = false;
    r->id = (uint64_t)sqlite3_column_int64(st, 0);
    r->epoch = (uint64_t)sqlite3_column_int64(st, 1);
    r->status = store_find_name(store_ticket_statuses, STORE_N_STATUSES, (const char *)sqlite3_column_text(st, 2));
    if (!r->status) /* the schema's CHECK keeps this from happening */
        r->status = "failed";
    r->launched_ms = sqlite3_column_int64(st, 3);
    r->has_settled_ms = sqlite3_column_type(st, 4) != SQLITE_NULL;
    r->settled_ms = sqlite3_column_int64(st, 4);
    r->rows = (uint32_t)sqlite3_column_int64(st, 5);
    r->tokens = (uint32_t)sqlite3_column_int64(st, 6);
    if (parse_seqs((const char *)sqlite3_column_text(st, 7), &r->seqs, &r->n_seqs) < 0)
        oom = true;
    r->has_queued_us = sqlite3_column_type(st, 8) != SQLITE_NULL;
    r->queued_us = (uint64_t)sqlite3_column_int64(st, 8);
    r->has_compute_us = sqlite3_column_type(st, 9) != SQLITE_NULL;
    r->compute_us = (uint64_t)sqlite3_column_int64(st, 9);
    if (sqlite3_column_type(st, 10) != SQLITE_NULL) {
        r->error_code = column_dup(st, 10, &oom);
        r->error_message = column_dup(st, 11, &oom);
        if (!r->error_message && !oom)
            r->error_message = strdup("");
        oom |= !r->error_message;
    }
    if (sqlite3_column_type(st, 12) != SQLITE_NULL)
        r->request_id = column_dup(st, 12, &oom);
    if (sqlite3_column_type(st, 13) != SQLITE_NULL)
        r->answer = column_dup(st, 13, &oom);
    return oom ? -1 : 0;
}

void devio_ticket_page_free(devio_ticket_page *p)
{
    if (!p)
        return;
    for (uint32_t i = 0; i < p->n; i++) {
        free(p->rows[i].seqs);
        free(p->rows[i].error_code);
        free(p->rows[i].error_message);
        free(p->rows[i].request_id);
        free(p->rows[i].answer);
    }
    free(p->rows);
    memset(p, 0, sizeof *p);
}

static devio_status check_query(const devio_ticket_query *q, const char **status,
                                devio_error *err)
{
    if (q->limit < 1 || q->limit > QUERY_LIMIT_MAX)
        return devio_fail_at(err, DEVIO_E_INVALID, "limit", q->limit,
                             "ticket query: limit must be 1..%u", QUERY_LIMIT_MAX);
    *status = NULL;
    if (q->status) {
        *status = store_find_name(store_ticket_statuses, STORE_N_STATUSES, q->status);
        if (!*status)
            return devio_fail(err, DEVIO_E_INVALID,
                              "ticket query: status must be in_flight, ok, failed, aborted or "
                              "reaped");
    }
    if (q->since_ms < 0 || q->until_ms < 0)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: times must not be negative");
    if (q->since_ms && q->until_ms && q->until_ms < q->since_ms)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: until is before since");
    if (q->before_id > INT64_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: before_id is out of range");
    return DEVIO_OK;
}

static void bind_named_int(sqlite3_stmt *st, const char *name, int64_t v)
{
    int i = sqlite3_bind_parameter_index(st, name);
    if (i > 0)
        sqlite3_bind_int64(st, i, v);
}

devio_status devio_store_tickets_query(devio_store *s, const devio_ticket_query *q,
                                       devio_ticket_page *out, devio_error *err)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!s || !q || !out)
        return devio_fail(err, DEVIO_E_INVALID, "ticket query: store, query or out is NULL");
    const char *status = NULL;
    devio_status rs = check_query(q, &status, err);
    if (rs != DEVIO_OK)
        return rs;
    out->rows = calloc(q->limit, sizeof *out->rows);
    if (!out->rows)
        return devio_fail(err, DEVIO_E_NOMEM, "ticket query: out of memory");

    unsigned mask = (status ? STORE_QF_STATUS : 0) | (q->since_ms ? STORE_QF_SINCE : 0) |
                    (q->until_ms ? STORE_QF_UNTIL : 0) | (q->before_id ? STORE_QF_BEFORE : 0);
    pthread_mutex_lock(&s->rmu);
    sqlite3_stmt *st = query_stmt(s, mask);
    if (!st) {
        rs = store_sql_fail(err, s->rdb, s->path, "cannot prepare the history query");
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

    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (out->n == q->limit) {
            out->has_next = true;
            out->next = out->rows[out->n - 1].id;
            break;
        }
        if (read_row(st, &out->rows[out->n++]) < 0) {
            rs = devio_fail(err, DEVIO_E_NOMEM, "ticket query: out of memory");
            break;
        }
    }
    if (rs == DEVIO_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        rs = store_sql_fail(err, s->rdb, s->path, "history query failed");
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    if (rs != DEVIO_OK)
        devio_ticket_page_free(out);
    return rs;
}

devio_status devio_store_ticket_get(devio_store *s, uint64_t id, devio_ticket_page *out,
                                    devio_error *err)
{
    memset(out, 0, sizeof *out);
    if (id == 0 || id > INT64_MAX)
        return DEVIO_OK;
    out->rows = calloc(1, sizeof *out->rows);
    if (!out->rows)
        return devio_fail(err, DEVIO_E_NOMEM, "ticket lookup: out of memory");
    devio_status rs = DEVIO_OK;
    pthread_mutex_lock(&s->lmu);
    sqlite3_stmt *st = s->st_ticket_get;
    sqlite3_bind_int64(st, 1, (int64_t)id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && read_row(st, &out->rows[out->n++]) < 0)
        rs = devio_fail(err, DEVIO_E_NOMEM, "ticket lookup: out of memory");
    else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        rs = store_sql_fail(err, s->ldb, s->path, "cannot read a ticket");
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    pthread_mutex_unlock(&s->lmu);
    if (rs != DEVIO_OK)
        devio_ticket_page_free(out);
    return rs;
}

/* ---- idempotency keys --------------------------------------------------------- */

static char *dup_column(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

devio_status devio_store_key_get(devio_store *s, const char *key, devio_key_record *out,
                                 bool *found, devio_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    devio_status rs = DEVIO_OK;
    pthread_mutex_lock(&s->lmu);
    sqlite3_stmt *st = s->st_key_get;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, devio_unix_ms() - DEVIO_KEY_KEEP_MS);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->key = strdup(key);
        out->request = dup_column(st, 0);
        out->digest = dup_column(st, 1);
        out->code = (uint32_t)sqlite3_column_int64(st, 2);
        out->answer = dup_column(st, 3);
        out->created_ms = sqlite3_column_int64(st, 4);
        *found = true;
        if (!out->key || !out->request || !out->digest || !out->answer) {
            devio_key_record_free(out);
            *found = false;
            rs = devio_fail(err, DEVIO_E_NOMEM, "out of memory reading a key");
        }
    } else if (rc != SQLITE_DONE) {
        rs = store_sql_fail(err, s->ldb, s->path, "cannot read an idempotency key");
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    pthread_mutex_unlock(&s->lmu);
    return rs;
}

void devio_key_record_free(devio_key_record *r)
{
    free((char *)r->key);
    free((char *)r->request);
    free((char *)r->digest);
    free((char *)r->answer);
    memset(r, 0, sizeof *r);
}
