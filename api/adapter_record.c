/* adapter_record.c - states of an adapter record and its conversion from the device's adapter info.
 * Pure data; it must never allocate or fail. */
#include <stdio.h>
#include <string.h>

#include "api/adapter_record.h"

static const char *const state_names[DEVIO_ADAPTER_STATE_COUNT] = {
    [DEVIO_ADAPTER_LOADED] = "loaded",
    [DEVIO_ADAPTER_UNLOADED] = "unloaded",
    [DEVIO_ADAPTER_STALE] = "stale",
    [DEVIO_ADAPTER_FAILED] = "failed",
};

const char *devio_adapter_state_str(devio_adapter_state s)
{
    return (unsigned)s < DEVIO_ADAPTER_STATE_COUNT ? state_names[s] : NULL;
}

bool devio_adapter_state_parse(const char *s, devio_adapter_state *out)
{
    for (unsigned i = 0; s && i < DEVIO_ADAPTER_STATE_COUNT; i++)
        if (strcmp(s, state_names[i]) == 0) {
            *out = (devio_adapter_state)i;
            return true;
        }
    return false;
}

void devio_adapter_record_set(char *field, size_t size, const char *src)
{
    snprintf(field, size, "%s", src ? src : "");
}

void devio_adapter_record_from_info(devio_adapter_record *r, const devio_adapter_info *info,
                                    devio_adapter_state state)
{
    memset(r, 0, sizeof *r);
    devio_adapter_record_set(r->name, sizeof r->name, info->name);
    devio_adapter_record_set(r->path, sizeof r->path, info->path);
    r->rank = info->rank;
    r->alpha = info->alpha;
    r->scale = info->scale;
    devio_adapter_record_set(r->targets, sizeof r->targets, info->targets);
    devio_adapter_record_set(r->sha256, sizeof r->sha256, info->sha256);
    r->size = info->size;
    r->state = state;
    r->pinned = info->pinned;
    r->rows_served = info->rows_served;
}
