/* store_sql.c - the small SQLite helpers every store file uses: errors, one-shot statements, binds.
 * Helpers only; they must never take a store lock or hold a statement past their return. */
#include <stdio.h>
#include <string.h>

#include "device/status.h"
#include "service/store/store_internal.h"

const char *const store_id_marks[STORE_N_ID_KINDS] = {"seq_id_high", "logits_id_high"};

const char *const store_ticket_statuses[STORE_N_STATUSES] = {"in_flight", "ok", "failed", "aborted",
                                                             "reaped"};

devio_status store_sql_fail(devio_error *err, sqlite3 *db, const char *path, const char *what)
{
    return devio_fail(err, DEVIO_E_IO, "ticket store %s: %s: %s", path, what,
                      db ? sqlite3_errmsg(db) : "out of memory");
}

devio_status store_prepare(devio_store *s, const char *sql, sqlite3_stmt **st, const char *what,
                           devio_error *err)
{
    if (sqlite3_prepare_v2(s->rdb, sql, -1, st, NULL) == SQLITE_OK)
        return DEVIO_OK;
    sqlite3_finalize(*st);
    *st = NULL;
    char msg[96];
    snprintf(msg, sizeof msg, "%s: cannot prepare", what);
    return store_sql_fail(err, s->rdb, s->path, msg);
}

int store_exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

int store_query_int(sqlite3 *db, const char *sql, int64_t *v, bool *found)
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

int store_meta_put(sqlite3 *db, const char *key, const char *value)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db,
                                "INSERT INTO meta(key, value) VALUES(?1, ?2)"
                                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

void store_bind_text_or_null(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

int store_step_reset(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st); /* record strings are bound STATIC and freed after the batch */
    return rc;
}

const char *store_find_name(const char *const *names, size_t n, const char *v)
{
    if (!v)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], v) == 0)
            return names[i];
    return NULL;
}
