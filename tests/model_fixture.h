/* model_fixture.h - what the model tests (model_test.c, model_bad_test.c) share: one fresh directory per test, a tiny model written into it, and edits of its files.
 * Test-only: every helper asserts through cmocka, so a step that goes wrong fails the test that called it. */
#ifndef DEVIO_MODEL_FIXTURE_H
#define DEVIO_MODEL_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"
#include "device/model/model.h"
#include "tools/mkmodel/mkmodel.h"
#include "tests/testutil.h" /* read_all, write_all */

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
/* The preset of an architecture, seed 7, written to `dir`. */
devio_mkmodel_opts arch_opts(const char *arch, const char *preset, const char *dir);

/* A devio-mkmodel refusal: the tiny preset of arch, edited, must be refused
 * (DEVIO_E_INVALID) with message in its error text. */
typedef struct bad_case {
    const char *arch;
    void (*edit)(devio_mkmodel_opts *o);
    const char *message;
} bad_case;

/* Every case refused as it says, and nothing written into dir. */
void expect_refusals(const bad_case *cases, size_t n, const char *dir);
/* The tiny preset of architecture `arch` with `seed`, written to fx->dir;
 * returns the path of its config.json (path_in's buffer). */
const char *write_arch(const fixture *fx, uint64_t seed, const char *arch);
/* devio_mkmodel_write, asserted to succeed. */
void write_model(const devio_mkmodel_opts *o);

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
/* Removes tensor `name` and its bytes from `path`, moving the tensors after
 * it down, so the file stays packed as the format demands. */
void tensor_drop(const char *path, const char *name);

/* ---- reading back what devio-mkmodel wrote (asserting as they go) ---- */

/* A config key that must be there / an integer / a boolean / a string equal to want. */
json_t *cfg_get(json_t *c, const char *key);
int64_t cfg_int(json_t *c, const char *key);
bool cfg_bool(json_t *c, const char *key);
void cfg_str(json_t *c, const char *key, const char *want);

/* One tensor of a safetensors header: its name and shape. */
typedef struct shape_want {
    const char *name;
    uint32_t ndim;
    int64_t s[3];
} shape_want;

/* The header holds w->name with w's shape (and dtype dt unless NULL). */
void header_shape_is(json_t *h, const shape_want *w, const char *dt);
/* Sum of the element counts of every tensor in a header. */
uint64_t header_params(json_t *h);
/* The f32 elements of tensor `name` of a single-file model in dir; caller frees. */
float *tensor_f32(const char *dir, const char *name, size_t *n);
bool files_equal(const char *a, const char *b);
/* Writes o under dir/NAME-a, -b (the same options) and -c (seed 8): a and b
 * are the same bytes, c has other weights and the same config. */
void expect_deterministic(devio_mkmodel_opts o, const char *dir, const char *name);

/* Loading must fail with `want`, leave *out NULL and name both strings (either may be NULL). */
void expect_fail(const char *dir, devio_status want, const char *s1, const char *s2);
/* Loading must succeed; caller frees with devio_model_free(). */
devio_model *load_ok(const char *dir);

#endif
