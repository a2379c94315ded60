/* adapters.c - adapter commands over the device's LoRA table with their SQLite rows, and the reload at start.
 * It must never answer before the rows of a device change are written, nor let a failure overwrite a loaded adapter's row. */
/* glibc declares realpath() only for XSI; the build's _POSIX_C_SOURCE alone hides it. */
#define _XOPEN_SOURCE 700
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/codec.h"
#include "device/adapter.h"
#include "device/status.h"
#include "service/adapters.h"

#define PATH_MAX_BYTES 256 /* devio_adapter_info.path */

/* One adapter row with its own storage, plus the device's count. */
typedef struct rec {
    char name[64];
    char path[PATH_MAX_BYTES];
    uint32_t rank;
    double alpha, scale;
    char targets[128];
    char sha256[65]; /* "" = none (NULL in the row) */
    uint64_t size;
    const char *state; /* static: "loaded", "unloaded", "stale", "failed" */
    bool pinned;
    int64_t loaded_ms, last_used_ms;
    char reason[320]; /* "" = none */
    uint64_t rows_served;
} rec;

static const char *const states[] = {"loaded", "unloaded", "stale", "failed"};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

/* ---- records ------------------------------------------------------------------ */

static void copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

static const char *state_of(const char *s)
{
    for (size_t i = 0; s && i < sizeof states / sizeof *states; i++)
        if (strcmp(states[i], s) == 0)
            return states[i];
    return NULL;
}

static void rec_from_info(rec *r, const devio_adapter_info *i)
{
    memset(r, 0, sizeof *r);
    copy(r->name, sizeof r->name, i->name);
    copy(r->path, sizeof r->path, i->path);
    r->rank = i->rank;
    r->alpha = i->alpha;
    r->scale = i->scale;
    copy(r->targets, sizeof r->targets, i->targets);
    copy(r->sha256, sizeof r->sha256, i->sha256);
    r->size = i->size;
    r->pinned = i->pinned;
    r->rows_served = i->rows_served;
    r->state = "loaded";
}

/* A row of devio_store_adapters_list. False when it is not one. */
static bool rec_from_row(rec *r, const json_t *o)
{
    memset(r, 0, sizeof *r);
    const char *name = json_string_value(json_object_get(o, "name"));
    r->state = state_of(json_string_value(json_object_get(o, "state")));
    if (!name || !r->state)
        return false;
    copy(r->name, sizeof r->name, name);
    copy(r->path, sizeof r->path, json_string_value(json_object_get(o, "path")));
    r->rank = (uint32_t)json_integer_value(json_object_get(o, "rank"));
    r->alpha = json_number_value(json_object_get(o, "alpha"));
    r->scale = json_number_value(json_object_get(o, "scale"));
    copy(r->targets, sizeof r->targets, json_string_value(json_object_get(o, "targets")));
    copy(r->sha256, sizeof r->sha256, json_string_value(json_object_get(o, "sha256")));
    r->size = (uint64_t)json_integer_value(json_object_get(o, "size"));
    r->pinned = json_is_true(json_object_get(o, "pinned"));
    r->loaded_ms = json_integer_value(json_object_get(o, "loaded_ms"));
    r->last_used_ms = json_integer_value(json_object_get(o, "last_used_ms"));
    copy(r->reason, sizeof r->reason, json_string_value(json_object_get(o, "reason")));
    return true;
}

static devio_status rec_put(devio_store *s, const rec *r, devio_error *err)
{
    devio_adapter_record row = {
        .name = r->name, .path = r->path, .rank = r->rank, .alpha = r->alpha,
        .scale = r->scale, .targets = r->targets, .sha256 = r->sha256[0] ? r->sha256 : NULL,
        .size = r->size, .state = r->state, .pinned = r->pinned, .loaded_ms = r->loaded_ms,
        .last_used_ms = r->last_used_ms, .reason = r->reason[0] ? r->reason : NULL,
    };
    return devio_store_adapter_put(s, &row, err);
}

static json_t *targets_json(const char *t)
{
    json_t *a = json_array();
    while (a && t && *t) {
        size_t n = strcspn(t, ",");
        if (n > 0 && json_array_append_new(a, json_stringn(t, n)) != 0) {
            json_decref(a);
            return NULL;
        }
        t += n;
        if (*t == ',')
            t++;
    }
    return a;
}

