/* adapters.c - adapter commands over the device's adapter table with their SQLite rows, and the reload at start.
 * It must never answer before the rows of a device change are written, nor let a failure overwrite a loaded adapter's row. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/clock.h"
#include "device/adapter/adapter.h"
#include "device/status.h"
#include "service/adapters.h"

void devio_adapters_init(devio_adapters *a)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
}

void devio_adapters_fini(devio_adapters *a)
{
    pthread_mutex_destroy(&a->mu);
    a->store = NULL;
}

static bool is_loaded(const devio_adapter_record *r)
{
    return r->state == DEVIO_ADAPTER_LOADED;
}

static int by_name(const void *x, const void *y)
{
    return strcmp(((const devio_adapter_record *)x)->name,
                  ((const devio_adapter_record *)y)->name);
}

/* Rows merged with the device's table; the device wins where they disagree.
 * *out is a malloc'd array (caller frees): the loaded adapters in the
 * device's own list order, which is what an in-process `lora` list prints,
 * then the other records by name. */
static devio_status merged(devio_store *s, devio_device *dev, devio_adapter_record **out,
                           size_t *n_out, devio_error *err)
{
    devio_adapter_record *rows = NULL, *recs = NULL;
    size_t n_rows = 0;
    devio_adapter_ack live = {0};
    devio_status st = devio_store_adapters_list(s, &rows, &n_rows, err);
    if (st != DEVIO_OK)
        goto out;
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LIST};
    st = devio_adapter_command(dev, &cmd, &live, err);
    if (st != DEVIO_OK)
        goto out;
    recs = calloc(n_rows + live.n_adapters + 1, sizeof *recs);
    if (!recs) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory listing adapters");
        goto out;
    }
    size_t n = live.n_adapters;
    for (uint32_t k = 0; k < live.n_adapters; k++)
        recs[k] = live.adapters[k]; /* state loaded, the store's fields 0 */
    for (size_t i = 0; i < n_rows; i++) {
        devio_adapter_record *row = &rows[i];
        uint32_t k = 0;
        while (k < live.n_adapters && strcmp(live.adapters[k].name, row->name) != 0)
            k++;
        if (k < live.n_adapters) {
            recs[k].loaded_ms = row->loaded_ms;
            recs[k].last_used_ms = row->last_used_ms;
            continue;
        }
        if (is_loaded(row)) {
            /* Only after a row write failed: the device does not hold it. */
            row->state = DEVIO_ADAPTER_UNLOADED;
            row->pinned = false;
            devio_adapter_record_set(row->reason, sizeof row->reason, "not loaded on the device");
        }
        recs[n++] = *row;
    }
    qsort(recs + live.n_adapters, n - live.n_adapters, sizeof *recs, by_name);
    *out = recs;
    *n_out = n;
    recs = NULL;
out:
    free(recs);
    free(rows);
    devio_adapter_ack_free(&live);
    return st;
}

/* ---- writing rows ------------------------------------------------------------- */

static devio_status not_started(devio_error *err)
{
    return devio_fail(err, DEVIO_E_NOT_READY, "adapters are not ready yet");
}

/* The device answered a command on one adapter without its record. */
static devio_status no_adapter_in_ack(devio_error *err, const char *name)
{
    return devio_fail(err, DEVIO_E_DEVICE, "adapter '%s': the device acknowledged no adapter",
                      name);
}

/* A write that failed after the device changed: the answer says both. */
static devio_status write_failed(devio_error *err, const char *name, const char *what,
                                 const devio_error *werr)
{
    devio_log(DEVIO_LOG_ERROR, "adapters", "adapter '%s' %s, but its record could not be written: %s",
              name, what, werr->message);
    return devio_fail(err, DEVIO_E_IO, "adapter '%s' %s, but its record could not be written: %s",
                      name, what, werr->message);
}

/* Write the row of a device change (`what` the device did) before the answer. */
static devio_status save(devio_store *s, const devio_adapter_record *r, const char *what,
                         devio_error *err)
{
    devio_error werr = {0};
    if (devio_store_adapter_put(s, r, &werr) == DEVIO_OK)
        return DEVIO_OK;
    return write_failed(err, r->name, what, &werr);
}

/* A failed load leaves a "failed" row, unless a loaded adapter owns the name
 * or the failure says nothing about the adapter (out of memory, torn down). */
