/* ref_isa.c - devio_ref_backend: the reference backend's table, forwarding every slot to the
 * instruction-set path picked when a device is created (isa_dispatch.h). It never computes;
 * every path gives the same bits. */
#include "ref/ref_isa.h"

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

/* Widest first: with no DEVIO_REF_ISA the first this CPU runs is taken. */
static const devio_isa_path ref_paths[] = {
#if defined(__x86_64__)
    {"avx512", &devio_ref_backend_avx512, 4, "x86-64-v4 (AVX-512 F, BW, CD, DQ, VL)"},
    {"avx2", &devio_ref_backend_avx2, 3, "x86-64-v3 (AVX2, FMA, F16C, BMI2)"},
    {"baseline", &devio_ref_backend_baseline, 0, "x86-64 (SSE2)"},
#else
    {"native", &devio_ref_backend_native, 0, "the CPU this binary was built for"},
#endif
};

static const devio_isa_family ref_family = {
    .what = "reference",
    .env = DEVIO_REF_ISA_ENV,
    .paths = ref_paths,
    .n_paths = sizeof ref_paths / sizeof *ref_paths,
};

const char *devio_ref_isa_path(size_t i)
{
    return i < ref_family.n_paths ? ref_paths[i].name : NULL;
}

bool devio_ref_isa_runs(const char *name, char *why, size_t n)
{
    return devio_isa_runs(&ref_family, name, why, n);
}

devio_status devio_ref_isa_pick(const char **name, const devio_backend_ops **ops,
                                devio_error *err)
{
    const devio_isa_path *p;
    devio_status s = devio_isa_pick(&ref_family, &p, err);
    if (s != DEVIO_OK)
        return s;
    *name = p->name;
    *ops = p->ops;
    return DEVIO_OK;
}

void devio_ref_isa_describe(char *buf, size_t n)
{
    devio_isa_describe(&ref_family, buf, n);
}

static devio_status ref_isa_create(const devio_model *model, const devio_backend_config *cfg,
                                   void **state, devio_error *err)
{
    return devio_isa_create(&ref_family, &devio_ref_backend, model, cfg, state, err);
}

const devio_backend_ops devio_ref_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = "ref",
    .create = ref_isa_create,
    .destroy = devio_isa_destroy,
    .info = devio_isa_info,
    .submit = devio_isa_submit,
    .wait = devio_isa_wait,
    .adapter_add = devio_isa_adapter_add,
    .adapter_remove = devio_isa_adapter_remove,
    .ssm_copy = devio_isa_ssm_copy,
    .state_read = devio_isa_state_read,
    .state_write = devio_isa_state_write,
};
