/* bad_plugin.c - plugins the registry must refuse, one per build flag: another ABI
 * version (BAD_ABI), no entry symbol (NO_ENTRY), a name other than the file's (WRONG_NAME).
 * Test code only; nothing here ever computes. */
#include <stddef.h>

#include "device/backend/backend.h"

#ifndef NO_ENTRY
static devio_status never_create(const devio_model *m, const devio_backend_config *c, void **s,
                                 devio_error *e)
{
    (void)m;
    (void)c;
    (void)e;
    *s = NULL;
    return DEVIO_E_DEVICE;
}

static const devio_backend_ops bad = {
#ifdef BAD_ABI
    .abi = 1,
    .name = "badabi",
#else
    .abi = DEVIO_BACKEND_ABI,
    .name = "somebody-else",
#endif
    .create = never_create,
};

const devio_backend_ops *devio_backend_plugin(void);
const devio_backend_ops *devio_backend_plugin(void) { return &bad; }
#else
int devio_not_a_backend(void);
int devio_not_a_backend(void) { return 0; }
#endif
