/* ref_isa.h - the reference backend's instruction-set paths, picked at run time (isa_dispatch.h).
 * Chooses which compiled copy of the same sources runs; it never computes and never changes a number. */
#ifndef DEVIO_REF_ISA_H
#define DEVIO_REF_ISA_H

#include <stdbool.h>
#include <stddef.h>

#include "device/backend/backend.h"
#include "ref/isa_dispatch.h"

/* The environment variable that names the path to run instead of the
 * widest this CPU runs: "baseline", "avx2" or "avx512" on x86-64. */
#define DEVIO_REF_ISA_ENV "DEVIO_REF_ISA"

/* The reference backend's family (DEVIO_REF_ISA): */

/* The paths built into this binary, widest first; NULL after the last.
 * "baseline" (SSE2), "avx2" (x86-64-v3), "avx512" (x86-64-v4) on x86-64;
 * "native" on any other host. */
const char *devio_ref_isa_path(size_t i);

/* Whether this CPU runs path `name`; if not, why ("this CPU lacks
 * x86-64-v4 (AVX-512)", "no path 'x' in this binary") in why[n]. */
bool devio_ref_isa_runs(const char *name, char *why, size_t n);

/* The path a device opened now runs: DEVIO_REF_ISA when set, else the
 * widest this CPU runs. DEVIO_E_UNSUPPORTED, saying why, when
 * DEVIO_REF_ISA names a path this binary lacks or this CPU cannot run.
 * *name and *ops are static data. */
devio_status devio_ref_isa_pick(const char **name, const devio_backend_ops **ops,
                                devio_error *err);

/* One line for --help: the paths in this binary, those this CPU lacks, and
 * the one a device opened now runs (or why none), e.g. "reference paths:
 * avx512 (not on this CPU), avx2, baseline; running avx2 (DEVIO_REF_ISA
 * picks one)". Truncated to n. */
void devio_ref_isa_describe(char *buf, size_t n);

#endif
