/* lora_table.c - list, pin, unpin and unload over the adapter table.
 * It must never half-apply a command: every check happens before any change. */
#include <stdlib.h>
#include <string.h>

#include "device/lora_table.h"
#include "device/status.h"

devio_status devio_lora_table_init(devio_lora_table *t, uint32_t capacity, uint32_t max_rank)
{
    memset(t, 0, sizeof *t);
    t->capacity = capacity;
    t->max_rank = max_rank;
    t->entries = calloc(capacity ? capacity : 1, sizeof *t->entries);
    return t->entries ? DEVIO_OK : DEVIO_E_NOMEM;
}

void devio_lora_table_fini(devio_lora_table *t)
{
    free(t->entries);
    memset(t, 0, sizeof *t);
}

int32_t devio_lora_table_find(const devio_lora_table *t, const char *name)
{
    if (!name)
        return -1;
    for (uint32_t i = 0; i < t->capacity; i++)
        if (t->entries[i].used && strcmp(t->entries[i].info.name, name) == 0)
            return (int32_t)i;
    return -1;
}

static devio_status ack_one(devio_lora_ack *ack, const devio_adapter_info *info)
{
    ack->adapters = malloc(sizeof *ack->adapters);
    if (!ack->adapters)
        return DEVIO_E_NOMEM;
    ack->adapters[0] = *info;
    ack->n_adapters = 1;
    return DEVIO_OK;
}

devio_status devio_lora_table_apply(devio_lora_table *t, const devio_lora_cmd *cmd,
                                    devio_lora_ack *ack, devio_error *err)
{
    memset(ack, 0, sizeof *ack);
    ack->kind = cmd->kind;
    if (cmd->kind == DEVIO_LORA_LIST) {
        ack->adapters = calloc(t->n_loaded ? t->n_loaded : 1, sizeof *ack->adapters);
        if (!ack->adapters)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory listing adapters");
        for (uint32_t i = 0; i < t->capacity; i++)
            if (t->entries[i].used)
                ack->adapters[ack->n_adapters++] = t->entries[i].info;
        return DEVIO_OK;
    }
    if (!cmd->name || !cmd->name[0])
        return devio_fail(err, DEVIO_E_INVALID, "adapter command needs a name");
    if (cmd->kind == DEVIO_LORA_LOAD)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "adapter '%s': this device has no PEFT adapter loader", cmd->name);
    int32_t i = devio_lora_table_find(t, cmd->name);
    if (i < 0)
        return devio_fail(err, DEVIO_E_UNKNOWN_ADAPTER, "adapter '%s' is not loaded", cmd->name);
    devio_lora_entry *e = &t->entries[i];
    devio_adapter_info before = e->info;
    switch (cmd->kind) {
    case DEVIO_LORA_PIN: e->info.pinned = true; break;
    case DEVIO_LORA_UNPIN: e->info.pinned = false; break;
    case DEVIO_LORA_UNLOAD: break;
    default: return devio_fail(err, DEVIO_E_INVALID, "unknown adapter command");
    }
    if (ack_one(ack, &e->info) != DEVIO_OK) {
        e->info = before;
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    }
    if (cmd->kind == DEVIO_LORA_UNLOAD) {
        e->used = false;
        t->n_loaded--;
    }
    return DEVIO_OK;
}
