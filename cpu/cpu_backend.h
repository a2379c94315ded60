/* cpu_backend.h - the cpu backend: the reference's step on the CPU with fast numerics, its
 * projections of quantized weights by integer dot products on 15-bit activations (cpu_gemm.c)
 * and its own attention (cpu_attention.c), one copy per instruction-set path picked at run
 * time (DEVIO_CPU_ISA). Static data only. */
#ifndef DEVIO_CPU_BACKEND_H
#define DEVIO_CPU_BACKEND_H

#include <stddef.h>

#include "device/backend/backend.h"

/* The environment variable that names the path to run instead of the
 * widest this CPU runs: "baseline" or "avx2" on x86-64. */
#define DEVIO_CPU_ISA_ENV "DEVIO_CPU_ISA"

extern const devio_backend_ops devio_cpu_backend;

/* One line for --help, as devio_ref_isa_describe: "cpu paths: avx2, baseline;
 * running avx2 (DEVIO_CPU_ISA picks one)". Truncated to n. */
void devio_cpu_isa_describe(char *buf, size_t n);

#endif
