/* registry.c - find a backend by name: built in, or a plugin .so loaded with dlopen.
 * It must never keep a plugin whose ABI or name is not the one asked for, and never open a device. */
#include <stdio.h>
#include <string.h>

#if !defined(__wasi__)
#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
#define HAVE_DLOPEN 1
#endif

#include "device/backend/registry.h"
#include "device/status.h"

typedef const devio_backend_ops *(*plugin_entry)(void);

/* A plugin once loaded stays mapped until the process ends (dlclose only
 * drops the handle): the CUDA runtime inside it, and the emulated device,
 * keep process-wide state (the device context, exit handlers, the handle
 * tables) that must outlive any one backend, and the leak check at exit
 * must still see the memory that state holds. */
#ifdef RTLD_NODELETE
#define PLUGIN_STAYS RTLD_NODELETE
#else
#define PLUGIN_STAYS 0
#endif

/* Plugins `auto` tries before the built-in backends, best first; and the
 * built-in one it takes next under fast numerics. */
static const char *const auto_plugins[] = {"cuda"};
static const char *const auto_fast_builtin = "cpu";

static void note(devio_registry *r, const char *name, const devio_error *why)
{
    size_t n = strlen(r->note);
    snprintf(r->note + n, sizeof r->note - n, "%s%s: %s", n ? "; " : "", name, why->message);
}

/* The built-in backends' names, "ref, ..." into buf ("" when none). */
static void builtin_names(const devio_registry *r, char *buf, size_t n)
{
    buf[0] = '\0';
    for (uint32_t i = 0; i < r->n_builtin; i++) {
        size_t len = strlen(buf);
        if (r->builtin[i] && r->builtin[i]->name)
            snprintf(buf + len, n - len, "%s%s", len ? ", " : "", r->builtin[i]->name);
    }
}

#ifdef HAVE_DLOPEN
static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The plugin names found in dir (files DEVIO_PLUGIN_PREFIX NAME ".so"),
 * sorted, "a, b" into buf; "" when none or dir cannot be read. Names only:
 * nothing is loaded, so a file listed may still fail to load. */
static void plugin_names(const char *dir, char *buf, size_t n)
{
    enum { MAX_LISTED = 32 };
    char names[MAX_LISTED][72];
    const char *sorted[MAX_LISTED];
    size_t count = 0, pre = strlen(DEVIO_PLUGIN_PREFIX);
    buf[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e = readdir(d); e && count < MAX_LISTED; e = readdir(d)) {
        size_t len = strlen(e->d_name);
        if (len <= pre + 3 || strncmp(e->d_name, DEVIO_PLUGIN_PREFIX, pre) != 0 ||
            strcmp(e->d_name + len - 3, ".so") != 0 || len - pre - 3 >= sizeof names[0])
            continue;
        snprintf(names[count], sizeof names[0], "%.*s", (int)(len - pre - 3), e->d_name + pre);
        sorted[count] = names[count];
        count++;
    }
    closedir(d);
    qsort(sorted, count, sizeof *sorted, by_name);
    for (size_t i = 0; i < count; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", i ? ", " : "", sorted[i]);
    }
}

/* The directory plugins are looked up in, into buf. */
static devio_status plugin_dir(const devio_registry *r, char *buf, size_t n, devio_error *err)
{
    if (r->plugin_dir) {
        snprintf(buf, n, "%s", r->plugin_dir);
        return DEVIO_OK;
    }
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);
    if (len > 0) {
        buf[len] = '\0';
        char *slash = strrchr(buf, '/');
        if (slash) {
            *slash = '\0';
            return DEVIO_OK;
        }
    }
    return devio_fail(err, DEVIO_E_UNSUPPORTED,
                      "cannot tell where this binary lives; give the plugin directory");
}

#endif

