/* script.h - the conformance script runner of docs/conformance.md, over any target.
 * The same runner drives the in-process device and a server over HTTP, so their lines compare byte for byte. */
#ifndef DEVIO_SCRIPT_H
#define DEVIO_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "device/devio.h"

/* Where a script's operations go. Both slots follow devio_inproc_call's
 * contract: on success a new reference in *result / a malloc'd array in
 * *data (caller frees); on failure err is filled and nothing is returned. */
typedef struct devio_script_target {
    void *ctx;
    devio_status (*call)(void *ctx, const char *op, const json_t *body, json_t **result,
                         devio_error *err);
    /* Every position of a logits handle: n_rows * vocab floats. */
    devio_status (*logits)(void *ctx, uint64_t id, float **data, uint32_t *n_rows,
                           uint32_t *vocab, devio_error *err);
    /* Sequence seq's whole exported state (docs/state.md), with its snapshots
     * when `snapshots`: *n bytes, malloc'd into *data (caller frees). */
    devio_status (*state_export)(void *ctx, uint64_t seq, bool snapshots, uint8_t **data,
                                 size_t *n, devio_error *err);
    /* n bytes of a state imported as a new sequence, its id in *seq. */
    devio_status (*state_import)(void *ctx, const uint8_t *data, size_t n, uint64_t *seq,
                                 devio_error *err);
} devio_script_target;

/* Run the JSON-lines script `in` (blank lines and lines starting with '#'
 * are skipped), printing one result line per operation to `out`.
 * Operations: create, seq, launch, await, step, apply, facts, lora, logits,
 * compare, export, import.
 * Returns 0 when every line was understood (operations may still fail:
 * that is output), -1 on a malformed script line, with the reason in
 * `why` (line number included). */
int devio_script_run(const devio_script_target *t, FILE *in, FILE *out, char *why,
                     size_t why_len);

/* sha256 hex of n little-endian binary32 values, NaN canonicalised to 0x7fc00000. */
void devio_logits_digest(const float *v, size_t n, char hex[65]);

#endif
