/* ref_isa.c - devio_ref_backend: the reference backend's table, forwarding every slot to the
 * instruction-set path picked when a device is created. It never computes; every path gives the same bits. */
#include "ref/ref_isa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/status.h"
#include "ref/ref_backend.h"

/* Each path's own table: ref_backend.c built with
 * -Ddevio_ref_backend=devio_ref_backend_PATH (ref/isa.bzl). */
#if defined(__x86_64__)
extern const devio_backend_ops devio_ref_backend_avx512, devio_ref_backend_avx2,
    devio_ref_backend_baseline;
#else
extern const devio_backend_ops devio_ref_backend_native;
#endif

typedef struct isa_path {
    const char *name;
    const devio_backend_ops *ops;
    const char *needs; /* what the CPU must have, for messages */
} isa_path;

/* Widest first: with no DEVIO_REF_ISA the first this CPU runs is taken. */
static const isa_path paths[] = {
#if defined(__x86_64__)
    {"avx512", &devio_ref_backend_avx512, "x86-64-v4 (AVX-512 F, BW, CD, DQ, VL)"},
    {"avx2", &devio_ref_backend_avx2, "x86-64-v3 (AVX2, FMA, F16C, BMI2)"},
    {"baseline", &devio_ref_backend_baseline, "x86-64 (SSE2)"},
#else
    {"native", &devio_ref_backend_native, "the CPU this binary was built for"},
#endif
};
#define N_PATHS (sizeof paths / sizeof *paths)

/* Whether this CPU runs every instruction -march=<level> of the path may
 * emit (GCC's x86-64-v3 and v4 levels; these also check that the OS saves
 * the wide registers). clang 14 knows no level names: its list has no F16C,
 * LZCNT or MOVBE, which every CPU with AVX2, FMA and BMI2 has. */
static bool cpu_runs(const isa_path *p)
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
    if (p->ops == &devio_ref_backend_avx512)
        return v4;
    if (p->ops == &devio_ref_backend_avx2)
        return v3;
#else
    (void)p;
#endif
    return true;
}

static const isa_path *find(const char *name)
{
    for (size_t i = 0; i < N_PATHS; i++)
        if (strcmp(paths[i].name, name) == 0)
            return &paths[i];
    return NULL;
}

const char *devio_ref_isa_path(size_t i)
{
    return i < N_PATHS ? paths[i].name : NULL;
}

bool devio_ref_isa_runs(const char *name, char *why, size_t n)
{
    const isa_path *p = find(name);
    if (!p) {
        snprintf(why, n, "no path '%s' in this binary (it has %s%s%s%s%s)", name, paths[0].name,
                 N_PATHS > 1 ? ", " : "", N_PATHS > 1 ? paths[1].name : "",
                 N_PATHS > 2 ? ", " : "", N_PATHS > 2 ? paths[2].name : "");
        return false;
    }
    if (!cpu_runs(p)) {
        snprintf(why, n, "path '%s' needs %s, which this CPU lacks", name, p->needs);
        return false;
    }
    return true;
}

static devio_status pick(const isa_path **out, devio_error *err)
{
    const char *want = getenv(DEVIO_REF_ISA_ENV);
    if (want && want[0]) {
        char why[160];
        if (!devio_ref_isa_runs(want, why, sizeof why))
            return devio_fail(err, DEVIO_E_UNSUPPORTED, "%s=%s: %s", DEVIO_REF_ISA_ENV, want, why);
        *out = find(want);
        return DEVIO_OK;
    }
    for (size_t i = 0; i < N_PATHS; i++)
        if (cpu_runs(&paths[i])) {
            *out = &paths[i];
            return DEVIO_OK;
        }
    return devio_fail(err, DEVIO_E_UNSUPPORTED, "this CPU runs no path of the reference backend");
}

devio_status devio_ref_isa_pick(const char **name, const devio_backend_ops **ops,
                                devio_error *err)
{
    const isa_path *p;
    devio_status s = pick(&p, err);
    if (s != DEVIO_OK)
        return s;
    *name = p->name;
    *ops = p->ops;
    return DEVIO_OK;
}

