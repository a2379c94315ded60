/* fuzz_common.h - what devio's libFuzzer targets share: one scratch directory per process holding a micro model and an adapter, written at start by devio-mkmodel's library, and a small reference device on it.
 * Fuzzing only: the helpers abort on a setup failure (that is a broken harness, not a finding) and never touch files outside their directory. */
#ifndef DEVIO_FUZZ_COMMON_H
#define DEVIO_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"
#include "device/model/model.h"

/* The process's scratch directory (created on first call, removed at exit):
 *   model/            the micro model: llama, vocab 32, hidden 16, 1 layer, F32
 *   adapters/a/       a rank-2 q_proj,v_proj adapter of it
 * Borrowed; valid for the process's life. */
const char *fuzz_dir(void);
/* "fuzz_dir()/rel" in one of four rotating static buffers. */
const char *fuzz_path(const char *rel);

/* The micro model, loaded once. Borrowed. */
const devio_model *fuzz_model(void);

/* A fresh reference device on the micro model: 1 thread, steps run inside
 * await and apply (no worker thread), small pools, adapters root
 * fuzz_path("adapters"). Caller ends it with devio_teardown(). */
devio_device *fuzz_device_open(void);

/* Writes data to path (replacing it); aborts on failure. */
void fuzz_write(const char *path, const void *data, size_t n);
/* mkdir -p of one level under fuzz_dir(); aborts on failure other than EEXIST. */
void fuzz_mkdir(const char *rel);

#endif
