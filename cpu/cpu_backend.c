/* cpu_backend.c - devio_cpu_backend: the table that forwards to the instruction-set path picked
 * at create (ref/isa_dispatch.h). Each path is the reference's step (ref/) with this backend's
 * projections (cpu_gemm.c) and attention (cpu_attention.c), so it takes fast numerics only:
 * strict numerics are the reference's. */
#include "cpu/cpu_backend.h"

#include <stdio.h>
#include <string.h>

#include "device/status.h"
#include "ref/isa_dispatch.h"

/* Each path's table: ref/ref_backend.c built with
 * -Ddevio_ref_backend=devio_ref_backend_cpu_PATH (cpu/isa.bzl). */
#if defined(__x86_64__)
extern const devio_backend_ops devio_ref_backend_cpu_avx2, devio_ref_backend_cpu_baseline;
#else
extern const devio_backend_ops devio_ref_backend_cpu_native;
#endif

/* Widest first: with no DEVIO_CPU_ISA the first this CPU runs is taken. */
static const devio_isa_path cpu_paths[] = {
#if defined(__x86_64__)
    {"avx2", &devio_ref_backend_cpu_avx2, 3, "x86-64-v3 (AVX2, FMA, F16C, BMI2)"},
    {"baseline", &devio_ref_backend_cpu_baseline, 0, "x86-64 (SSE2)"},
#else
    {"native", &devio_ref_backend_cpu_native, 0, "the CPU this binary was built for"},
#endif
};

static const devio_isa_family cpu_family = {
    .what = "cpu",
    .env = DEVIO_CPU_ISA_ENV,
    .paths = cpu_paths,
    .n_paths = sizeof cpu_paths / sizeof *cpu_paths,
};

void devio_cpu_isa_describe(char *buf, size_t n)
{
    devio_isa_describe(&cpu_family, buf, n);
}

/* A path's create is the reference's, which takes strict numerics only:
 * it is handed the configuration as strict, and computes what this
 * backend's projections compute. */
static devio_status cpu_create(const devio_model *model, const devio_backend_config *cfg,
                               void **state, devio_error *err)
{
    *state = NULL;
    if (cfg->numerics != DEVIO_NUMERICS_FAST)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "the cpu backend computes fast numerics only (--numerics fast); "
                          "strict numerics are the reference's (--backend ref)");
    devio_backend_config c = *cfg;
    c.numerics = DEVIO_NUMERICS_STRICT;
    return devio_isa_create(&cpu_family, &devio_cpu_backend, model, &c, state, err);
}

/* "x86-64 CPU, 2 threads (fast numerics, avx2)": the path's own words
 * name the reference, whose step it runs. */
static void cpu_info(void *state, devio_device_info *out)
{
    devio_isa_info(state, out);
    char *at = strstr(out->device, "(reference");
    if (at) {
        char tail[sizeof out->device];
        snprintf(tail, sizeof tail, "%s", at + strlen("(reference"));
        snprintf(at, sizeof out->device - (size_t)(at - out->device), "(fast numerics%s", tail);
    }
}

const devio_backend_ops devio_cpu_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = "cpu",
    .create = cpu_create,
    .destroy = devio_isa_destroy,
    .info = cpu_info,
    .submit = devio_isa_submit,
    .wait = devio_isa_wait,
    .adapter_add = devio_isa_adapter_add,
    .adapter_remove = devio_isa_adapter_remove,
    .ssm_copy = devio_isa_ssm_copy,
    .state_read = devio_isa_state_read,
    .state_write = devio_isa_state_write,
};
