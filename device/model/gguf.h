/* gguf.h - reads one GGUF file (versions 2 and 3) into memory it owns and
 * checks its header, metadata and tensor table. It never interprets tensor
 * values, never hands out a pointer outside the file's bytes, never keeps
 * the file mapped, and refuses a tensor whose type it cannot size (its
 * bytes could not be range-checked). What it checks: docs/objects.md, Model. */
#ifndef DEVIO_GGUF_H
#define DEVIO_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"

/* Metadata value types, as the format numbers them. */
typedef enum devio_gguf_vtype {
    DEVIO_GGUF_U8 = 0,
    DEVIO_GGUF_I8 = 1,
    DEVIO_GGUF_U16 = 2,
    DEVIO_GGUF_I16 = 3,
    DEVIO_GGUF_U32 = 4,
    DEVIO_GGUF_I32 = 5,
    DEVIO_GGUF_F32 = 6,
    DEVIO_GGUF_BOOL = 7,
    DEVIO_GGUF_STRING = 8,
    DEVIO_GGUF_ARRAY = 9,
    DEVIO_GGUF_U64 = 10,
    DEVIO_GGUF_I64 = 11,
    DEVIO_GGUF_F64 = 12,
} devio_gguf_vtype;

/* Tensor types (ggml's numbering) that the reader can size. Others are
 * refused at open, naming the tensor and the number. */
typedef enum devio_gguf_ttype {
    DEVIO_GGML_F32 = 0,
    DEVIO_GGML_F16 = 1,
    DEVIO_GGML_Q4_0 = 2,
    DEVIO_GGML_Q4_1 = 3,
    DEVIO_GGML_Q5_0 = 6,
    DEVIO_GGML_Q5_1 = 7,
    DEVIO_GGML_Q8_0 = 8,
    DEVIO_GGML_Q8_1 = 9,
    DEVIO_GGML_Q2_K = 10,
    DEVIO_GGML_Q3_K = 11,
    DEVIO_GGML_Q4_K = 12,
    DEVIO_GGML_Q5_K = 13,
    DEVIO_GGML_Q6_K = 14,
    DEVIO_GGML_Q8_K = 15,
    DEVIO_GGML_I8 = 24,
    DEVIO_GGML_I16 = 25,
    DEVIO_GGML_I32 = 26,
    DEVIO_GGML_I64 = 27,
    DEVIO_GGML_F64 = 28,
    DEVIO_GGML_BF16 = 30,
} devio_gguf_ttype;

#define DEVIO_GGUF_MAX_DIMS 4
/* Limits on what a header may claim, so that a hostile count cannot make
 * the reader allocate or walk without bound. */
#define DEVIO_GGUF_MAX_NAME 256        /* bytes of a tensor name */
#define DEVIO_GGUF_MAX_KEY 65535       /* bytes of a metadata key */
#define DEVIO_GGUF_MAX_ARRAY_DEPTH 4   /* arrays of arrays */

/* One metadata entry. `val` points at the value's bytes inside the file:
 * a scalar's little-endian bytes; a string's 8-byte length then its bytes;
 * an array's element type (4 bytes), count (8) and elements. */
typedef struct devio_gguf_kv {
    char *key;          /* owned by the file, NUL-terminated */
    uint32_t type;      /* devio_gguf_vtype */
    uint32_t elem_type; /* arrays: their elements' type */
    uint64_t n;         /* arrays: element count; strings: byte length */
    const uint8_t *val; /* borrowed from the file */
} devio_gguf_kv;

typedef struct devio_gguf_tensor {
    char *name;    /* owned by the file, NUL-terminated */
    uint32_t type; /* devio_gguf_ttype */
    uint32_t ndim;
    uint64_t ne[DEVIO_GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous), then rows ... */
    uint64_t offset;                  /* from the data section's start */
    uint64_t nbytes;
    const uint8_t *data; /* borrowed from the file; aligned as the file says */
} devio_gguf_tensor;

typedef struct devio_gguf_file devio_gguf_file;

/* Open and validate `path` (errors name it by `label`). Checked: the magic
 * and version (2 or 3); every length and count against the bytes left;
 * every metadata type, key (no duplicates) and string; general.alignment
 * (a power of two, 32 when absent); each tensor's name (unique, at most
 * DEVIO_GGUF_MAX_NAME bytes), 1..4 dimensions, none zero, the element
 * count without overflow, a type it can size, a row length that is a whole
 * number of the type's blocks, an aligned offset, and its bytes inside the
 * data section and overlapping no other tensor's. Violations are
 * DEVIO_E_MODEL naming the file and, where there is one, the tensor or key.
 * On success *out is owned by the caller (devio_gguf_close); else NULL. */
devio_status devio_gguf_open(const char *path, const char *label, devio_gguf_file **out,
                             devio_error *err);
/* As devio_gguf_open over an open descriptor (borrowed, read with pread). */
devio_status devio_gguf_open_fd(int fd, const char *label, devio_gguf_file **out,
                                devio_error *err);
/* Validate a GGUF image already in memory (bytes borrowed; they must
 * outlive the file). For the fuzzer and tests. */
devio_status devio_gguf_parse(const uint8_t *bytes, size_t size, const char *label,
                              devio_gguf_file **out, devio_error *err);
void devio_gguf_close(devio_gguf_file *f);
/* f's bytes given back as devio_st_release does (views keep their
 * addresses; a read faults). Only for a file opened from disk. */
void devio_gguf_release(devio_gguf_file *f);

uint32_t devio_gguf_version(const devio_gguf_file *f);
const char *devio_gguf_label(const devio_gguf_file *f);
size_t devio_gguf_kv_count(const devio_gguf_file *f);
const devio_gguf_kv *devio_gguf_kv_at(const devio_gguf_file *f, size_t i);
/* The entry called key, or NULL. Borrowed from f. */
const devio_gguf_kv *devio_gguf_find_kv(const devio_gguf_file *f, const char *key);
size_t devio_gguf_tensor_count(const devio_gguf_file *f);
const devio_gguf_tensor *devio_gguf_tensor_at(const devio_gguf_file *f, size_t i);
const devio_gguf_tensor *devio_gguf_find_tensor(const devio_gguf_file *f, const char *name);
/* The place in file order (devio_gguf_tensor_at's i) of t, a tensor of f. */
size_t devio_gguf_tensor_index(const devio_gguf_file *f, const devio_gguf_tensor *t);

/* Typed reads of a metadata entry. Each returns false when the key is
 * absent or its value is not of a kind that converts exactly: any integer
 * type in range for the unsigned one, F32 or F64 holding a value a float
 * represents for the float one (an F64 is rounded to nearest). */
bool devio_gguf_get_u64(const devio_gguf_file *f, const char *key, uint64_t *out);
bool devio_gguf_get_u32(const devio_gguf_file *f, const char *key, uint32_t *out);
bool devio_gguf_get_f32(const devio_gguf_file *f, const char *key, float *out);
bool devio_gguf_get_bool(const devio_gguf_file *f, const char *key, bool *out);
/* A string entry's bytes (not NUL-terminated) and length, or NULL. */
const char *devio_gguf_get_str(const devio_gguf_file *f, const char *key, uint64_t *len);

/* The type's name ("Q4_K"), "?" for a number it does not know; its block
 * (elements) and the bytes of one block, 0 for a type it cannot size. */
const char *devio_gguf_type_name(uint32_t type);
uint32_t devio_gguf_type_block(uint32_t type);
uint32_t devio_gguf_type_bytes(uint32_t type);

#endif
