/* adapter_record.c - the names of an adapter record's states and the copy into its fixed fields.
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