/* The wire record; NULL on out of memory. */
static json_t *rec_json(const rec *r)
{
    return json_pack("{s:s,s:s,s:I,s:o,s:o,s:o,s:o,s:I,s:s,s:b,s:I,s:I,s:I,s:o}", "name",
                     r->name, "path", r->path, "rank", (json_int_t)r->rank, "alpha",
                     devio_json_float((float)r->alpha), "scale",
                     devio_json_float((float)r->scale), "targets", targets_json(r->targets),
                     "sha256", r->sha256[0] ? json_string(r->sha256) : json_null(), "size",
                     (json_int_t)r->size, "state", r->state, "pinned", r->pinned,
                     "rows_served", (json_int_t)r->rows_served, "loaded_ms",
                     (json_int_t)r->loaded_ms, "last_used_ms", (json_int_t)r->last_used_ms,
                     "reason", r->reason[0] ? json_string(r->reason) : json_null());
}

static int rec_cmp(const void *x, const void *y)
{
    return strcmp(((const rec *)x)->name, ((const rec *)y)->name);
}

/* ---- store and device reads ----------------------------------------------------- */

/* The row of `name`, if any. */
static devio_status row_of(devio_store *s, const char *name, rec *r, bool *found,
                           devio_error *err)
{
    json_t *rows = NULL;
    *found = false;
    devio_status st = devio_store_adapters_list(s, &rows, err);
    if (st != DEVIO_OK)
        return st;
    const json_t *o;
    size_t i;
    json_array_foreach(rows, i, o)
    {
        const char *n = json_string_value(json_object_get(o, "name"));
        if (n && strcmp(n, name) == 0) {
            *found = rec_from_row(r, o);
            break;
        }
    }
    json_decref(rows);
    return DEVIO_OK;
}

static bool is_loaded(const rec *r) { return strcmp(r->state, "loaded") == 0; }

/* Rows merged with the device's table; the device wins where they disagree.
 * *out is a malloc'd array (caller frees): the loaded adapters in the
 * device's own list order, which is what an in-process `lora` list prints,
 * then the other records by name. */
static devio_status merged(devio_store *s, devio_device *dev, rec **out, size_t *n_out,
                           devio_error *err)
{
    json_t *rows = NULL;
    devio_lora_ack live = {0};
    rec *recs = NULL, *row = NULL;
    devio_status st = devio_store_adapters_list(s, &rows, err);
    if (st != DEVIO_OK)
        goto out;
    devio_lora_cmd cmd = {.kind = DEVIO_LORA_LIST};
    st = devio_lora(dev, &cmd, &live, err);
    if (st != DEVIO_OK)
        goto out;
    recs = calloc(json_array_size(rows) + live.n_adapters + 1, sizeof *recs);
    row = malloc(sizeof *row);
    if (!recs || !row) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory listing adapters");
        goto out;
    }
    size_t n = live.n_adapters, i;
    for (uint32_t k = 0; k < live.n_adapters; k++)
        rec_from_info(&recs[k], &live.adapters[k]);
    const json_t *o;
    json_array_foreach(rows, i, o)
    {
        if (!rec_from_row(row, o))
            continue;
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
            row->state = "unloaded";
            row->pinned = false;
            copy(row->reason, sizeof row->reason, "not loaded on the device");
        }
        recs[n++] = *row;
    }
    qsort(recs + live.n_adapters, n - live.n_adapters, sizeof *recs, rec_cmp);
    *out = recs;
    *n_out = n;
    recs = NULL;
out:
    free(recs);
    free(row);
    devio_lora_ack_free(&live);
    json_decref(rows);
    return st;
}

/* ---- paths -------------------------------------------------------------------- */

/* The device refuses the same paths when it loads; they are judged here
 * first so that a path leading out of the root is refused as a request, with
 * nothing stored about it, rather than recorded as an adapter that failed. */
static devio_status refuse_outside(const char *root, const char *rel, devio_error *err)
{
    return root ? devio_adapter_path_check(root, rel, err) : DEVIO_OK;
}

/* ---- commands ----------------------------------------------------------------- */

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
    fprintf(stderr, "devio-server: adapter '%s' %s, but its record could not be written: %s\n",
            name, what, werr->message);
    return devio_fail(err, DEVIO_E_IO, "adapter '%s' %s, but its record could not be written: %s",
                      name, what, werr->message);
}

/* A failed load leaves a "failed" row, unless a loaded adapter owns the name
 * or the failure says nothing about the adapter (out of memory, torn down). */
