/* store_meta.c - the meta table's free keys: small text values a deployment keeps beside the history.
 * It must never let a caller change the keys the store keeps itself (schema version, epoch, id high-water mark). */
#include <string.h>

#include "device/status.h"
#include "service/store/store_internal.h"

/* Keys the store owns; meta_set refuses them so the invariants hold. */
static const char *const reserved_keys[] = {"schema_version", "epoch", "ticket_id_high",
                                            "seq_id_high", "logits_id_high",
                                            "store_heartbeat_ms"};

devio_status devio_store_meta_get(devio_store *s, const char *key, char *buf, size_t len,
                                  bool *found, devio_error *err)
{
    if (found)
        *found = false;
    if (!s || !key || !buf || len == 0 || !found)
        return devio_fail(err, DEVIO_E_INVALID, "meta get: an argument is NULL or empty");
    buf[0] = '\0';
    sqlite3_stmt *st = NULL;
    pthread_mutex_lock(&s->rmu);
    devio_status rs = store_prepare(s, "SELECT value FROM meta WHERE key = ?1", &st, "meta get",
                                    err);
    if (rs != DEVIO_OK)
        goto out_unlock;
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
        rs = store_sql_fail(err, s->rdb, s->path, "meta get failed");
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
    if (store_find_name(reserved_keys, sizeof reserved_keys / sizeof *reserved_keys, key))
        return devio_fail(err, DEVIO_E_INVALID, "meta set: '%s' is kept by the store itself",
                          key);
    pthread_mutex_lock(&s->rmu);
    devio_status rs = store_meta_put(s->rdb, key, value) == SQLITE_OK
                          ? DEVIO_OK
                          : store_sql_fail(err, s->rdb, s->path, "meta set failed");
    pthread_mutex_unlock(&s->rmu);
    return rs;
}
