/* model_fixture.h - what the model tests (model_test.c, model_bad_test.c) share: one fresh directory per test, a tiny model written into it, and edits of its files.
 * Test-only: every helper asserts through cmocka, so a step that goes wrong fails the test that called it. */
#ifndef DEVIO_MODEL_FIXTURE_H
#define DEVIO_MODEL_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"
#include "device/model.h"
#include "tools/mkmodel/mkmodel.h"

typedef struct fixture {
    char dir[64];
} fixture;

/* cmocka setup and teardown: a fresh directory under /tmp per test, removed
 * afterwards with what the test left in it (one level of subdirectories). */
int fx_setup(void **state);
int fx_teardown(void **state);

/* "DIR/NAME" in one of four per-thread buffers: valid for the next three calls. */
char *path_in(const char *dir, const char *name);

/* The tiny preset, seed 7, written to `dir`. */
devio_mkmodel_opts tiny_opts(const char *dir);
/* devio_mkmodel_write, asserted to succeed. */
void write_model(const devio_mkmodel_opts *o);

/* The whole file (caller frees) / a whole new file; both asserted. */
uint8_t *read_all(const char *path, size_t *size);
void write_all(const char *path, const void *data, size_t size);
/* Replaces the first `old` in a text file with `new`; the text must be there. */
void file_sub(const char *path, const char *old, const char *new);

/* The little-endian header length at the start of a safetensors file. */
uint64_t header_len(const uint8_t *b);
/* Rewrites a safetensors file with `header` (raw text) and the old data. */
void header_set_raw(const char *path, const char *header, size_t hlen);
/* The header as JSON; caller json_decref()s it. */
json_t *header_load(const char *path);
/* Stores `h` (consumed) as the header of `path`, keeping the data. */
void header_store(const char *path, json_t *h);

/* Loading must fail with `want`, leave *out NULL and name both strings (either may be NULL). */
void expect_fail(const char *dir, devio_status want, const char *s1, const char *s2);
/* Loading must succeed; caller frees with devio_model_free(). */
devio_model *load_ok(const char *dir);

#endif
