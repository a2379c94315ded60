/* adapter_table.c - load, unload, list, pin and unpin over the adapter table, and the acknowledgement's free.
 * It must never half-apply a command: every check and the slow load happen before any change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/core/adapter_table.h"
#include "device/status.h"

devio_status devio_adapter_table_init(devio_adapter_table *t, uint32_t capacity, uint32_t max_rank,
                                   const char *root, const devio_model *model,
                                   const devio_backend_ops *ops, void *backend)
{
    memset(t, 0, sizeof *t);
    t->ops = ops;
    t->backend = backend;
    t->capacity = capacity;
    t->max_rank = max_rank;
    t->root = root;
    t->model = model;
    t->entries = calloc(capacity ? capacity : 1, sizeof *t->entries);
    return t->entries ? DEVIO_OK : DEVIO_E_NOMEM;
}

/* Take entry e out of the backend's slot and free its weights. */
static void drop(devio_adapter_table *t, uint32_t i)
{
    devio_adapter_entry *e = &t->entries[i];
    if (t->ops && t->backend)
        devio_backend_adapter_remove(t->ops, t->backend, i, e->generation);
    devio_adapter_free(e->weights);
    e->weights = NULL;
    e->used = false;
    e->in_use = 0;
    e->generation++;
    t->n_loaded--;
}

void devio_adapter_table_fini(devio_adapter_table *t)
{
    for (uint32_t i = 0; t->entries && i < t->capacity; i++)
        if (t->entries[i].used)
            drop(t, i);
    free(t->entries);
    memset(t, 0, sizeof *t);
}

int32_t devio_adapter_table_find(const devio_adapter_table *t, const char *name)
{
    if (!name)
        return -1;
    for (uint32_t i = 0; i < t->capacity; i++)
        if (t->entries[i].used && strcmp(t->entries[i].rec.name, name) == 0)
            return (int32_t)i;
    return -1;
}

void devio_adapter_table_acquire(devio_adapter_table *t, int32_t i)
{
    devio_adapter_entry *e = &t->entries[i];
    e->in_use++;
    e->rec.rows_served++;
    e->last_use = ++t->clock;
}

void devio_adapter_table_release(devio_adapter_table *t, int32_t i, uint32_t gen)
{
    if (i < 0 || (uint32_t)i >= t->capacity)
        return;
    devio_adapter_entry *e = &t->entries[i];
    if (e->used && e->generation == gen && e->in_use > 0)
        e->in_use--;
}

static devio_status ack_one(devio_adapter_ack *ack, const devio_adapter_record *rec)
{
    ack->adapters = malloc(sizeof *ack->adapters);
    if (!ack->adapters)
        return DEVIO_E_NOMEM;
    ack->adapters[0] = *rec;
    ack->n_adapters = 1;
    return DEVIO_OK;
}

/* The record of a loaded adapter (state loaded; the store's fields 0). */
static void record_from(devio_adapter_record *rec, const devio_adapter *a, bool pinned)
{
    memset(rec, 0, sizeof *rec);
    snprintf(rec->name, sizeof rec->name, "%s", a->name);
    snprintf(rec->path, sizeof rec->path, "%s", a->path);
    rec->rank = a->rank;
    rec->alpha = a->alpha;
    rec->scale = a->scale;
    size_t n = 0;
    for (int k = 0; k < DEVIO_LORA_N_TARGETS; k++) {
        if (!(a->targets & (1u << k)))
            continue;
        int w = snprintf(rec->targets + n, sizeof rec->targets - n, "%s%s", n ? "," : "",
                         devio_lora_target_name((devio_lora_target)k));
        if (w > 0 && (size_t)w < sizeof rec->targets - n)
            n += (size_t)w;
    }
    snprintf(rec->sha256, sizeof rec->sha256, "%s", a->sha256);
    rec->size = a->size;
    rec->state = DEVIO_ADAPTER_LOADED;
    rec->pinned = pinned;
}

/* The entry a load may take: a free one, or the LRU evictable one; -1 when none. */
static int32_t entry_for_load(const devio_adapter_table *t)
{
    int32_t victim = -1;
    for (uint32_t i = 0; i < t->capacity; i++) {
        const devio_adapter_entry *e = &t->entries[i];
        if (!e->used)
            return (int32_t)i;
        if (e->rec.pinned || e->in_use > 0)
            continue;
        if (victim < 0 || e->last_use < t->entries[victim].last_use)
            victim = (int32_t)i;
    }
    return victim;
}

/* Give the backend's slot i to adapter a under a new generation. An
 * adapter in the slot is removed first; when the backend refuses a, the
 * old one goes back (under yet another generation), so a failed load
 * changes nothing. The table's entry itself is the caller's to update. */
static devio_status place(devio_adapter_table *t, uint32_t i, const devio_adapter *a,
                          devio_error *err)
{
    devio_adapter_entry *e = &t->entries[i];
    if (e->used)
        devio_backend_adapter_remove(t->ops, t->backend, i, e->generation);
    e->generation++;
    devio_status s = devio_backend_adapter_add(t->ops, t->backend, i, e->generation, a, err);
    if (s == DEVIO_OK || !e->used)
        return s;
    devio_error again = {0};
    e->generation++;
    if (devio_backend_adapter_add(t->ops, t->backend, i, e->generation, e->weights, &again) !=
        DEVIO_OK) {
        /* The backend lost the evicted adapter as well: unload it for real
         * rather than keep an entry no step could use. */
        fprintf(stderr, "devio: backend '%s' refused adapter '%s' back: %s\n", t->ops->name,
                e->rec.name, again.message);
        devio_adapter_free(e->weights);
        e->weights = NULL;
        e->used = false;
        e->generation++;
        t->n_loaded--;
    }
    return s;
}

