/* store_adapters.c - the adapters table: one devio_adapter_record per name, written and read synchronously.
 * Structs in, structs out; it must never run on the step path or store a record it could not read back. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/status.h"
#include "service/store/store_internal.h"

#define ADAPTER_COLUMNS                                                                         \
    "name, path, rank, alpha, scale, targets, sha256, size, state, pinned, loaded_ms,"          \
    " last_used_ms, reason"

static devio_status check_record(const devio_adapter_record *r, devio_error *err)
{
    if (!r->name[0])
        return devio_fail(err, DEVIO_E_INVALID, "adapter put: name is empty");
    if (!devio_adapter_state_str(r->state))
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter %s: state must be loaded, unloaded, stale or failed", r->name);
    /* SQLite stores NaN as NULL, which the NOT NULL columns would refuse with
     * a less helpful message. */
    if (!isfinite(r->alpha) || !isfinite(r->scale))
        return devio_fail(err, DEVIO_E_INVALID, "adapter %s: alpha and scale must be finite",
                          r->name);
    if (r->size > INT64_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "adapter %s: size is out of range", r->name);
    return DEVIO_OK;
}

static void bind_record(sqlite3_stmt *st, const devio_adapter_record *r)
{
    sqlite3_bind_text(st, 1, r->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, r->rank);
    sqlite3_bind_double(st, 4, (double)r->alpha);
    sqlite3_bind_double(st, 5, (double)r->scale);
    sqlite3_bind_text(st, 6, r->targets, -1, SQLITE_STATIC);
    store_bind_text_or_null(st, 7, r->sha256[0] ? r->sha256 : NULL);
    sqlite3_bind_int64(st, 8, (int64_t)r->size);
    sqlite3_bind_text(st, 9, devio_adapter_state_str(r->state), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 10, r->pinned ? 1 : 0);
    sqlite3_bind_int64(st, 11, r->loaded_ms);
    sqlite3_bind_int64(st, 12, r->last_used_ms);
    store_bind_text_or_null(st, 13, r->reason[0] ? r->reason : NULL);
}

devio_status devio_store_adapter_put(devio_store *s, const devio_adapter_record *r,
                                     devio_error *err)
{
    if (!s || !r)
        return devio_fail(err, DEVIO_E_INVALID, "adapter put: store or record is NULL");
    devio_status rs = check_record(r, err);
    if (rs != DEVIO_OK)
        return rs;
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    /* IMMEDIATE takes the write lock up front, so the busy timeout applies
     * instead of a deadlock against the writer thread. */
    if (store_exec(s->rdb, "BEGIN IMMEDIATE") != SQLITE_OK) {
        rs = store_sql_fail(err, s->rdb, s->path, "adapter put: cannot begin");
        goto out_unlock;
    }
    rs = store_prepare(s,
                       "INSERT OR REPLACE INTO adapters(" ADAPTER_COLUMNS ")"
                       " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                       &st, "adapter put", err);
    if (rs != DEVIO_OK)
        goto out_rollback;
    bind_record(st, r);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rs = store_sql_fail(err, s->rdb, s->path, "adapter put failed");
        goto out_rollback;
    }
    if (store_exec(s->rdb, "COMMIT") != SQLITE_OK) {
        rs = store_sql_fail(err, s->rdb, s->path, "adapter put: cannot commit");
        goto out_rollback;
    }
    goto out_finalize;

out_rollback:
    if (!sqlite3_get_autocommit(s->rdb))
        store_exec(s->rdb, "ROLLBACK");
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
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    devio_status rs = store_prepare(s, "DELETE FROM adapters WHERE name = ?1", &st,
                                    "adapter delete", err);
    if (rs == DEVIO_OK) {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE)
            rs = store_sql_fail(err, s->rdb, s->path, "adapter delete failed");
        else if (sqlite3_changes(s->rdb) == 0)
            rs = devio_fail(err, DEVIO_E_UNKNOWN_ADAPTER, "no adapter named '%s' is stored",
                            name);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->rmu);
    return rs;
}

