/* cpu_strict.h - the reference's own projections (ref/ref_gemm.c) as the cpu backend links them,
 * under their own names: the cpu backend's projections (cpu_gemm.c) take the types it has fast
 * kernels for and hand every other weight to these. Declarations only; cpu/isa.bzl gives each
 * path's copy its name. */
#ifndef DEVIO_CPU_STRICT_H
#define DEVIO_CPU_STRICT_H

#include "ref/ref_gemm.h"

int ref_strict_panels_pack(ref_panels *p, devio_pool *pool, const void *w, devio_dtype dt,
                           uint32_t m, uint32_t n);
void ref_strict_panels_free(ref_panels *p);
size_t ref_strict_gemm_xpack_floats(uint32_t max_tokens, uint32_t max_n);
void ref_strict_matmul_run(const ref_gemm_work *wk, ref_matmul *mm, uint32_t count);

#endif
