/* adapter_fixture.h - what the adapter tests (adapter_test.c, adapter_bad_test.c) share: a base model, an adapters root, written adapters and edits of their files.
 * Test-only: every helper asserts through cmocka, so a step that goes wrong fails the test that called it. */
#ifndef DEVIO_ADAPTER_FIXTURE_H
#define DEVIO_ADAPTER_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "device/adapter/adapter.h"
#include "device/devio.h"
#include "device/model/model.h"
#include "device/model/safetensors.h"
#include "tools/mkmodel/mkmodel.h"
#include "tests/testutil.h" /* read_all, write_all */

#define QV ((1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_V))

/* A temp dir holding a base model, an adapters root and a directory outside
 * the root. */
typedef struct fixture {
    char dir[384];     /* Bazel's TEST_TMPDIR alone can pass 150 bytes */
    char base[448];    /* tiny model, seed 7 */
    char root[448];    /* the adapters root */
    char outside[448]; /* a sibling of the root */
    devio_model *model;
    char kept[64][512]; /* out_dir strings that must outlive path_in's ring */
    int n_kept;
} fixture;

/* cmocka setup and teardown: the directory, the tiny base model (seed 7,
 * loaded into fx->model) and the two empty directories; all removed after. */
int fx_setup(void **state);
int fx_teardown(void **state);

/* "DIR/NAME" in one of four per-thread buffers: valid for the next three calls. */
const char *path_in(const char *dir, const char *name);

/* Rank 8, alpha 16, q and v, seed 3, for the fixture's base, written to
 * out_dir (a copy kept in fx, so a path_in result may be passed). */
devio_mkmodel_adapter_opts ad_opts(fixture *fx, const char *out_dir);
/* devio_mkmodel_write_adapter, asserted to succeed. */
void write_adapter(const devio_mkmodel_adapter_opts *o);
/* Writes the default q/v adapter at root/rel and returns its options. */
devio_mkmodel_adapter_opts write_default(fixture *fx, const char *rel);

/* Loads root/rel with `max_rank` and expects status `want`; returns the
 * adapter (the caller frees it), NULL on failure, which is also asserted. */
devio_adapter *load_expect(const fixture *fx, const char *rel, uint32_t max_rank,
                           devio_status want, devio_error *err);
void assert_msg_has(const devio_error *err, const char *needle);


/* Sets `key` of DIR/adapter_config.json to `val` (stolen; NULL deletes it). */
void config_set(const char *dir, const char *key, json_t *val);

/* One tensor of a hand-written safetensors file. */
typedef struct st_entry {
    char name[160];
    char dtype[16];
    uint32_t ndim; /* 1 or 2 */
    uint64_t shape[2];
    const void *data;
    uint64_t nbytes;
    uint64_t gap; /* zero bytes placed before the data: a hole the format forbids */
} st_entry;

/* Writes a safetensors file: header sorted by jansson, padded to 8 bytes,
 * data in entry order. */
void st_write(const char *path, const st_entry *e, size_t n);
/* The same with `shift` more spaces after the header, so the data section
 * (and every tensor in it) starts `shift` bytes later: a legal way to
 * misalign the data. */
void st_write_shifted(const char *path, const st_entry *e, size_t n, size_t shift);
/* Copies every tensor of an adapter file into entries (data borrowed from
 * the open file *f, which the caller closes after writing). */
size_t st_entries(const char *path, devio_st_file **f, st_entry *e, size_t cap);

/* PEFT's name of a LoRA tensor, in one of four per-thread buffers. */
const char *tname(uint32_t layer, devio_lora_target t, char ab);

#endif