void devio_ref_isa_describe(char *buf, size_t n)
{
    if (n == 0)
        return;
    size_t len = 0;
    int w = snprintf(buf, n, "reference paths:");
    for (size_t i = 0; i <= N_PATHS && w >= 0 && (len += (size_t)w) < n; i++) {
        if (i < N_PATHS) {
            w = snprintf(buf + len, n - len, "%s %s%s", i ? "," : "", paths[i].name,
                         cpu_runs(&paths[i]) ? "" : " (not on this CPU)");
            continue;
        }
        const isa_path *p;
        devio_error err = {0};
        if (pick(&p, &err) == DEVIO_OK)
            snprintf(buf + len, n - len, "; running %s (%s picks one)", p->name,
                     DEVIO_REF_ISA_ENV);
        else
            snprintf(buf + len, n - len, "; %s", err.message);
    }
}

/* ---- the forwarding table --------------------------------------------- */

/* A device's state: its path's table and that path's own state. */
typedef struct isa_state {
    const isa_path *path;
    void *inner;
} isa_state;

/* The slots below mirror the path tables' slots exactly (an optional slot
 * present or absent changes what the core does): create refuses when they
 * differ, so a slot added to ref_backend.c must be forwarded here too. */
static bool same_slots(const devio_backend_ops *a, const devio_backend_ops *b)
{
#define SAME(slot) (!a->slot == !b->slot)
    return a->abi == b->abi && SAME(probe) && SAME(create) && SAME(destroy) && SAME(info) &&
           SAME(submit) && SAME(wait) && SAME(adapter_add) && SAME(adapter_remove) &&
           SAME(logits_read) && SAME(sample) && SAME(kv_blocks_fit) && SAME(ssm_copy);
#undef SAME
}

static devio_status isa_create(const devio_model *model, const devio_backend_config *cfg,
                               void **state, devio_error *err)
{
    *state = NULL;
    const isa_path *p;
    devio_status s = pick(&p, err);
    if (s != DEVIO_OK)
        return s;
    if (!same_slots(p->ops, &devio_ref_backend))
        return devio_fail(err, DEVIO_E_DEVICE,
                          "ref/ref_isa.c forwards other slots than the reference backend has");
    isa_state *st = calloc(1, sizeof *st);
    if (!st)
        return devio_fail(err, DEVIO_E_NOMEM, "reference backend: out of memory");
    st->path = p;
    s = p->ops->create(model, cfg, &st->inner, err);
    if (s != DEVIO_OK) {
        free(st);
        return s;
    }
    *state = st;
    return DEVIO_OK;
}

static void isa_destroy(void *sp)
{
    isa_state *st = sp;
    if (!st)
        return;
    st->path->ops->destroy(st->inner);
    free(st);
}

/* The path's description with the path named: "... (reference, avx2)". */
static void isa_info(void *sp, devio_device_info *out)
{
    isa_state *st = sp;
    st->path->ops->info(st->inner, out);
    size_t len = strlen(out->device), room = sizeof out->device - len;
    if (len > 0 && out->device[len - 1] == ')')
        snprintf(out->device + len - 1, room + 1, ", %s)", st->path->name);
    else
        snprintf(out->device + len, room, " (%s)", st->path->name);
}

static devio_status isa_submit(void *sp, const devio_batch *b, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->submit(st->inner, b, err);
}

static devio_status isa_wait(void *sp, const devio_batch *b, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->wait(st->inner, b, err);
}

static devio_status isa_adapter_add(void *sp, uint32_t slot, uint32_t generation,
                                    const struct devio_adapter *a, devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->adapter_add(st->inner, slot, generation, a, err);
}

static void isa_adapter_remove(void *sp, uint32_t slot, uint32_t generation)
{
    isa_state *st = sp;
    st->path->ops->adapter_remove(st->inner, slot, generation);
}

static devio_status isa_ssm_copy(void *sp, devio_ssm_ref dst, devio_ssm_ref src,
                                 devio_error *err)
{
    isa_state *st = sp;
    return st->path->ops->ssm_copy(st->inner, dst, src, err);
}

const devio_backend_ops devio_ref_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = "ref",
    .create = isa_create,
    .destroy = isa_destroy,
    .info = isa_info,
    .submit = isa_submit,
    .wait = isa_wait,
    .adapter_add = isa_adapter_add,
    .adapter_remove = isa_adapter_remove,
    .ssm_copy = isa_ssm_copy,
};
