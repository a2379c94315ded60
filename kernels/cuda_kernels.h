/* cuda_kernels.h - the CUDA backend's kernels, as C functions that enqueue
 * them on a stream: every one follows device/numerics/numspec.h operation for
 * operation (the rule numbers below are that header's), with one warp doing
 * what the definition calls the 32 lanes. Shared by cuda_kernels.cu (nvcc)
 * and cuda_backend.c (the C compiler): no CUDA types cross it.
 *
 * Every function only enqueues work on `stream` (a cudaStream_t) and returns
 * the cudaError_t of the launch as an int (0 = cudaSuccess). Pointers are
 * device memory unless said otherwise, borrowed for the life of the work. */
#ifndef DEVIO_CUDA_KERNELS_H
#define DEVIO_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight dtypes, as device/model/model.h numbers them. The block-quantized ones
 * stay as GGUF stores them (rows of whole blocks, in place), and a kernel
 * widens each element with device/numerics/quant.h's devio_quant_elem. */
enum {
    CUDA_F32 = 0, CUDA_F16 = 1, CUDA_BF16 = 2,
    CUDA_Q8_0, CUDA_Q4_0, CUDA_Q4_1, CUDA_Q5_0, CUDA_Q5_1, CUDA_Q4_K, CUDA_Q5_K, CUDA_Q6_K,
};

/* The lane-major layout of a projection weight on the device. A row of n
 * elements whose bytes are a multiple of 16 is stored in chunks of 32 * V
 * elements (V = 16 bytes / element size: 8 for f16 and bf16, 4 for f32):
 * inside a chunk, the V elements lane l of a warp adds (l, l + 32, ...,
 * l + 32 (V - 1), as the lane rule orders them) lie together in 16 bytes,
 * so that one 16-byte load per lane reads 512 contiguous bytes per warp.
 * Elements past the last whole chunk stay in place, as do rows whose bytes
 * are not a multiple of 16 and quantized rows. The upload (cuda_backend.c) permutes, the
 * projection kernel reads, and the embedding reads a tied lm_head back. */
#if defined(__CUDACC__)
#define CUDA_HD __host__ __device__
#else
#define CUDA_HD
#endif
static inline CUDA_HD uint32_t cuda_lane_v(int dtype) { return dtype == CUDA_F32 ? 4u : 8u; }
static inline CUDA_HD int cuda_lane_major(uint32_t n, int dtype)
{
    return dtype <= CUDA_BF16 && n % cuda_lane_v(dtype) == 0;
}
/* Where element i of a row of n sits in the lane-major layout. */
static inline CUDA_HD uint64_t cuda_lane_pos(uint64_t i, uint32_t n, int dtype)
{
    uint32_t v = cuda_lane_v(dtype), c = 32u * v;
    if (!cuda_lane_major(n, dtype) || i >= (uint64_t)(n / c) * c)
        return i;
    uint64_t r = i % c;
    return i - r + (r % 32u) * v + r / 32u;
}

/* Rule 1: x[t, 0..d) = widen(embed[tokens[t], 0..d)), times mult (Granite's
 * embedding_multiplier, one rounded multiply) when mult != 1. lane_major:
 * the rows are in that layout (a tied lm_head). */
int cuda_embed(const void *embed, int dtype, int lane_major, uint32_t d, const int32_t *tokens,
               uint32_t n_tok, float mult, float *x, void *stream);

/* Rule 2: y[t] = rmsnorm(x[t], w) for n_tok rows of d floats; w is f32. y
 * may be x (a block stages its row in shared memory before writing it). Rule
 * 4a is this over the n_tok * n_heads rows of hd floats of q (and of k).
 * cuda_rmsnorm_prepare(max_d) once allows the shared memory of rows up to
 * max_d floats, (max_d + 1) * 4 bytes. */
int cuda_rmsnorm_prepare(uint32_t max_d);
int cuda_rmsnorm(const float *x, const float *w, float *y, uint32_t d, float eps, uint32_t n_tok,
                 void *stream);
/* The same, and when y16 is not NULL each y also rounded (nearest even) to dtype16 (CUDA_F16
 * or CUDA_BF16) into y16 [n_tok, d]: under fast numerics the norm lays down the GEMM's 16-bit
 * input itself. */
int cuda_rmsnorm16(const float *x, const float *w, float *y, void *y16, int dtype16, uint32_t d,
                   float eps, uint32_t n_tok, void *stream);

/* What a projection does with each dot product (rules 3 and 7). */
typedef enum cuda_epi {
    CUDA_EPI_STORE = 0, /* y = dot */
    CUDA_EPI_BIAS,      /* y = dot + bias[o] */
    CUDA_EPI_ADD,       /* y = y + dot (residual) */
    CUDA_EPI_SILU_MUL,  /* y = devio_siluf(dot(w)) * dot(w2) */
    CUDA_EPI_ADD_SCALED,/* y = y + dot * scale (Granite's residual_multiplier, rule 7) */
    CUDA_EPI_DIV,       /* y = dot / scale (Granite's logits_scaling, rule 8) */
} cuda_epi;

/* Rule 3 over n_tok token rows: y[t, o] = epi(lane_dot(W[o, :], x[t, :], n)).
 * One warp per output row reads that row once for all the step's tokens. */