static devio_status load(devio_adapter_table *t, const devio_adapter_cmd *cmd, devio_adapter_ack *ack,
                         devio_error *err)
{
    if (!t->root)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "adapter '%s': no adapters root is configured", cmd->name);
    if (strlen(cmd->name) >= sizeof ack->evicted)
        return devio_fail(err, DEVIO_E_INVALID, "adapter name longer than %zu bytes",
                          sizeof ack->evicted - 1);
    if (t->capacity == 0)
        return devio_fail(err, DEVIO_E_ADAPTER_CAPACITY, "max_loras is 0");
    if (!devio_backend_has_adapters(t->ops))
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' does not run LoRA adapters",
                          t->ops->name);
    devio_adapter *a = NULL;
    devio_status s = devio_adapter_load(t->root, cmd->path, cmd->name, t->model, t->max_rank, &a,
                                        err);
    /* A malformed adapter is the command's fault, not the device's: it
     * answers like any other invalid input (a missing one already does). A
     * file that cannot be read (EIO, EACCES) stays io_error: the server's. */
    if (s == DEVIO_E_MODEL) {
        if (err)
            err->status = DEVIO_E_INVALID;
        return DEVIO_E_INVALID;
    }
    if (s != DEVIO_OK)
        return s;
    int32_t have = devio_adapter_table_find(t, cmd->name);
    if (have >= 0) {
        devio_adapter_entry *e = &t->entries[have];
        bool same = strcmp(e->weights->sha256, a->sha256) == 0 &&
                    strcmp(e->weights->path, a->path) == 0;
        devio_adapter_free(a);
        if (!same)
            return devio_fail(err, DEVIO_E_INVALID,
                              "adapter '%s' is loaded with other weights; unload it first",
                              cmd->name);
        /* The same weights again: nothing to load; a pin request still pins. */
        bool pinned = e->rec.pinned || cmd->pin;
        devio_adapter_record rec = e->rec;
        rec.pinned = pinned;
        if (ack_one(ack, &rec) != DEVIO_OK)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        e->rec.pinned = pinned;
        return DEVIO_OK;
    }
    int32_t at = entry_for_load(t);
    if (at < 0) {
        devio_adapter_free(a);
        return devio_fail_at(err, DEVIO_E_ADAPTER_CAPACITY, "max_loras", t->capacity,
                             "all %u adapter slots hold pinned adapters or adapters of "
                             "unawaited tickets",
                             t->capacity);
    }
    devio_adapter_entry *e = &t->entries[at];
    devio_adapter_record rec;
    record_from(&rec, a, cmd->pin);
    if (ack_one(ack, &rec) != DEVIO_OK) {
        devio_adapter_free(a);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    }
    s = place(t, (uint32_t)at, a, err);
    if (s != DEVIO_OK) {
        devio_adapter_ack_free(ack);
        devio_adapter_free(a);
        return s;
    }
    if (e->used) {
        snprintf(ack->evicted, sizeof ack->evicted, "%s", e->rec.name);
        devio_adapter_free(e->weights);
        t->n_loaded--;
    }
    e->used = true;
    e->rec = rec;
    e->weights = a;
    e->in_use = 0;
    e->last_use = ++t->clock;
    t->n_loaded++;
    return DEVIO_OK;
}

devio_status devio_adapter_table_apply(devio_adapter_table *t, const devio_adapter_cmd *cmd,
                                    devio_adapter_ack *ack, devio_error *err)
{
    memset(ack, 0, sizeof *ack);
    ack->kind = cmd->kind;
    if (cmd->kind == DEVIO_ADAPTER_CMD_LIST) {
        ack->adapters = calloc(t->n_loaded ? t->n_loaded : 1, sizeof *ack->adapters);
        if (!ack->adapters)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory listing adapters");
        for (uint32_t i = 0; i < t->capacity; i++)
            if (t->entries[i].used)
                ack->adapters[ack->n_adapters++] = t->entries[i].rec;
        return DEVIO_OK;
    }
    if (!cmd->name || !cmd->name[0])
        return devio_fail(err, DEVIO_E_INVALID, "adapter command needs a name");
    if (cmd->kind == DEVIO_ADAPTER_CMD_LOAD)
        return load(t, cmd, ack, err);
    int32_t i = devio_adapter_table_find(t, cmd->name);
    if (i < 0)
        return devio_fail(err, DEVIO_E_UNKNOWN_ADAPTER, "adapter '%s' is not loaded", cmd->name);
    devio_adapter_entry *e = &t->entries[i];
    devio_adapter_record rec = e->rec;
    switch (cmd->kind) {
    case DEVIO_ADAPTER_CMD_PIN: rec.pinned = true; break;
    case DEVIO_ADAPTER_CMD_UNPIN: rec.pinned = false; break;
    case DEVIO_ADAPTER_CMD_UNLOAD: break;
    default: return devio_fail(err, DEVIO_E_INVALID, "unknown adapter command");
    }
    if (ack_one(ack, &rec) != DEVIO_OK)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    e->rec = rec;
    if (cmd->kind == DEVIO_ADAPTER_CMD_UNLOAD) {
        ack->adapters[0].state = DEVIO_ADAPTER_UNLOADED;
        /* Every launched step has run (quiescence), so no step reads the
         * weights any more; tickets not yet awaited only hold a count. */
        drop(t, (uint32_t)i);
    }
    return DEVIO_OK;
}

void devio_adapter_ack_free(devio_adapter_ack *a)
{
    if (!a)
        return;
    free(a->adapters);
    a->adapters = NULL;
    a->n_adapters = 0;
}