static void record_failure(devio_store *s, const char *name, const char *path, bool have_prev,
                           const rec *prev, const devio_error *cause)
{
    if (cause->status == DEVIO_E_NOMEM || cause->status == DEVIO_E_TORN_DOWN ||
        cause->status == DEVIO_E_NOT_READY)
        return;
    if (have_prev && is_loaded(prev))
        return;
    rec r = {.state = "failed", .last_used_ms = now_ms()};
    copy(r.name, sizeof r.name, name);
    copy(r.path, sizeof r.path, path);
    snprintf(r.reason, sizeof r.reason, "%s: %s", devio_status_str(cause->status),
             cause->message);
    devio_error werr = {0};
    /* The device did not change: the answer stays the load's error. */
    if (rec_put(s, &r, &werr) != DEVIO_OK)
        fprintf(stderr, "devio-server: adapter '%s': the failed load could not be recorded: %s\n",
                name, werr.message);
}

/* The evicted adapter's row becomes "unloaded", reason "evicted". */
static devio_status record_eviction(devio_store *s, const char *evicted, devio_error *werr)
{
    rec ev;
    bool found = false;
    devio_status st = row_of(s, evicted, &ev, &found, werr);
    if (st != DEVIO_OK)
        return st;
    if (!found) {
        fprintf(stderr, "devio-server: evicted adapter '%s' had no record\n", evicted);
        return DEVIO_OK;
    }
    ev.state = "unloaded";
    ev.pinned = false;
    copy(ev.reason, sizeof ev.reason, "evicted");
    return rec_put(s, &ev, werr);
}

devio_status devio_adapters_load(devio_adapters *a, devio_device *dev, const char *name,
                                 const char *path, bool pin, json_t **out, devio_error *err)
{
    *out = NULL;
    if (!a->store)
        return not_started(err);
    if (!path || !path[0])
        return devio_fail(err, DEVIO_E_INVALID, "load needs a non-empty 'path'");
    if (strlen(path) >= PATH_MAX_BYTES)
        return devio_fail(err, DEVIO_E_INVALID, "adapter path longer than %d bytes",
                          PATH_MAX_BYTES - 1);
    devio_error local = {0};
    if (!err)
        err = &local; /* the failure's message goes into its row */
    devio_lora_ack ack = {0};
    rec prev, r;
    bool have_prev = false;
    pthread_mutex_lock(&a->mu);
    devio_status st = refuse_outside(devio_config_of(dev)->adapters_root, path, err);
    if (st == DEVIO_OK)
        st = row_of(a->store, name, &prev, &have_prev, err);
    if (st != DEVIO_OK)
        goto out_unlock;
    devio_lora_cmd cmd = {.kind = DEVIO_LORA_LOAD, .name = name, .path = path, .pin = pin};
    st = devio_lora(dev, &cmd, &ack, err);
    if (st != DEVIO_OK) {
        record_failure(a->store, name, path, have_prev, &prev, err);
        goto out_unlock;
    }
    if (ack.n_adapters == 0) {
        st = no_adapter_in_ack(err, name);
        goto out_unlock;
    }
    int64_t now = now_ms();
    rec_from_info(&r, &ack.adapters[0]);
    /* An idempotent re-load keeps the weights, so it keeps their load time. */
    bool same = have_prev && is_loaded(&prev) && strcmp(prev.sha256, r.sha256) == 0 &&
                strcmp(prev.path, r.path) == 0;
    r.loaded_ms = same ? prev.loaded_ms : now;
    r.last_used_ms = now;
    /* The eviction first: the rows never claim more loaded adapters than
     * the device holds, so a restart never loads more than fitted. */
    devio_error werr = {0};
    devio_status ws = ack.evicted[0] ? record_eviction(a->store, ack.evicted, &werr) : DEVIO_OK;
    if (ws == DEVIO_OK)
        ws = rec_put(a->store, &r, &werr);
    if (ws != DEVIO_OK) {
        char what[160];
        snprintf(what, sizeof what, "is loaded on the device%s%.64s%s",
                 ack.evicted[0] ? " (evicting '" : "", ack.evicted, ack.evicted[0] ? "')" : "");
        st = write_failed(err, name, what, &werr);
        goto out_unlock;
    }
    *out = rec_json(&r);
    if (*out && ack.evicted[0] &&
        json_object_set_new(*out, "evicted", json_string(ack.evicted)) != 0) {
        json_decref(*out);
        *out = NULL;
    }
    if (!*out)
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the adapter record");
out_unlock:
    pthread_mutex_unlock(&a->mu);
    devio_lora_ack_free(&ack);
    return st;
}