static void record_failure(devio_store *s, const char *name, const char *path, bool have_prev,
                           const devio_adapter_record *prev, const devio_error *cause)
{
    if (cause->status == DEVIO_E_NOMEM || cause->status == DEVIO_E_TORN_DOWN ||
        cause->status == DEVIO_E_NOT_READY)
        return;
    if (have_prev && is_loaded(prev))
        return;
    devio_adapter_record r = {.state = DEVIO_ADAPTER_FAILED, .last_used_ms = devio_unix_ms()};
    devio_adapter_record_set(r.name, sizeof r.name, name);
    devio_adapter_record_set(r.path, sizeof r.path, path);
    snprintf(r.reason, sizeof r.reason, "%s: %s", devio_status_str(cause->status),
             cause->message);
    devio_error werr = {0};
    /* The device did not change: the answer stays the load's error. */
    if (devio_store_adapter_put(s, &r, &werr) != DEVIO_OK)
        devio_log(DEVIO_LOG_ERROR, "adapters",
                  "adapter '%s': the failed load could not be recorded: %s", name, werr.message);
}

/* The evicted adapter's row becomes "unloaded", reason "evicted". */
static devio_status record_eviction(devio_store *s, const char *evicted, devio_error *werr)
{
    devio_adapter_record ev;
    bool found = false;
    devio_status st = devio_store_adapter_get(s, evicted, &ev, &found, werr);
    if (st != DEVIO_OK)
        return st;
    if (!found) {
        devio_log(DEVIO_LOG_WARN, "adapters", "evicted adapter '%s' had no record", evicted);
        return DEVIO_OK;
    }
    ev.state = DEVIO_ADAPTER_UNLOADED;
    ev.pinned = false;
    devio_adapter_record_set(ev.reason, sizeof ev.reason, "evicted");
    return devio_store_adapter_put(s, &ev, werr);
}

/* ---- commands ----------------------------------------------------------------- */

/* The name's row, then the device command, whose ack must name one adapter. */
static devio_status run_command(devio_adapters *a, devio_device *dev, const devio_adapter_cmd *cmd,
                                devio_adapter_record *prev, bool *have_prev,
                                devio_adapter_ack *ack, devio_error *err)
{
    devio_status st = devio_store_adapter_get(a->store, cmd->name, prev, have_prev, err);
    if (st == DEVIO_OK)
        st = devio_adapter_command(dev, cmd, ack, err);
    if (st == DEVIO_OK && ack->n_adapters == 0)
        st = no_adapter_in_ack(err, cmd->name);
    return st;
}

devio_status devio_adapters_load(devio_adapters *a, devio_device *dev, const char *name,
                                 const char *path, bool pin, devio_adapter_record *out,
                                 char evicted[DEVIO_ADAPTER_NAME_MAX], devio_error *err)
{
    evicted[0] = '\0';
    if (!a->store)
        return not_started(err);
    if (!path || !path[0])
        return devio_fail(err, DEVIO_E_INVALID, "load needs a non-empty 'path'");
    if (strlen(path) >= DEVIO_ADAPTER_PATH_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "adapter path longer than %d bytes",
                          DEVIO_ADAPTER_PATH_MAX - 1);
    devio_error local = {0};
    if (!err)
        err = &local; /* the failure's message goes into its row */
    devio_adapter_ack ack = {0};
    devio_adapter_record prev;
    bool have_prev = false;
    const char *root = devio_config_of(dev)->adapters_root;
    pthread_mutex_lock(&a->mu);
    /* The device refuses the same paths when it loads; they are judged here
     * first so that a path leading out of the root is refused as a request, with
     * nothing stored about it, rather than recorded as an adapter that failed. */
    devio_status st = root ? devio_adapter_path_check(root, path, err) : DEVIO_OK;
    if (st == DEVIO_OK)
        st = devio_store_adapter_get(a->store, name, &prev, &have_prev, err);
    if (st != DEVIO_OK)
        goto out_unlock;
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = name, .path = path, .pin = pin};
    st = devio_adapter_command(dev, &cmd, &ack, err);
    if (st != DEVIO_OK) {
        record_failure(a->store, name, path, have_prev, &prev, err);
        goto out_unlock;
    }
    if (ack.n_adapters == 0) {
        st = no_adapter_in_ack(err, name);
        goto out_unlock;
    }
    int64_t now = devio_unix_ms();
    *out = ack.adapters[0];
    /* An idempotent re-load keeps the weights, so it keeps their load time. */
    bool same = have_prev && is_loaded(&prev) && strcmp(prev.sha256, out->sha256) == 0 &&
                strcmp(prev.path, out->path) == 0;
    out->loaded_ms = same ? prev.loaded_ms : now;
    out->last_used_ms = now;
    char what[160];
    snprintf(what, sizeof what, "is loaded on the device%s%.64s%s",
             ack.evicted[0] ? " (evicting '" : "", ack.evicted, ack.evicted[0] ? "')" : "");
    /* The eviction first: the rows never claim more loaded adapters than
     * the device holds, so a restart never loads more than fitted. */
    devio_error werr = {0};
    if (ack.evicted[0] && record_eviction(a->store, ack.evicted, &werr) != DEVIO_OK)
        st = write_failed(err, name, what, &werr);
    else
        st = save(a->store, out, what, err);
    if (st == DEVIO_OK)
        devio_adapter_record_set(evicted, DEVIO_ADAPTER_NAME_MAX, ack.evicted);
