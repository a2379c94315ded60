/* testutil.h - shared fixtures for the device tests: a written, loaded tiny model.
 * Test-only code; it never reaches a production binary. */
#ifndef DEVIO_TESTUTIL_H
#define DEVIO_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/backend/backend.h"
#include "device/devio.h"
#include "device/model/model.h"
#include "tools/mkmodel/mkmodel.h"

typedef struct devio_fixture {
    char dir[256];
    devio_model *model;
} devio_fixture;

/* Write a model with `o` (out_dir is set here) into a fresh temp dir and load it. */
int devio_fixture_make(devio_fixture *f, devio_mkmodel_opts o);
/* Preset by name ("tiny", "small") with the given dtype and seed. */
int devio_fixture_preset(devio_fixture *f, const char *preset, devio_dtype dtype, uint64_t seed);
/* Preset by name for architecture `arch` ("llama", "bamba", "mamba2"), with the given seed. */
int devio_fixture_arch(devio_fixture *f, const char *preset, const char *arch, uint64_t seed);
void devio_fixture_free(devio_fixture *f);

/* A new sequence on d (asserted to succeed); its id. */
uint64_t devio_test_seq(devio_device *d);

/* n deterministic token ids below vocab, varied by salt. */
void devio_test_tokens(int32_t *t, uint32_t n, uint32_t salt, uint32_t vocab);

/* One step of one row of n tokens (snapshot mode snap) asking for its last
 * logits. The launch must answer `want` (asserted); when it is DEVIO_OK the
 * step is awaited and the logits (the model's vocab floats, caller frees)
 * are read and their handle released; otherwise NULL. */
float *devio_test_step(devio_device *d, uint64_t seq, const int32_t *tok, uint32_t n,
                       devio_snapshot snap, devio_status want);

/* Sequence seq of d exported whole into memory (with its snapshots when
 * `snapshots`), read in pieces of `piece` bytes; asserted to succeed. Caller
 * frees; its size in *n. */
uint8_t *devio_test_export(devio_device *d, uint64_t seq, bool snapshots, size_t piece,
                           size_t *n);
/* n bytes imported into d in pieces of `piece` bytes with limit max_bytes:
 * the status of the first call that fails (open, write or finish), the new
 * sequence in *seq when none does. */
devio_status devio_test_import(devio_device *d, const uint8_t *b, size_t n, size_t piece,
                               uint64_t max_bytes, uint64_t *seq, devio_error *err);
/* `steps` one-token decode steps on sa of a and sb of b (tokens varied by salt): every
 * step's logits the same bits on both (asserted). */
void devio_test_steps_alike(devio_device *a, uint64_t sa, devio_device *b, uint64_t sb,
                            uint32_t steps, uint32_t salt);
/* Export seq from `from` and import it into `to` (asserted); the new id. */
uint64_t devio_test_move(devio_device *from, uint64_t seq, bool snapshots, devio_device *to);

/* The whole file, NUL-terminated (not counted in *size); NULL on failure.
 * Caller frees. */
uint8_t *devio_read_file(const char *path, size_t *size);
/* Write (replace) a file; 0 on success, -1 on failure. */
int devio_write_file(const char *path, const void *data, size_t size);
/* devio_read_file and devio_write_file that must succeed (cmocka asserts). */
uint8_t *read_all(const char *path, size_t *size);
void write_all(const char *path, const void *data, size_t size);
/* Append n zero bytes to a file; 0 on success, -1 on failure. */
int devio_append_zeros(const char *path, size_t n);

/* Remove a directory tree (test temp dirs only). */
void devio_rmtree(const char *dir);

/* cmocka's group run of tests[0..n), or, when Bazel shards the target
 * (shard_count: TEST_TOTAL_SHARDS, TEST_SHARD_INDEX), of every
 * TEST_TOTAL_SHARDS-th case from TEST_SHARD_INDEX; setup and teardown run
 * around each shard's cases. What cmocka_run_group_tests returns. */
struct CMUnitTest;
int devio_run_tests(const char *name, const struct CMUnitTest *tests, size_t n,
                    int (*setup)(void **), int (*teardown)(void **));

#endif