devio_status devio_adapters_unload(devio_adapters *a, devio_device *dev, const char *name,
                                   json_t **out, devio_error *err)
{
    *out = NULL;
    if (!a->store)
        return not_started(err);
    devio_lora_ack ack = {0};
    rec prev, r;
    bool have_prev = false;
    pthread_mutex_lock(&a->mu);
    devio_status st = row_of(a->store, name, &prev, &have_prev, err);
    if (st != DEVIO_OK)
        goto out_unlock;
    devio_lora_cmd cmd = {.kind = DEVIO_LORA_UNLOAD, .name = name};
    st = devio_lora(dev, &cmd, &ack, err);
    if (st == DEVIO_OK && ack.n_adapters == 0)
        st = no_adapter_in_ack(err, name);
    if (st != DEVIO_OK)
        goto out_unlock;
    /* rows_served stays the device's count at the unload, for this answer. */
    rec_from_info(&r, &ack.adapters[0]);
    r.state = "unloaded";
    r.pinned = false;
    r.loaded_ms = have_prev ? prev.loaded_ms : 0;
    r.last_used_ms = now_ms();
    devio_error werr = {0};
    if (rec_put(a->store, &r, &werr) != DEVIO_OK) {
        st = write_failed(err, name, "is unloaded from the device", &werr);
        goto out_unlock;
    }
    *out = rec_json(&r);
    if (!*out)
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the adapter record");
out_unlock:
    pthread_mutex_unlock(&a->mu);
    devio_lora_ack_free(&ack);
    return st;
}

devio_status devio_adapters_pin(devio_adapters *a, devio_device *dev, const char *name,
                                bool pin, json_t **out, devio_error *err)
{
    *out = NULL;
    if (!a->store)
        return not_started(err);
    devio_lora_ack ack = {0};
    rec prev, r;
    bool have_prev = false;
    pthread_mutex_lock(&a->mu);
    devio_status st = row_of(a->store, name, &prev, &have_prev, err);
    if (st != DEVIO_OK)
        goto out_unlock;
    devio_lora_cmd cmd = {.kind = pin ? DEVIO_LORA_PIN : DEVIO_LORA_UNPIN, .name = name};
    st = devio_lora(dev, &cmd, &ack, err);
    if (st == DEVIO_OK && ack.n_adapters == 0)
        st = no_adapter_in_ack(err, name);
    if (st != DEVIO_OK)
        goto out_unlock;
    int64_t now = now_ms();
    rec_from_info(&r, &ack.adapters[0]);
    r.loaded_ms = have_prev && is_loaded(&prev) ? prev.loaded_ms : now;
    r.last_used_ms = now;
    devio_error werr = {0};
    if (rec_put(a->store, &r, &werr) != DEVIO_OK) {
        st = write_failed(err, name, pin ? "is pinned on the device" : "is unpinned on the device",
                          &werr);
        goto out_unlock;
    }
    *out = rec_json(&r);
    if (!*out)
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the adapter record");
out_unlock:
    pthread_mutex_unlock(&a->mu);
    devio_lora_ack_free(&ack);
    return st;
}

devio_status devio_adapters_list(devio_adapters *a, devio_device *dev, json_t **out,
                                 devio_error *err)
{
    *out = NULL;
    if (!a->store)
        return not_started(err);
    rec *recs = NULL;
    size_t n = 0;
    pthread_mutex_lock(&a->mu);
    devio_status st = merged(a->store, dev, &recs, &n, err);
    pthread_mutex_unlock(&a->mu);
    if (st != DEVIO_OK)
        return st;
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, rec_json(&recs[i])) != 0) {
            json_decref(list);
            list = NULL;
        }
    free(recs);
    if (!list)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the adapter list");
    *out = list;
    return DEVIO_OK;
}

devio_status devio_adapters_get(devio_adapters *a, devio_device *dev, const char *name,
                                json_t **out, devio_error *err)
{
    *out = NULL;
    if (!a->store)
        return not_started(err);
    rec *recs = NULL;
    size_t n = 0;
    pthread_mutex_lock(&a->mu);
    devio_status st = merged(a->store, dev, &recs, &n, err);
    pthread_mutex_unlock(&a->mu);
    if (st != DEVIO_OK)
        return st;
    size_t i = 0;
    while (i < n && strcmp(recs[i].name, name) != 0)
        i++;
    if (i == n)
        st = devio_fail(err, DEVIO_E_UNKNOWN_ADAPTER,
                        "adapter '%s' is neither loaded nor recorded", name);
    else if (!(*out = rec_json(&recs[i])))
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the adapter record");
    free(recs);
    return st;
}

/* ---- start -------------------------------------------------------------------- */

