/* ref_kernels.h - the math of the reference backend: vectorised kernels that
 * follow device/numerics/numspec.h operation for operation (the rule numbers below are
 * that header's). Never allocates; never calls libm. */
#ifndef DEVIO_REF_KERNELS_H
#define DEVIO_REF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "device/backend/backend.h"
#include "device/model/model.h"
#include "ref/pool.h"

/* One element of the KV cache: binary32, or binary16 in a build that
 * defines REF_KV_F16 (ref_kv.h writes and reads it). */
#if defined(REF_KV_F16)
typedef uint16_t ref_kv;
#else
typedef float ref_kv;
#endif

/* Floats of a thread's projection partials (ref_gemm.c): two operands x
 * 32 lanes x up to 12 tokens x 16 outputs. */
#define REF_GEMM_PART_FLOATS (2u * 32u * 12u * 16u)

/* Activations handed to the kernels are stored with a row stride of
 * ref_pad32(n) floats and zeros past n, so that full 32-lane chunks can be
 * read without a tail case. */
static inline uint32_t ref_pad32(uint32_t n)
{
    return (n + 31u) & ~31u;
}

/* Per-thread scratch, owned by the backend state (ref_scratch_init/fini). */
typedef struct ref_scratch {
    float *part;     /* REF_GEMM_PART_FLOATS: a projection tile's lane partials */
    float *scores;   /* max_seq_len: attention scores, then exp weights */
    size_t *rows;    /* max_seq_len: each key's row offset in the KV pools */
    float *acc;      /* 32 * ref_pad32(head_dim): per-lane attention sums */
    float *qbuf;     /* ref_pad32(head_dim): a query head, zero padded */
    float *kbuf;     /* ref_pad32(head_dim): a key tail, zero padded */
    float *wide;     /* ref_scratch_wide_floats: 16-bit weight panels widened (ref_gemm.c); in
                      * the cpu backend also its attention's tiles (cpu/cpu_attention.c) */
} ref_scratch;

/* Floats of ref_scratch.wide: two panels of 16 rows of the widest input, and at least 128
 * padded heads and 1024 floats more (what a blocked attention keeps: keys and values of a
 * block, the rows of queries it serves and their scores). */
static inline size_t ref_scratch_wide_floats(uint32_t max_k, uint32_t head_dim)
{
    size_t panels = (size_t)2 * 16 * ref_pad32(max_k ? max_k : 1);
    size_t tiles = (size_t)128 * ref_pad32(head_dim) + 1024;
    return panels > tiles ? panels : tiles;
}

/* Allocate scratch for sequences up to max_seq_len, head dimension
 * head_dim and projections whose input width is at most max_k. Returns 0 on success, -1 when memory is short (then nothing is
 * held). Free with ref_scratch_fini. */
int ref_scratch_init(ref_scratch *s, uint32_t max_seq_len, uint32_t head_dim, uint32_t max_k);
void ref_scratch_fini(ref_scratch *s);

/* lane_dot and lane_sum of the definition, for any n (no padding needed). */
float ref_lane_dot(const float *a, const float *b, uint32_t n);
float ref_lane_sum(const float *x, uint32_t n);

/* Widen n elements of dtype dt at src into dst (a quantized dtype: n a
 * whole number of blocks, each element's value by device/numerics/quant.h). */
void ref_widen(devio_dtype dt, const void *src, float *dst, size_t n);

/* rmsnorm of rule 2: y[0..d) from x[0..d) (may not alias), w f32 [d]. */
void ref_rmsnorm(float *y, const float *x, const float *w, uint32_t d, float eps);

/* RoPE of rule 4 on the first rd of each of n_heads heads of hd floats at
 * x (in place), with the table rows cos_row/sin_row [rd/2] of the token's
 * position; dimensions [rd, hd) of a head are left as they are. */
void ref_rope(float *x, uint32_t n_heads, uint32_t hd, uint32_t rd, const float *cos_row,
              const float *sin_row);

/* Attention (rule 6) for every (token, head) of a step, one job each. */
typedef struct ref_attention {
    const float *q;          /* [n_tok, n_heads * hd] after RoPE, stride ldq */
    size_t ldq;
    const ref_kv *k_cache;   /* the layer's pools, [kv_blocks, n_kv, block_size, hd] */
    const ref_kv *v_cache;
    uint32_t block_size, n_heads, n_kv_heads, head_dim;
    uint32_t n_tok;
    const uint32_t *tok_pos;           /* [n_tok] absolute position */
    const uint32_t *const *tok_blocks; /* [n_tok] the token's block table */
    float scale;                       /* the shape's attn_scale */
    uint32_t window;                   /* keys within this many positions, 0 = all */
    float *out;              /* [n_tok, n_heads * hd], stride ldo */
    size_t ldo;
} ref_attention;

void ref_attention_run(devio_pool *pool, ref_scratch *scratch, const ref_attention *a);

/* The first key position a token at pos attends: 0, or the last `window` (rule 6). */
static inline uint32_t ref_attention_first_key(const ref_attention *a, uint32_t pos)
{
    return a->window && pos + 1 > a->window ? pos + 1 - a->window : 0;
}

/* rows[k] = where key j0 + k's row of KV head kvh starts in the K pool and the V pool alike,
 * for k < n, through the block table `blocks` (the keys of a head are contiguous inside a
 * block, blocks lie anywhere): walked once, so no key costs a division. */
static inline void ref_attention_rows(const ref_attention *a, const uint32_t *blocks,
                                      uint32_t kvh, uint32_t j0, uint32_t n, size_t *rows)
{
    uint32_t bs = a->block_size;
    for (uint32_t k = 0, blk = j0 / bs, off = j0 % bs; k < n; k++) {
        rows[k] = (((size_t)blocks[blk] * a->n_kv_heads + kvh) * bs + off) * a->head_dim;
        if (++off == bs) {
            off = 0;
            blk++;
        }
    }
}

/* One (token, head) of ref_attention, on one thread's scratch. */
void ref_attention_one(const ref_attention *a, uint32_t t, uint32_t h, ref_scratch *s);

#endif