out_unlock:
    pthread_mutex_unlock(&a->mu);
    devio_adapter_ack_free(&ack);
    return st;
}

devio_status devio_adapters_unload(devio_adapters *a, devio_device *dev, const char *name,
                                   devio_adapter_record *out, devio_error *err)
{
    if (!a->store)
        return not_started(err);
    devio_adapter_ack ack = {0};
    devio_adapter_record prev;
    bool have_prev = false;
    devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_UNLOAD, .name = name};
    pthread_mutex_lock(&a->mu);
    devio_status st = run_command(a, dev, &cmd, &prev, &have_prev, &ack, err);
    if (st == DEVIO_OK) {
        /* rows_served stays the device's count at the unload, for this answer. */
        *out = ack.adapters[0];
        out->pinned = false;
        out->loaded_ms = have_prev ? prev.loaded_ms : 0;
        out->last_used_ms = devio_unix_ms();
        st = save(a->store, out, "is unloaded from the device", err);
    }
    pthread_mutex_unlock(&a->mu);
    devio_adapter_ack_free(&ack);
    return st;
}

devio_status devio_adapters_pin(devio_adapters *a, devio_device *dev, const char *name,
                                bool pin, devio_adapter_record *out, devio_error *err)
{
    if (!a->store)
        return not_started(err);
    devio_adapter_ack ack = {0};
    devio_adapter_record prev;
    bool have_prev = false;
    devio_adapter_cmd cmd = {.kind = pin ? DEVIO_ADAPTER_CMD_PIN : DEVIO_ADAPTER_CMD_UNPIN, .name = name};
    pthread_mutex_lock(&a->mu);
    devio_status st = run_command(a, dev, &cmd, &prev, &have_prev, &ack, err);
    if (st == DEVIO_OK) {
        int64_t now = devio_unix_ms();
        *out = ack.adapters[0];
        out->loaded_ms = have_prev && is_loaded(&prev) ? prev.loaded_ms : now;
        out->last_used_ms = now;
        st = save(a->store, out,
                  pin ? "is pinned on the device" : "is unpinned on the device", err);
    }
    pthread_mutex_unlock(&a->mu);
    devio_adapter_ack_free(&ack);
    return st;
}

devio_status devio_adapters_list(devio_adapters *a, devio_device *dev, devio_adapter_record **out,
                                 size_t *n, devio_error *err)
{
    *out = NULL;
    *n = 0;
    if (!a->store)
        return not_started(err);
    pthread_mutex_lock(&a->mu);
    devio_status st = merged(a->store, dev, out, n, err);
    pthread_mutex_unlock(&a->mu);
    return st;
}

devio_status devio_adapters_get(devio_adapters *a, devio_device *dev, const char *name,
                                devio_adapter_record *out, devio_error *err)
{
    devio_adapter_record *recs = NULL;
    size_t n = 0;
    devio_status st = devio_adapters_list(a, dev, &recs, &n, err);
    if (st != DEVIO_OK)
        return st;
    size_t i = 0;
    while (i < n && strcmp(recs[i].name, name) != 0)
        i++;
    if (i == n)
        st = devio_fail(err, DEVIO_E_UNKNOWN_ADAPTER,
                        "adapter '%s' is neither loaded nor recorded", name);
    else
        *out = recs[i];
    free(recs);
    return st;
}

/* ---- start -------------------------------------------------------------------- */

