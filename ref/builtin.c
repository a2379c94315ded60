/* builtin.c - the registry of the backends linked into this binary.
 * It holds no state of its own: the list is constant data. */
#include <string.h>

#include "ref/builtin.h"
#include "ref/ref_backend.h"
#ifdef DEVIO_BUILTIN_CPU
#include "cpu/cpu_backend.h"
#endif

/* The first is auto's last resort (device/backend/registry.h). */
static const devio_backend_ops *const builtin[] = {
    &devio_ref_backend,
#ifdef DEVIO_BUILTIN_CPU
    &devio_cpu_backend,
#endif
};

void devio_registry_builtin(devio_registry *r, const char *plugin_dir)
{
    memset(r, 0, sizeof *r);
    r->builtin = builtin;
    r->n_builtin = sizeof builtin / sizeof *builtin;
    r->plugin_dir = plugin_dir;
}