static int by_last_use(const void *x, const void *y)
{
    const rec *a = x, *b = y;
    if (a->last_used_ms != b->last_used_ms)
        return a->last_used_ms < b->last_used_ms ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Load one recorded adapter again; r is updated to what is to be written. */
static void restore_one(devio_adapters *a, devio_device *dev, rec *r,
                        devio_adapters_restored *n, FILE *log)
{
    const char *root = devio_config_of(dev)->adapters_root;
    devio_error e = {0};
    char hex[65];
    uint64_t size = 0;
    devio_lora_ack ack = {0};
    bool pinned = r->pinned;
    devio_status st = devio_adapter_file_hash(root, r->path, hex, &size, &e);
    if (st == DEVIO_OK && strcmp(hex, r->sha256) != 0) {
        r->state = "stale";
        r->pinned = false;
        copy(r->reason, sizeof r->reason, "weights changed since load");
        n->stale++;
        fprintf(log, "devio-server: adapter '%s' (%s): stale, weights changed since load\n",
                r->name, r->path);
        return;
    }
    if (st == DEVIO_OK) {
        devio_lora_cmd cmd = {.kind = DEVIO_LORA_LOAD, .name = r->name, .path = r->path,
                              .pin = pinned};
        st = devio_lora(dev, &cmd, &ack, &e);
    }
    if (st == DEVIO_OK && ack.n_adapters == 0)
        st = no_adapter_in_ack(&e, r->name);
    if (st == DEVIO_OK && strcmp(ack.adapters[0].sha256, r->sha256) != 0) {
        /* The file changed between the hash and the load: not the recorded weights. */
        devio_lora_ack un = {0};
        devio_lora_cmd cmd = {.kind = DEVIO_LORA_UNLOAD, .name = r->name};
        devio_lora(dev, &cmd, &un, NULL);
        devio_lora_ack_free(&un);
        devio_lora_ack_free(&ack);
        r->state = "stale";
        r->pinned = false;
        copy(r->reason, sizeof r->reason, "weights changed since load");
        n->stale++;
        fprintf(log, "devio-server: adapter '%s' (%s): stale, weights changed since load\n",
                r->name, r->path);
        return;
    }
    if (st != DEVIO_OK) {
        devio_lora_ack_free(&ack);
        r->state = "failed";
        r->pinned = false;
        snprintf(r->reason, sizeof r->reason, "%s: %s", devio_status_str(st), e.message);
        n->failed++;
        fprintf(log, "devio-server: adapter '%s' (%s): not loaded again: %s\n", r->name, r->path,
                r->reason);
        return;
    }
    int64_t last_used = r->last_used_ms;
    rec_from_info(r, &ack.adapters[0]);
    r->loaded_ms = now_ms();
    r->last_used_ms = last_used;
    n->loaded++;
    fprintf(log, "devio-server: adapter '%s' (%s): loaded again%s\n", r->name, r->path,
            r->pinned ? ", pinned" : "");
    if (ack.evicted[0]) {
        devio_error werr = {0};
        fprintf(log, "devio-server: adapter '%s' evicted to make room for '%s'\n", ack.evicted,
                r->name);
        if (record_eviction(a->store, ack.evicted, &werr) != DEVIO_OK)
            fprintf(log, "devio-server: adapter '%s': eviction not recorded: %s\n", ack.evicted,
                    werr.message);
    }
    devio_lora_ack_free(&ack);
}

devio_status devio_adapters_start(devio_adapters *a, devio_store *store, devio_device *dev,
                                  FILE *log, devio_adapters_restored *out, devio_error *err)
{
    devio_adapters_restored n = {0};
    json_t *rows = NULL;
    rec *pending = NULL;
    size_t k = 0;
    pthread_mutex_lock(&a->mu);
    a->store = store;
    devio_status st = devio_store_adapters_list(store, &rows, err);
    if (st != DEVIO_OK)
        goto out;
    pending = calloc(json_array_size(rows) + 1, sizeof *pending);
    if (!pending) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory reading the adapter records");
        goto out;
    }
    const json_t *o;
    size_t i;
    json_array_foreach(rows, i, o) if (rec_from_row(&pending[k], o) && is_loaded(&pending[k])) k++;
    /* Least recently used first: if fewer fit now, the recent ones stay. */
    qsort(pending, k, sizeof *pending, by_last_use);
    for (i = 0; i < k; i++) {
        restore_one(a, dev, &pending[i], &n, log);
        devio_error werr = {0};
        if (rec_put(store, &pending[i], &werr) != DEVIO_OK)
            fprintf(log, "devio-server: adapter '%s': record not written: %s\n", pending[i].name,
                    werr.message);
    }
out:
    pthread_mutex_unlock(&a->mu);
    free(pending);
    json_decref(rows);
    if (out)
        *out = n;
    return st;
}
