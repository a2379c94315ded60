/* registry.h - backends by name: the ones built into this binary, and
 * plugins (libdevio-backend-NAME.so) loaded with dlopen, e.g. the CUDA one.
 * It never computes and never opens a device; it only finds a vtable. */
#ifndef DEVIO_REGISTRY_H
#define DEVIO_REGISTRY_H

#include <stdint.h>

#include "device/backend/backend.h"

#define DEVIO_REGISTRY_MAX_PLUGINS 8

/* A plugin is the shared object DIR/libdevio-backend-NAME.so exporting
 *   const devio_backend_ops *devio_backend_plugin(void);
 * whose ops carry abi == DEVIO_BACKEND_ABI and name == NAME. */
#define DEVIO_PLUGIN_SYMBOL "devio_backend_plugin"
#define DEVIO_PLUGIN_PREFIX "libdevio-backend-"

/* Fill builtin/n_builtin/plugin_dir, zero the rest; release with
 * devio_registry_close() once no device uses a backend it found. */
typedef struct devio_registry {
    const devio_backend_ops *const *builtin; /* borrowed; the first is auto's last resort */
    uint32_t n_builtin;
    const char *plugin_dir; /* borrowed; NULL = the directory of the running binary */
    devio_numerics numerics; /* what the device will run: under fast, `auto` without a GPU
                                takes the built-in cpu backend (0: strict) */
    /* What `auto` tried and passed over, for the log: "cuda: no plugin ...". */
    char note[512];
    void *handles[DEVIO_REGISTRY_MAX_PLUGINS]; /* dlopen handles, owned */
    uint32_t n_handles;
} devio_registry;

/* The backend called `name`: a built-in one, else the plugin of that name.
 * "auto" takes the CUDA plugin when it loads and its probe finds a device,
 * else, under fast numerics (r->numerics), the built-in cpu backend when
 * this binary has it, else the first built-in backend, and says in r->note
 * what it passed over.
 * DEVIO_E_UNSUPPORTED, naming the backends that do exist (built in, and the
 * plugin files in the directory) and the file looked for, when no backend of
 * that name is built in and no plugin of that name is found; DEVIO_E_UNSUPPORTED when a
 * plugin has another ABI version, lacks its entry symbol, is named
 * otherwise or fails devio_backend_check. *out is borrowed from r (or from
 * static storage) and stays valid until devio_registry_close. */
devio_status devio_registry_find(devio_registry *r, const char *name,
                                 const devio_backend_ops **out, devio_error *err);

/* Drop the plugins' handles. Every device opened on one must be torn down
 * first. Where the platform allows (RTLD_NODELETE) a plugin's code and data
 * stay mapped until the process ends: the CUDA runtime and the emulated
 * device keep process-wide state that outlives a backend. */
void devio_registry_close(devio_registry *r);

#endif
