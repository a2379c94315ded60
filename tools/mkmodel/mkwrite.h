/* mkwrite.h - what devio-mkmodel's model writer (mkmodel.c) and adapter writer (mkadapter.c) share: seeded tensor values, the tensor list, JSON text, safetensors files.
 * Private to tools/mkmodel. Nothing here reads the clock or the host: the same list and seed give the same bytes. */
#ifndef DEVIO_MKWRITE_H
#define DEVIO_MKWRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"
#include "device/model/model.h"
#include "device/status.h" /* devio_fail, the writers' one way to report */

#define MK_CHUNK ((size_t)65536) /* elements generated and written per step */
#define MK_NAME_MAX 96u
#define MK_MAX_NDIM 3u /* conv1d weights are [channels, 1, kernel] */

/* How a tensor's elements follow from u, uniform in [-1, 1), and u01 = (u + 1) / 2. */
typedef enum mk_init {
    MK_INIT_LINEAR,  /* u * scale */
    MK_INIT_NORM,    /* 1 + u * scale */
    MK_INIT_BIAS,    /* u * scale */
    MK_INIT_A_LOG,   /* log(lo + u01 * (hi - lo)): Mamba-2's A_log, A uniform in [lo, hi) */
    MK_INIT_DT_BIAS, /* softplus^-1(dt), dt log-uniform in [lo, hi): Mamba-2's dt_bias */
} mk_init;

/* One tensor to write: its name, shape, initialisation and place on disk. */
typedef struct mk_tensor {
    char name[MK_NAME_MAX];
    uint32_t ndim;
    uint64_t shape[MK_MAX_NDIM];
    uint64_t nelem;
    mk_init init;
    float scale;     /* linear: 1/sqrt(fan_in); norm and bias: spread */
    float lo, hi;    /* A_LOG and DT_BIAS: the range drawn from */
    uint32_t shard;  /* index of the file it goes to */
    uint64_t offset; /* begin offset inside that file's data section */
} mk_tensor;

/* The tensors of one model or adapter; t is owned, released with free(). */
typedef struct mk_list {
    mk_tensor *t;
    size_t n;
} mk_list;

/* A growable text buffer for the JSON the writer builds by hand, so that
 * key order and number formatting are fixed by these files alone; s is
 * owned, released with free(). After a failed allocation oom stays set and
 * further printing does nothing. */
typedef struct mk_buf {
    char *s;
    size_t len, cap;
    bool oom;
} mk_buf;

/* Appends formatted text to b. */
void mk_buf_printf(mk_buf *b, const char *fmt, ...) DEVIO_PRINTF(2, 3);

/* Bytes per element: 4 for F32, else 2. */
uint64_t mk_dtype_size(devio_dtype t);

/* config.json's torch_dtype: "float32", "float16" or "bfloat16". */
const char *mk_torch_dtype(devio_dtype t);

/* 1/sqrt(n) from correctly rounded binary32 operations. */
float mk_inv_sqrt(uint64_t n);

/* Appends one tensor of 1 or 2 dimensions (s1 unused for 1) to L, which has room for it. */
void mk_add(mk_list *L, const char *name, uint32_t ndim, uint64_t s0, uint64_t s1, mk_init init,
            float scale);

/* Appends the 3-D tensor [s0, s1, s2] to L, which has room for it. */
void mk_add_3d(mk_list *L, const char *name, uint64_t s0, uint64_t s1, uint64_t s2,
               mk_init init, float scale);

/* Appends the vector [n] drawn from [lo, hi) by `init` (A_LOG or DT_BIAS;
 * 0 < lo <= hi) to L, which has room for it. */
void mk_add_range(mk_list *L, const char *name, uint64_t n, mk_init init, float lo, float hi);

/* Sorts L by tensor name: the order of both a file's header and its data. */
void mk_list_sort(mk_list *L);

/* Elements [start, start+n) of tensor `name` of a written list, as the
 * writer produces them (`what` names the file set in the error).
 * Unknown tensor or range: DEVIO_E_INVALID. */
devio_status mk_list_values(const mk_list *L, uint64_t seed, const char *name, uint64_t start,
                            size_t n, float *dst, const char *what, devio_error *err);

/* mkdir -p: creates each missing component of `dir`. DEVIO_E_IO when a
 * component cannot be made or `dir` is not a directory in the end. */
devio_status mk_mkdirs(const char *dir, devio_error *err);

/* "DIR/NAMESUFFIX"; caller frees. NULL when memory is short. */
char *mk_path(const char *dir, const char *name, const char *suffix);

/* Writes the text of b to DIR/NAME through DIR/NAME.tmp and a rename, so a
 * reader never sees a half-written file under the final name.
 * DEVIO_E_NOMEM when b ran out of memory (nothing is written), DEVIO_E_IO. */
devio_status mk_write_json(const char *dir, const char *name, const mk_buf *b, devio_error *err);

/* The scratch one chunk of one tensor passes through: MK_CHUNK floats and
 * their bytes on disk. Both owned, released with mk_chunk_free(). */
typedef struct mk_chunk {
    float *f;
    uint8_t *bytes;
} mk_chunk;

/* Both buffers or, with DEVIO_E_NOMEM, neither. */
devio_status mk_chunk_alloc(mk_chunk *c, devio_error *err);
void mk_chunk_free(mk_chunk *c);

/* Writes the tensors of L that belong to `shard` as the safetensors file
 * DIR/NAME (through NAME.tmp and a rename), one chunk at a time through
 * *ck, converted to `dtype`. */
devio_status mk_write_st(const char *dir, const char *name, const mk_list *L, uint32_t shard,
                         devio_dtype dtype, uint64_t seed, const mk_chunk *ck, devio_error *err);

/* One `  "key": value,` line of a config.json, indented as transformers'
 * save_pretrained indents top-level keys: an integer, true or false, a
 * float (mk_json_double), a string (written as given: no escaping). */
void mk_kv_u(mk_buf *b, const char *key, uint64_t v);
void mk_kv_b(mk_buf *b, const char *key, bool v);
void mk_kv_f(mk_buf *b, const char *key, double v);
void mk_kv_s(mk_buf *b, const char *key, const char *v);

/* Shortest decimal that reads back as the same double, written as a JSON
 * float (a trailing ".0" when it would otherwise look like an integer). */
void mk_json_double(mk_buf *b, double v);

#endif
