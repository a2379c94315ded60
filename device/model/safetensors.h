/* safetensors.h - reads one .safetensors file into memory and range-checks every tensor in it.
 * It never interprets tensor values, never hands out a pointer outside the file's bytes, and
 * never keeps the file mapped: what it read cannot change when the file on disk does. */
#ifndef DEVIO_SAFETENSORS_H
#define DEVIO_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"
#include "device/model/model.h"

#define DEVIO_ST_MAX_DIMS 8
/* The header is JSON text; anything larger is not a model we can trust. */
#define DEVIO_ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024)

/* One tensor entry of the header. `data` points into the file's bytes as
 * read at open, owned by the devio_st_file. */
typedef struct devio_st_tensor {
    char *name;         /* owned by the file */
    char dtype_str[16]; /* as written in the header, e.g. "BF16", "I64" */
    bool supported;     /* dtype is F32, F16 or BF16 */
    devio_dtype dtype;  /* valid when supported */
    uint32_t ndim;
    uint64_t shape[DEVIO_ST_MAX_DIMS];
    uint64_t nbytes;
    const uint8_t *data; /* borrowed from the file; may be unaligned */
} devio_st_tensor;

typedef struct devio_st_file devio_st_file;

/* Open and validate `path`. `label` is how errors name the file (usually its
 * name inside the model directory); `wanted` (may be NULL) is the tensor the
 * caller is opening the file for, named in file-level errors.
 * Every tensor's dtype must be a known safetensors dtype and its byte range
 * must lie inside the data section and match its shape; as the format
 * demands, the ranges, taken in offset order, must cover the data section
 * exactly: no overlap, no hole, no byte after the last tensor (the order of
 * the header's entries is free). Violations are DEVIO_E_MODEL naming the
 * file and tensor (both tensors of an overlap). Missing or unreadable files are
 * DEVIO_E_MODEL too (a model directory that lacks its weights is malformed).
 * On success *out is owned by the caller (devio_st_close); on failure NULL. */
devio_status devio_st_open(const char *path, const char *label, const char *wanted,
                           devio_st_file **out, devio_error *err);

/* As devio_st_open, over an open descriptor (borrowed: not closed, read
 * with pread only, so its offset is untouched). The whole file is read into
 * anonymous memory the devio_st_file owns; a file that changes size or
 * modification time while being read is DEVIO_E_IO ("try again"). Not a
 * regular file, or shorter than 8 bytes: DEVIO_E_MODEL. */
devio_status devio_st_open_fd(int fd, const char *label, const char *wanted, devio_st_file **out,
                              devio_error *err);

/* Reads the whole of fd (borrowed; pread only) into pages of its own
 * (devio_st_pages, read-only once read; *base and *size owned by the
 * caller, freed with devio_st_pages_free). Not a regular file, or shorter
 * than min_size bytes: DEVIO_E_MODEL; a file that changes size or
 * modification time while being read: DEVIO_E_IO ("try again"). Errors name
 * the file by label, followed by ctx (may be ""). Shared by every weight
 * format's reader. */
devio_status devio_st_read_fd(int fd, const char *label, uint64_t min_size, const char *ctx,
                              uint8_t **base, size_t *size, devio_error *err);

/* Scans every element of t (F32, F16 or BF16) for NaN and infinities,
 * reading each byte once: DEVIO_E_MODEL naming the file, the tensor, the
 * first bad element's index and what it holds. Other dtypes are not scanned
 * (DEVIO_OK); their use is refused elsewhere. */
/* Memory of its own for a copy of tensor bytes (anonymous pages natively,
 * the heap under WASI): NULL when there is none. Freed with
 * devio_st_pages_free(p, n). */
void *devio_st_pages(size_t n);
void devio_st_pages_free(void *p, size_t n);
/* Gives the memory of [p, p + n) back to the system while keeping the
 * addresses reserved and inaccessible: a read afterwards faults instead of
 * seeing other data. Natively only (under WASI nothing is given back). */
void devio_st_pages_release(void *p, size_t n);
/* f's bytes released as above: its tensors keep their addresses (views can
 * still be told apart and compared) but must never be read again. */
void devio_st_release(devio_st_file *f);

devio_status devio_st_check_finite(const devio_st_file *f, const devio_st_tensor *t,
                                   devio_error *err);
/* The same scan over nbytes of data of dtype dt (F32, F16, BF16; others
 * pass), errors naming label and tensor name. For every weight format. */
devio_status devio_weights_check_finite(const char *label, const char *name, devio_dtype dt,
                                        const void *data, uint64_t nbytes, devio_error *err);

/* What a loader wants of one tensor, and how a refusal is said. */
typedef struct devio_st_want {
    uint32_t ndim;       /* 1: [s0]; 2: [s0, s1]; 3: [s0, 1, s1], viewed as [s0, s1] */
    uint64_t s0, s1;
    devio_status refuse; /* the status of a dtype or shape refused */
    const char *why;     /* said after the expected shape as " (why)"; NULL: nothing */
    bool scan;           /* refuse NaN and infinities (devio_st_check_finite) */
} devio_st_want;

/* Tensor t of f, named in errors after `label`, checked against w (dtype
 * F32, F16 or BF16; the shape; finite when w->scan) and made the view *out.
 * When the file stores t at an offset its element size does not divide, the
 * view is an aligned copy: *copy is that copy, t->nbytes bytes the caller
 * owns and frees with devio_st_pages_free(*copy, t->nbytes); else *copy is
 * NULL. On failure *out and *copy are untouched and nothing is allocated. */
devio_status devio_st_view(const devio_st_file *f, const devio_st_tensor *t, const char *label,
                           const devio_st_want *w, devio_tensor *out, void **copy,
                           devio_error *err);

/* Release the bytes and every entry. f may be NULL. */
void devio_st_close(devio_st_file *f);

/* Entry named `name`, or NULL. Borrowed from f. */
const devio_st_tensor *devio_st_find(const devio_st_file *f, const char *name);

size_t devio_st_count(const devio_st_file *f);
/* Entries sorted by name; i < devio_st_count(f). Borrowed from f. */
const devio_st_tensor *devio_st_at(const devio_st_file *f, size_t i);

/* The label given at open. Borrowed from f. */
const char *devio_st_label(const devio_st_file *f);

/* The whole file as read at open (*size bytes), so that a digest can be
 * taken of exactly the bytes the tensors point into. Borrowed from f. */
const uint8_t *devio_st_bytes(const devio_st_file *f, size_t *size);

#endif
