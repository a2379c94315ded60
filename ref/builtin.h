/* builtin.h - the backends built into every devio binary (the reference), as a registry.
 * Binaries open their backend through this, so --backend and plugins work the same everywhere. */
#ifndef DEVIO_REF_BUILTIN_H
#define DEVIO_REF_BUILTIN_H

#include "device/backend/registry.h"

/* Fill *r with the built-in backends (ref) and the plugin directory
 * (borrowed; NULL = next to the running binary). Close it with
 * devio_registry_close() after every device on it was torn down. */
void devio_registry_builtin(devio_registry *r, const char *plugin_dir);

#endif