static devio_status load_plugin(devio_registry *r, const char *name, const devio_backend_ops **out,
                                devio_error *err)
{
#ifdef HAVE_DLOPEN
    char dir[512], path[700];
    devio_status s = plugin_dir(r, dir, sizeof dir, err);
    if (s != DEVIO_OK)
        return s;
    if (strchr(name, '/') || strlen(name) > 64)
        return devio_fail(err, DEVIO_E_INVALID, "backend name '%s' is not a plain name", name);
    snprintf(path, sizeof path, "%s/%s%s.so", dir, DEVIO_PLUGIN_PREFIX, name);
    if (access(path, F_OK) != 0) {
        /* Say what does exist, so that a typo is seen for one; the directory
         * last, where a message cut to fit loses least. */
        char built[96], found[160];
        builtin_names(r, built, sizeof built);
        plugin_names(dir, found, sizeof found);
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "no backend '%s'; the backends here: %s (built in)%s%s%s; "
                          "no %s%s.so in %s", name, built[0] ? built : "none",
                          found[0] ? ", " : "", found, found[0] ? " (plugins)" : "",
                          DEVIO_PLUGIN_PREFIX, name, dir);
    }
    if (r->n_handles >= DEVIO_REGISTRY_MAX_PLUGINS)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "more than %d backend plugins",
                          DEVIO_REGISTRY_MAX_PLUGINS);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | PLUGIN_STAYS);
    if (!h)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "cannot load backend plugin %s: %s", path,
                          dlerror());
    plugin_entry entry;
    /* POSIX guarantees a data pointer from dlsym converts to a function pointer. */
    *(void **)&entry = dlsym(h, DEVIO_PLUGIN_SYMBOL);
    const devio_backend_ops *ops = entry ? entry() : NULL;
    if (!ops) {
        dlclose(h);
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend plugin %s has no %s entry", path,
                          DEVIO_PLUGIN_SYMBOL);
    }
    if (ops->abi != DEVIO_BACKEND_ABI) {
        uint32_t abi = ops->abi;
        dlclose(h);
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "backend plugin %s has interface version %u, this devio needs %u", path,
                          abi, DEVIO_BACKEND_ABI);
    }
    if (!ops->name || strcmp(ops->name, name) != 0)
        s = devio_fail(err, DEVIO_E_UNSUPPORTED, "backend plugin %s calls itself '%s'", path,
                       ops->name ? ops->name : "");
    else
        s = devio_backend_check(ops, err);
    if (s != DEVIO_OK) {
        dlclose(h);
        return s;
    }
    r->handles[r->n_handles++] = h;
    *out = ops;
    return DEVIO_OK;
#else
    (void)out;
    char built[96];
    builtin_names(r, built, sizeof built);
    return devio_fail(err, DEVIO_E_UNSUPPORTED,
                      "no backend '%s'; the backends here: %s (built in; this platform loads "
                      "no plugins)", name, built[0] ? built : "none");
#endif
}

static const devio_backend_ops *builtin(const devio_registry *r, const char *name)
{
    for (uint32_t i = 0; i < r->n_builtin; i++)
        if (r->builtin[i] && r->builtin[i]->name && strcmp(r->builtin[i]->name, name) == 0)
            return r->builtin[i];
    return NULL;
}

devio_status devio_registry_find(devio_registry *r, const char *name,
                                 const devio_backend_ops **out, devio_error *err)
{
    *out = NULL;
    if (!name || !name[0])
        return devio_fail(err, DEVIO_E_INVALID, "no backend name given");
    if (strcmp(name, "auto") != 0) {
        const devio_backend_ops *b = builtin(r, name);
        if (b) {
            *out = b;
            return devio_backend_check(b, err);
        }
        return load_plugin(r, name, out, err);
    }
    for (size_t i = 0; i < sizeof auto_plugins / sizeof *auto_plugins; i++) {
        devio_error why = {0};
        const devio_backend_ops *b = builtin(r, auto_plugins[i]);
        devio_status s = b ? DEVIO_OK : load_plugin(r, auto_plugins[i], &b, &why);
        if (s == DEVIO_OK)
            s = devio_backend_probe(b, &why);
        if (s == DEVIO_OK) {
            *out = b;
            return DEVIO_OK;
        }
        note(r, auto_plugins[i], &why);
    }
    const devio_backend_ops *fast = builtin(r, auto_fast_builtin);
    if (r->numerics == DEVIO_NUMERICS_FAST && fast) {
        *out = fast;
        return devio_backend_check(*out, err);
    }
    if (r->n_builtin == 0 || !r->builtin[0])
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "no backend available (%s)", r->note);
    *out = r->builtin[0];
    return devio_backend_check(*out, err);
}

void devio_registry_close(devio_registry *r)
{
#ifdef HAVE_DLOPEN
    while (r->n_handles > 0)
        dlclose(r->handles[--r->n_handles]);
#endif
    r->n_handles = 0;
}
