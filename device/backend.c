/* backend.c - checked wrappers around the backend vtable.
 * The core reaches a backend only through these; they never compute. */
#include <stddef.h>

#include "device/backend.h"
#include "device/status.h"

devio_status devio_backend_check(const devio_backend_ops *ops, devio_error *err)
{
    if (!ops)
        return devio_fail(err, DEVIO_E_INVALID, "no backend given");
    if (ops->version != DEVIO_BACKEND_VERSION)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' has interface version %u, devio needs %u",
                          ops->name ? ops->name : "?", ops->version, DEVIO_BACKEND_VERSION);
    if (!ops->create || !ops->destroy || !ops->forward)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' lacks a required slot",
                          ops->name ? ops->name : "?");
    return DEVIO_OK;
}

devio_status devio_backend_create(const devio_backend_ops *ops, const devio_model *model,
                                  const devio_backend_config *cfg, void **state,
                                  devio_error *err)
{
    *state = NULL;
    devio_status s = devio_backend_check(ops, err);
    if (s != DEVIO_OK)
        return s;
    s = ops->create(model, cfg, state, err);
    if (s != DEVIO_OK)
        *state = NULL;
    return s;
}

void devio_backend_destroy(const devio_backend_ops *ops, void *state)
{
    if (ops && state)
        ops->destroy(state);
}

devio_status devio_backend_forward(const devio_backend_ops *ops, void *state,
                                   const devio_batch *batch, devio_error *err)
{
    if (!state)
        return devio_fail(err, DEVIO_E_TORN_DOWN, "backend released");
    if (batch->n_tokens == 0)
        return DEVIO_OK;
    return ops->forward(state, batch, err);
}