static int by_last_use(const void *x, const void *y)
{
    const devio_adapter_record *a = x, *b = y;
    if (a->last_used_ms != b->last_used_ms)
        return a->last_used_ms < b->last_used_ms ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* The recorded weights are not the file's any more. */
static void mark_stale(devio_adapter_record *r, devio_adapters_restored *n)
{
    r->state = DEVIO_ADAPTER_STALE;
    r->pinned = false;
    devio_adapter_record_set(r->reason, sizeof r->reason, "weights changed since load");
    n->stale++;
    devio_log(DEVIO_LOG_WARN, "adapters", "adapter '%s' (%s): stale, weights changed since load",
              r->name, r->path);
}

/* Load one recorded adapter again; r is updated to what is to be written. */
static void restore_one(devio_adapters *a, devio_device *dev, devio_adapter_record *r,
                        devio_adapters_restored *n)
{
    const char *root = devio_config_of(dev)->adapters_root;
    devio_error e = {0};
    char hex[65];
    uint64_t size = 0;
    devio_adapter_ack ack = {0};
    devio_status st = devio_adapter_file_hash(root, r->path, hex, &size, &e);
    if (st == DEVIO_OK && strcmp(hex, r->sha256) != 0) {
        mark_stale(r, n);
        return;
    }
    if (st == DEVIO_OK) {
        devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = r->name, .path = r->path,
                              .pin = r->pinned};
        st = devio_adapter_command(dev, &cmd, &ack, &e);
    }
    if (st == DEVIO_OK && ack.n_adapters == 0)
        st = no_adapter_in_ack(&e, r->name);
    if (st == DEVIO_OK && strcmp(ack.adapters[0].sha256, r->sha256) != 0) {
        /* The file changed between the hash and the load: not the recorded weights. */
        devio_adapter_ack un = {0};
        devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_UNLOAD, .name = r->name};
        devio_adapter_command(dev, &cmd, &un, NULL);
        devio_adapter_ack_free(&un);
        devio_adapter_ack_free(&ack);
        mark_stale(r, n);
        return;
    }
    if (st != DEVIO_OK) {
        devio_adapter_ack_free(&ack);
        r->state = DEVIO_ADAPTER_FAILED;
        r->pinned = false;
        snprintf(r->reason, sizeof r->reason, "%s: %s", devio_status_str(st), e.message);
        n->failed++;
        devio_log(DEVIO_LOG_WARN, "adapters", "adapter '%s' (%s): not loaded again: %s", r->name,
                  r->path, r->reason);
        return;
    }
    int64_t last_used = r->last_used_ms;
    *r = ack.adapters[0];
    r->loaded_ms = devio_unix_ms();
    r->last_used_ms = last_used;
    n->loaded++;
    devio_log(DEVIO_LOG_INFO, "adapters", "adapter '%s' (%s): loaded again%s", r->name, r->path,
              r->pinned ? ", pinned" : "");
    if (ack.evicted[0]) {
        devio_error werr = {0};
        devio_log(DEVIO_LOG_INFO, "adapters", "adapter '%s' evicted to make room for '%s'",
                  ack.evicted, r->name);
        if (record_eviction(a->store, ack.evicted, &werr) != DEVIO_OK)
            devio_log(DEVIO_LOG_ERROR, "adapters", "adapter '%s': eviction not recorded: %s",
                      ack.evicted, werr.message);
    }
    devio_adapter_ack_free(&ack);
}

devio_status devio_adapters_start(devio_adapters *a, devio_store *store, devio_device *dev,
                                  devio_adapters_restored *out, devio_error *err)
{
    devio_adapters_restored n = {0};
    devio_adapter_record *rows = NULL;
    size_t n_rows = 0, k = 0;
    pthread_mutex_lock(&a->mu);
    a->store = store;
    devio_status st = devio_store_adapters_list(store, &rows, &n_rows, err);
    if (st != DEVIO_OK)
        goto out;
    for (size_t i = 0; i < n_rows; i++)
        if (is_loaded(&rows[i]))
            rows[k++] = rows[i];
    /* Least recently used first: if fewer fit now, the recent ones stay. */
    qsort(rows, k, sizeof *rows, by_last_use);
    for (size_t i = 0; i < k; i++) {
        restore_one(a, dev, &rows[i], &n);
        devio_error werr = {0};
        if (devio_store_adapter_put(store, &rows[i], &werr) != DEVIO_OK)
            devio_log(DEVIO_LOG_ERROR, "adapters", "adapter '%s': record not written: %s",
                      rows[i].name, werr.message);
    }
out:
    pthread_mutex_unlock(&a->mu);
    free(rows);
    if (out)
        *out = n;
    return st;
}

/* ---- the root ------------------------------------------------------------------ */

devio_status devio_adapters_root(const char *path, bool given, const char **root,
                                 devio_error *err)
{
    struct stat sb;
    *root = path;
    bool found = stat(path, &sb) == 0;
    if (found && S_ISDIR(sb.st_mode))
        return DEVIO_OK;
    if (!found && errno == ENOENT && given && mkdir(path, 0750) == 0) {
        devio_log(DEVIO_LOG_INFO, "adapters", "adapters root '%s' created (it was missing)",
                  path);
        return DEVIO_OK;
    }
    const char *why = found ? "not a directory" : strerror(errno);
    if (given)
        return devio_fail(err, DEVIO_E_INVALID, "--adapters '%s': %s", path, why);
    devio_log(DEVIO_LOG_WARN, "adapters",
              "adapters root '%s': %s; loading adapters is off (give --adapters DIR)",
              path, why);
    *root = NULL;
    return DEVIO_OK;
}
