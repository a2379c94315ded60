/* gguf_fixture.h - writing GGUF files in the tests: a byte buffer with the format's
 * little-endian fields (gguf_test.c builds broken files with it), and a whole model written
 * as llama.cpp lays one out (model_gguf_test.c). Test-only: every helper asserts. */
#ifndef DEVIO_GGUF_FIXTURE_H
#define DEVIO_GGUF_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/model/gguf.h"
#include "device/model/model.h"

typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
} gbuf;

void gb_put(gbuf *b, const void *src, size_t n);
/* v little-endian in `bytes` bytes (zeros past the eighth). */
void gb_u(gbuf *b, uint64_t v, int bytes);
void gb_str(gbuf *b, const char *s);
void gb_kv_u32(gbuf *b, const char *key, uint32_t v);
void gb_kv_f32(gbuf *b, const char *key, float v);
void gb_kv_str(gbuf *b, const char *key, const char *v);
void gb_pad(gbuf *b, size_t align);

typedef struct gtinfo {
    const char *name;
    uint32_t ndim;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
} gtinfo;

void gb_tensor(gbuf *b, const gtinfo *t);

/* How gguf_write_model departs from a faithful file, to test refusals. */
typedef struct gguf_edits {
    const char *arch;        /* general.architecture; NULL: "llama" (or qwen2/qwen3 by the model) */
    const char *drop_key;    /* metadata key left out (without the "ARCH." prefix) */
    const char *retype;      /* tensor written with type `type` (its bytes sized for it) */
    uint32_t type;
    const char *reshape;     /* tensor written with its two dimensions swapped */
    const char *extra_key;   /* a string entry added (without the prefix), with extra_val */
    const char *extra_val;
    const char *extra_tensor; /* an F32 vector of head_dim / 2 added under this name */
    uint32_t heads;          /* attention.head_count written as this when not 0 */
    /* A float entry (without the prefix) written as f32_val, in place of
     * the model's value when it has one. */
    const char *f32_key;
    float f32_val;
    /* An unsigned entry written as u32_val, in place of the model's value
     * when it has one: without the prefix, or a "tokenizer." key as is. */
    const char *u32_key;
    uint32_t u32_val;
    uint32_t n_tokens;       /* tokenizer.ggml.tokens of this many entries when not 0 */
} gguf_edits;

/* The model m written to path as a GGUF file: llama.cpp's names, its
 * metadata keys, ne = {row length, rows}, q and k rows interleaved per
 * head for the llama architecture, matrices of m's dtype and vectors
 * (norms, biases) as F32, as llama.cpp's converter writes them (a 16-bit
 * vector widened exactly), alignment 32. */
void gguf_write_model(const devio_model *m, const gguf_edits *e, const char *path);

#endif