static const char *column_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

/* A result row (ADAPTER_COLUMNS) into *r. */
static void read_record(sqlite3_stmt *st, devio_adapter_record *r)
{
    memset(r, 0, sizeof *r);
    devio_adapter_record_set(r->name, sizeof r->name, column_text(st, 0));
    devio_adapter_record_set(r->path, sizeof r->path, column_text(st, 1));
    r->rank = (uint32_t)sqlite3_column_int64(st, 2);
    r->alpha = (float)sqlite3_column_double(st, 3);
    r->scale = (float)sqlite3_column_double(st, 4);
    devio_adapter_record_set(r->targets, sizeof r->targets, column_text(st, 5));
    devio_adapter_record_set(r->sha256, sizeof r->sha256, column_text(st, 6));
    r->size = (uint64_t)sqlite3_column_int64(st, 7);
    if (!devio_adapter_state_parse(column_text(st, 8), &r->state))
        r->state = DEVIO_ADAPTER_FAILED; /* the schema's CHECK keeps this from happening */
    r->pinned = sqlite3_column_int(st, 9) != 0;
    r->loaded_ms = sqlite3_column_int64(st, 10);
    r->last_used_ms = sqlite3_column_int64(st, 11);
    devio_adapter_record_set(r->reason, sizeof r->reason, column_text(st, 12));
}

/* Rows of `name` (NULL: every row, by name) into a growing array. */
static devio_status select_records(devio_store *s, const char *name, devio_adapter_record **out,
                                   size_t *n, devio_error *err)
{
    size_t cap = 4;
    devio_adapter_record *v = malloc(cap * sizeof *v);
    sqlite3_stmt *st = NULL;
    devio_status rs = DEVIO_OK;
    *out = NULL;
    *n = 0;
    if (!v)
        return devio_fail(err, DEVIO_E_NOMEM, "adapter list: out of memory");
    pthread_mutex_lock(&s->rmu);
    rs = store_prepare(s,
                       name ? "SELECT " ADAPTER_COLUMNS " FROM adapters WHERE name = ?1"
                            : "SELECT " ADAPTER_COLUMNS " FROM adapters ORDER BY name",
                       &st, "adapter list", err);
    if (rs != DEVIO_OK)
        goto out_unlock;
    if (name)
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    size_t k = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            devio_adapter_record *w = realloc(v, 2 * cap * sizeof *v);
            if (!w) {
                rs = devio_fail(err, DEVIO_E_NOMEM, "adapter list: out of memory");
                goto out_finalize;
            }
            v = w;
            cap *= 2;
        }
        read_record(st, &v[k++]);
    }
    if (rc != SQLITE_DONE) {
        rs = store_sql_fail(err, s->rdb, s->path, "adapter list failed");
        goto out_finalize;
    }
    *out = v;
    *n = k;
    v = NULL;
out_finalize:
    sqlite3_finalize(st);
out_unlock:
    pthread_mutex_unlock(&s->rmu);
    free(v);
    return rs;
}

devio_status devio_store_adapters_list(devio_store *s, devio_adapter_record **out, size_t *n,
                                       devio_error *err)
{
    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!s || !out || !n)
        return devio_fail(err, DEVIO_E_INVALID, "adapter list: store or out is NULL");
    return select_records(s, NULL, out, n, err);
}

devio_status devio_store_adapter_get(devio_store *s, const char *name, devio_adapter_record *out,
                                     bool *found, devio_error *err)
{
    if (!s || !name || !out || !found)
        return devio_fail(err, DEVIO_E_INVALID, "adapter get: an argument is NULL");
    memset(out, 0, sizeof *out);
    *found = false;
    devio_adapter_record *v = NULL;
    size_t n = 0;
    devio_status rs = select_records(s, name, &v, &n, err);
    if (rs == DEVIO_OK && n > 0) {
        *out = v[0];
        *found = true;
    }
    free(v);
    return rs;
}
