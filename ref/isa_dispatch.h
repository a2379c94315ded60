/* isa_dispatch.h - a backend built once per instruction-set path (one copy of its sources per
 * -march, each copy's symbols renamed) and picked at run time: the reference (ref/ref_isa.c)
 * and the cpu backend (cpu/cpu_backend.c). It chooses which copy runs; it never computes. */
#ifndef DEVIO_ISA_DISPATCH_H
#define DEVIO_ISA_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "device/backend/backend.h"

/* One compiled copy of a backend: its name, its table, the x86-64 level its
 * -march asks for (0 baseline, 3 x86-64-v3, 4 x86-64-v4; 0 off x86-64), and
 * what the CPU must have, for messages. */
typedef struct devio_isa_path {
    const char *name;
    const devio_backend_ops *ops;
    int level;
    const char *needs;
} devio_isa_path;

/* A backend's paths, widest first, and the variable that picks one. */
typedef struct devio_isa_family {
    const char *what; /* "reference", for messages */
    const char *env;  /* DEVIO_REF_ISA, ... */
    const devio_isa_path *paths;
    size_t n_paths;
} devio_isa_family;

/* Whether this CPU runs path `name` of f; if not, why in why[n] (why may be NULL). */
bool devio_isa_runs(const devio_isa_family *f, const char *name, char *why, size_t n);
/* The path a device opened now runs: f->env when set, else the widest this
 * CPU runs. DEVIO_E_UNSUPPORTED, saying why, when f->env names a path the
 * binary lacks or this CPU cannot run. */
devio_status devio_isa_pick(const devio_isa_family *f, const devio_isa_path **out,
                            devio_error *err);
/* One line for --help: "WHAT paths: avx512 (not on this CPU), avx2, baseline;
 * running avx2 (ENV picks one)". Truncated to n. */
void devio_isa_describe(const devio_isa_family *f, char *buf, size_t n);

/* A table that forwards to the picked path: create picks (refusing when
 * the path's table has other slots than `self`) and every other slot goes
 * to the path's own. `self` is the forwarding table, for that check. */
devio_status devio_isa_create(const devio_isa_family *f, const devio_backend_ops *self,
                              const devio_model *model, const devio_backend_config *cfg,
                              void **state, devio_error *err);
void devio_isa_destroy(void *state);
/* The path's description with the path named: "... (reference, avx2)". */
void devio_isa_info(void *state, devio_device_info *out);
devio_status devio_isa_submit(void *state, const devio_batch *b, devio_error *err);
devio_status devio_isa_wait(void *state, const devio_batch *b, devio_error *err);
devio_status devio_isa_adapter_add(void *state, uint32_t index, uint32_t generation,
                                   const struct devio_adapter *a, devio_error *err);
void devio_isa_adapter_remove(void *state, uint32_t index, uint32_t generation);
devio_status devio_isa_ssm_copy(void *state, devio_ssm_ref dst, devio_ssm_ref src,
                                devio_error *err);
devio_status devio_isa_state_read(void *state, devio_state_ref what, void *dst, devio_error *err);
devio_status devio_isa_state_write(void *state, devio_state_ref what, const void *src,
                                   devio_error *err);

#endif