typedef struct cuda_matvec {
    const void *w, *w2; /* [m, n] of dtype, lane-major (above); w2 (up) for SILU_MUL */
    int dtype;
    uint32_t m, n;
    const float *bias;  /* [m] for BIAS */
    float scale;        /* ADD_SCALED, DIV */
    cuda_epi epi;
    const float *x;     /* [n_tok, ldx] */
    uint32_t ldx, n_tok;
    float *y;           /* [n_tok, ldy] */
    uint32_t ldy;
    int strict;         /* fast numerics keep this one on the strict kernel (cuda_step.c) */
    const void *x16;    /* fast numerics: x already rounded to the GEMM's 16-bit input type
                           ([n_tok, n], by cuda_rmsnorm16), or NULL */
} cuda_matvec;

int cuda_project(const cuda_matvec *mv, void *stream);

/* The paged KV cache of one layer: [kv_blocks, n_kv, block_size, hd] f32
 * for K and for V, and how a token finds its slot: position pos[t] of the
 * block table bt + bt_off[t]. */
typedef struct cuda_kv {
    float *k, *v;
    uint16_t *k16, *v16; /* fast numerics: the pools in f16 instead (k and v NULL) */
    uint32_t block_size, n_heads, n_kv, hd;
    uint32_t rd; /* rotary_dim: RoPE turns dimensions [0, rd) of a head */
    uint32_t window; /* attention reads keys pos - window < j <= pos; 0 = all */
    const uint32_t *pos, *bt_off, *bt;
} cuda_kv;

/* The element where head g of the key at position pos starts, in a pool
 * of kv whose token's block table is bt. */
static inline CUDA_HD size_t cuda_kv_slot(const cuda_kv *kv, const uint32_t *bt, uint32_t pos,
                                          uint32_t g)
{
    size_t blk = bt[pos / kv->block_size];
    return ((blk * kv->n_kv + g) * kv->block_size + pos % kv->block_size) * kv->hd;
}

/* Rules 4 and 5: RoPE on the first rd dimensions of every q and k head of
 * n_tok tokens (in place, with the tables cos/sin [max_seq_len, rd/2];
 * dimensions [rd, hd) are left as they are), then K and V into the cache
 * (rounded to f16, to nearest even, when the pools are k16 and v16). */
int cuda_rope_store(const cuda_kv *kv, float *q, float *k, const float *v, const float *cos_t,
                    const float *sin_t, uint32_t n_tok, void *stream);

/* Rule 6 for every (token, head): out [n_tok, n_heads * hd]. A token at pos
 * reads keys j0 .. pos, j0 = pos + 1 - window when kv->window is set and
 * pos + 1 > window, else 0; block table entries below j0 are never read
 * (the core may have released those blocks). smem_bytes is what
 * cuda_attention_smem gives for the most keys a token reads. */
int cuda_attention(const cuda_kv *kv, const float *q, float scale, float *out, uint32_t n_tok,
                   uint32_t smem_bytes, void *stream);
uint32_t cuda_attention_smem(uint32_t max_keys, uint32_t hd);
/* Lets the attention kernel use smem_bytes of shared memory (once, at create). */
int cuda_attention_prepare(uint32_t smem_bytes);

/* One adapted module of one adapter slot, widened to f32 on the device. */
typedef struct cuda_lora_mod {
    const float *a; /* [rank, in], NULL when the module is not adapted */
    const float *b; /* [out, rank] */
    uint32_t rank, in, out;
    float scale;
} cuda_lora_mod;

/* Rule 3a for the tokens whose slot tok_slot[t] >= 0 has module
 * mods[slot * mods_per_slot + mod_index] adapted: a = A x, then
 * y[t, o] = y[t, o] + lane_dot(B[o], a, rank) * scale. a_buf holds
 * [n_tok, max_rank] floats. mods is device memory. */
int cuda_lora(const cuda_lora_mod *mods, uint32_t mods_per_slot, uint32_t mod_index,
              const int32_t *tok_slot, const float *x, uint32_t ldx, float *y, uint32_t ldy,
              uint32_t n_tok, uint32_t max_rank, uint32_t max_out, float *a_buf, void *stream);

/* x[t, i] = x[t, i] + y[t, i] for n_tok rows of n floats (the residual
 * add); with r != 1 (Granite's residual_multiplier, rule 7) x + y * r, the
 * product rounded, then added. */
int cuda_add(float *x, const float *y, float r, uint32_t n, uint32_t n_tok, void *stream);
/* act = devio_siluf(g) * u, n_tok rows of n floats. */
int cuda_silu_mul(const float *g, const float *u, float *act, uint32_t n, uint32_t n_tok,
                  void *stream);
/* dst[i, 0..width) = src[idx[i], 0..width) for n rows (dst and src distinct). */
int cuda_gather(float *dst, const float *src, const uint32_t *idx, uint32_t width, uint32_t n,
                void *stream);
/* Block dst <- block src in every layer of the K and V pools, counted in
 * 16-bit words whatever the pools hold: layers layer_words apart, blocks
 * block_words each. */
int cuda_copy_block(void *k, void *v, uint32_t n_layers, uint64_t layer_words,
                    uint32_t block_words, uint32_t src, uint32_t dst, void *stream);

#ifdef __cplusplus
}
#endif

#endif
