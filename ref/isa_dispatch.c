/* isa_dispatch.c - the paths of a backend built once per instruction set: which ones this CPU
 * runs, the one a device takes, and a table forwarding every slot to it (isa_dispatch.h). */
#include "ref/isa_dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/status.h"

/* Whether this CPU runs every instruction -march=<level> of a path may
 * emit (GCC's x86-64-v3 and v4 levels; these also check that the OS saves
 * the wide registers). clang 14 knows no level names: its list has no F16C,
 * LZCNT or MOVBE, which every CPU with AVX2, FMA and BMI2 has. */
static bool cpu_runs(const devio_isa_path *p)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
#if defined(__clang__) || !defined(__GNUC__) || __GNUC__ < 12
    bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
              __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("sse4.2");
    bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vl");
#else
    bool v3 = __builtin_cpu_supports("x86-64-v3");
    bool v4 = __builtin_cpu_supports("x86-64-v4");
#endif
    return p->level >= 4 ? v4 : p->level >= 3 ? v3 : true;
#else
    (void)p;
    return true;
#endif
}

static const devio_isa_path *find(const devio_isa_family *f, const char *name)
{
    for (size_t i = 0; i < f->n_paths; i++)
        if (strcmp(f->paths[i].name, name) == 0)
            return &f->paths[i];
    return NULL;
}

bool devio_isa_runs(const devio_isa_family *f, const char *name, char *why, size_t n)
{
    char dummy[1];
    if (!why) {
        why = dummy;
        n = sizeof dummy;
    }
    const devio_isa_path *p = find(f, name);
    if (!p) {
        const devio_isa_path *ps = f->paths;
        size_t k = f->n_paths;
        snprintf(why, n, "no path '%s' in this binary (it has %s%s%s%s%s)", name, ps[0].name,
                 k > 1 ? ", " : "", k > 1 ? ps[1].name : "", k > 2 ? ", " : "",
                 k > 2 ? ps[2].name : "");
        return false;
    }
    if (!cpu_runs(p)) {
        snprintf(why, n, "path '%s' needs %s, which this CPU lacks", name, p->needs);
        return false;
    }
    return true;
}

devio_status devio_isa_pick(const devio_isa_family *f, const devio_isa_path **out,
                            devio_error *err)
{
    const char *want = getenv(f->env);
    if (want && want[0]) {
        char why[160];
        if (!devio_isa_runs(f, want, why, sizeof why))
            return devio_fail(err, DEVIO_E_UNSUPPORTED, "%s=%s: %s", f->env, want, why);
        *out = find(f, want);
        return DEVIO_OK;
    }
    for (size_t i = 0; i < f->n_paths; i++)
        if (cpu_runs(&f->paths[i])) {
            *out = &f->paths[i];
            return DEVIO_OK;
        }
    return devio_fail(err, DEVIO_E_UNSUPPORTED, "this CPU runs no path of the %s backend",
                      f->what);
}

void devio_isa_describe(const devio_isa_family *f, char *buf, size_t n)
{
    if (n == 0)
        return;
    size_t len = 0;
    int w = snprintf(buf, n, "%s paths:", f->what);
    for (size_t i = 0; i <= f->n_paths && w >= 0 && (len += (size_t)w) < n; i++) {
        if (i < f->n_paths) {
            w = snprintf(buf + len, n - len, "%s %s%s", i ? "," : "", f->paths[i].name,
                         cpu_runs(&f->paths[i]) ? "" : " (not on this CPU)");
            continue;
        }
        const devio_isa_path *p;
        devio_error err = {0};
        if (devio_isa_pick(f, &p, &err) == DEVIO_OK)
            snprintf(buf + len, n - len, "; running %s (%s picks one)", p->name, f->env);
        else
            snprintf(buf + len, n - len, "; %s", err.message);
    }
}

/* A device's state: its path's table and that path's own state. */
typedef struct isa_state {
    const devio_isa_path *path;
    void *inner;
} isa_state;

/* The forwarding table's slots mirror the path tables' slots exactly (an
 * optional slot present or absent changes what the core does): create
 * refuses when they differ, so a slot added to a path's table must be
 * forwarded too. */
static bool same_slots(const devio_backend_ops *a, const devio_backend_ops *b)
{
#define SAME(slot) (!a->slot == !b->slot)
    return a->abi == b->abi && SAME(probe) && SAME(create) && SAME(destroy) && SAME(info) &&
           SAME(submit) && SAME(wait) && SAME(adapter_add) && SAME(adapter_remove) &&
           SAME(logits_read) && SAME(sample) && SAME(kv_blocks_fit) && SAME(ssm_copy) &&
           SAME(state_read) && SAME(state_write);
#undef SAME
}

devio_status devio_isa_create(const devio_isa_family *f, const devio_backend_ops *self,
                              const devio_model *model, const devio_backend_config *cfg,
                              void **state, devio_error *err)
{
    *state = NULL;
    const devio_isa_path *p;
    devio_status s = devio_isa_pick(f, &p, err);
    if (s != DEVIO_OK)
        return s;
    if (!same_slots(p->ops, self))
        return devio_fail(err, DEVIO_E_DEVICE,
                          "the %s backend's table forwards other slots than its paths have",
                          f->what);
    isa_state *st = calloc(1, sizeof *st);
    if (!st)
        return devio_fail(err, DEVIO_E_NOMEM, "%s backend: out of memory", f->what);
    st->path = p;
    s = p->ops->create(model, cfg, &st->inner, err);
    if (s != DEVIO_OK) {
        free(st);
        return s;
    }
    *state = st;
    return DEVIO_OK;
}

void devio_isa_destroy(void *sp)
{
    isa_state *st = sp;
    if (!st)
        return;
    st->path->ops->destroy(st->inner);
    free(st);
}

void devio_isa_info(void *sp, devio_device_info *out)
{
    isa_state *st = sp;
    st->path->ops->info(st->inner, out);
    snprintf(out->path, sizeof out->path, "%s", st->path->name);
    size_t len = strlen(out->device), room = sizeof out->device - len;
    if (len > 0 && out->device[len - 1] == ')')
        snprintf(out->device + len - 1, room + 1, ", %s)", st->path->name);
    else
        snprintf(out->device + len, room, " (%s)", st->path->name);
}

devio_status devio_isa_submit(void *sp, const devio_batch *b, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->submit(st->inner, b, err);
}

devio_status devio_isa_wait(void *sp, const devio_batch *b, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->wait(st->inner, b, err);
}

devio_status devio_isa_adapter_add(void *sp, uint32_t index, uint32_t generation,
                                   const struct devio_adapter *a, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->adapter_add(st->inner, index, generation, a, err);
}

void devio_isa_adapter_remove(void *sp, uint32_t index, uint32_t generation)
{
    isa_state *st = sp;
    st->path->ops->adapter_remove(st->inner, index, generation);
}

devio_status devio_isa_ssm_copy(void *sp, devio_ssm_ref dst, devio_ssm_ref src,
                                devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->ssm_copy(st->inner, dst, src, err);
}

devio_status devio_isa_state_read(void *sp, devio_state_ref what, void *dst, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->state_read(st->inner, what, dst, err);
}

devio_status devio_isa_state_write(void *sp, devio_state_ref what, const void *src,
                                   devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->state_write(st->inner, what, src, err);
}
