/* cuda_fast.cu - the kernels of the CUDA backend's fast numerics (--numerics fast), around the
 * GEMMs of cuda_gemm.h: the 16-bit rounding of a GEMM's input, the bias rows it adds to, the
 * split and SiLU of fused outputs, and paged attention over 16-bit K and V split along the keys.
 * Strict numerics never launch them; fast numerics promise a tolerance, not bits. */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_warp.cuh"

__global__ void k_round16(const float *x, uint32_t ldx, uint16_t *dst, uint32_t n, int bf16)
{
    uint32_t t = blockIdx.y;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[(size_t)t * ldx + i];
        dst[(size_t)t * n + i] = bf16 ? devio_f32_to_bf16_rne(v) : devio_f32_to_f16_rne(v);
    }
}

int cuda_round16(const float *x, uint32_t ldx, void *dst, uint32_t n, uint32_t n_tok, int dtype,
                 void *stream)
{
    if (n == 0 || n_tok == 0)
        return 0;
    dim3 grid(cuda_blocks_for(n, 256), n_tok);
    LAUNCH((k_round16), grid, 256, 0, (cudaStream_t)stream, x, ldx, (uint16_t *)dst, n,
           dtype == CUDA_BF16);
    return cuda_launched();
}

__global__ void k_bias_rows(float *y, uint32_t ldy, const float *bias, uint32_t m)
{
    uint32_t t = blockIdx.y;
    for (uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < m; o += gridDim.x * blockDim.x)
        y[(size_t)t * ldy + o] = bias[o];
}

int cuda_bias_rows(float *y, uint32_t ldy, const float *bias, uint32_t m, uint32_t n_tok,
                   void *stream)
{
    if (m == 0 || n_tok == 0)
        return 0;
    dim3 grid(cuda_blocks_for(m, 256), n_tok);
    LAUNCH((k_bias_rows), grid, 256, 0, (cudaStream_t)stream, y, ldy, bias, m);
    return cuda_launched();
}

__global__ void k_split3(const float *src, uint32_t a, uint32_t b, uint32_t c, float *da,
                         float *db, float *dc)
{
    uint32_t t = blockIdx.y, w = a + b + c;
    const float *row = src + (size_t)t * w;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < w; i += gridDim.x * blockDim.x) {
        if (i < a)
            da[(size_t)t * a + i] = row[i];
        else if (i < a + b)
            db[(size_t)t * b + i - a] = row[i];
        else
            dc[(size_t)t * c + i - a - b] = row[i];
    }
}

int cuda_split3(const float *src, uint32_t a, uint32_t b, uint32_t c, float *da, float *db,
                float *dc, uint32_t n_tok, void *stream)
{
    if (n_tok == 0 || a + b + c == 0)
        return 0;
    dim3 grid(cuda_blocks_for(a + b + c, 256), n_tok);
    LAUNCH((k_split3), grid, 256, 0, (cudaStream_t)stream, src, a, b, c, da, db, dc);
    return cuda_launched();
}

__global__ void k_silu_mul_pairs(const float *gu, float *act, uint32_t f)
{
    uint32_t t = blockIdx.y;
    const float *g = gu + (size_t)t * 2 * f, *u = g + f;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < f; i += gridDim.x * blockDim.x)
        act[(size_t)t * f + i] = DEVIO_MUL(devio_siluf(g[i]), u[i]);
}

int cuda_silu_mul_pairs(const float *gu, float *act, uint32_t f, uint32_t n_tok, void *stream)
{
    if (n_tok == 0 || f == 0)
        return 0;
    dim3 grid(cuda_blocks_for(f, 256), n_tok);
    LAUNCH((k_silu_mul_pairs), grid, 256, 0, (cudaStream_t)stream, gu, act, f);
    return cuda_launched();
}

/* ---- quantized weights widened for the GEMM ---- */

/* dst[i] = element i of the blocks at w of ggml type G, in f16 (saturating, as the KV cache). */
template <uint32_t G>
__global__ void k_dequant16(const uint8_t *w, uint64_t n, uint16_t *dst)
{
    const uint32_t blk = devio_quant_block(G), bytes = devio_quant_block_bytes(G);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        dst[i] = kv16_store(devio_quant_elem(G, w + (i / blk) * bytes, (uint32_t)(i % blk)));
}

int cuda_dequant16(int dtype, const void *w, uint64_t n, uint16_t *dst, void *stream)
{
    const uint8_t *b = static_cast<const uint8_t *>(w);
    uint64_t want = (n + 255) / 256;
    uint32_t grid = want < 65535 ? (uint32_t)want : 65535u;
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
    case CUDA_Q8_0: LAUNCH((k_dequant16<DEVIO_QT_Q8_0>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q4_0: LAUNCH((k_dequant16<DEVIO_QT_Q4_0>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q4_1: LAUNCH((k_dequant16<DEVIO_QT_Q4_1>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q5_0: LAUNCH((k_dequant16<DEVIO_QT_Q5_0>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q5_1: LAUNCH((k_dequant16<DEVIO_QT_Q5_1>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q4_K: LAUNCH((k_dequant16<DEVIO_QT_Q4_K>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q5_K: LAUNCH((k_dequant16<DEVIO_QT_Q5_K>), grid, 256, 0, s, b, n, dst); break;
    case CUDA_Q6_K: LAUNCH((k_dequant16<DEVIO_QT_Q6_K>), grid, 256, 0, s, b, n, dst); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return cuda_launched();
}

/* ---- warp reductions in an order of their own ---- */

__device__ inline float warp_max(float v)
{
#pragma unroll
    for (int w = 16; w >= 1; w >>= 1) {
        float o = __shfl_xor_sync(FULL, v, w);
        v = o > v ? o : v;
    }
    return v;
}

__device__ inline float warp_sum(float v)
{
#pragma unroll
    for (int w = 16; w >= 1; w >>= 1)
        v = v + __shfl_xor_sync(FULL, v, w);
    return v;
}

/* ---- GEMV for small batches ---- */

/* A warp's sums of its output row for each token, folded and stored by lane 0 at y[t * ldy]. */
__device__ inline void gemv_store(const float *acc, uint32_t n_tok, float alpha, float beta,
                                  float *y, uint32_t ldy)
{
#pragma unroll
    for (uint32_t t = 0; t < CUDA_GEMV_MAX_TOK; t++) {
        if (t >= n_tok)
            break;
        float d = warp_sum(acc[t]);
        if (threadIdx.x % 32 == 0) {
            float *yt = y + (size_t)t * ldy;
            *yt = beta == 0.0f ? alpha * d : alpha * d + beta * *yt;
        }
    }
}

#define GEMV_WARPS 4 /* output rows per block */

template <int DT>
__global__ void __launch_bounds__(32 * GEMV_WARPS)
    k_gemv(const void *w, uint32_t m, uint32_t n, const float *x, uint32_t ldx, uint32_t n_tok,
           float alpha, float beta, float *y, uint32_t ldy)
{
    constexpr uint32_t V = DT == CUDA_F32 ? 4 : 8; /* elements per 16-byte load */
    constexpr uint32_t ES = 16 / V;
    uint32_t o = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (o >= m)
        return; /* the whole warp */
    const char *row = static_cast<const char *>(w) + (size_t)o * n * ES;
    float acc[CUDA_GEMV_MAX_TOK];
#pragma unroll
    for (uint32_t t = 0; t < CUDA_GEMV_MAX_TOK; t++)
        acc[t] = 0.0f;
    for (uint32_t i = lane * V; i < n; i += 32 * V) {
        float wv[V];
        widen16<DT>(ld16(row + (size_t)i * ES), wv);
#pragma unroll
        for (uint32_t t = 0; t < CUDA_GEMV_MAX_TOK; t++) {
            if (t >= n_tok)
                break;
            const float *xt = x + (size_t)t * ldx + i;
#pragma unroll
            for (uint32_t v = 0; v < V; v++)
                acc[t] = acc[t] + wv[v] * xt[v];
        }
    }
    gemv_store(acc, n_tok, alpha, beta, y + o, ldy);
}

/* The quantized GEMV: lane l takes the 32-element groups l, l + 32, ... of its warp's row,
 * each element widened from its block as it is loaded (devio_quant_elem: exactly
 * devio_dequant_block's value), so the weight is read as stored, never widened in memory. */
template <uint32_t G>
__global__ void __launch_bounds__(32 * GEMV_WARPS)
    k_gemv_q(const uint8_t *w, uint32_t m, uint32_t n, const float *x, uint32_t ldx,
             uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy)
{
    const uint32_t blk = devio_quant_block(G), bytes = devio_quant_block_bytes(G);
    uint32_t o = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (o >= m)
        return; /* the whole warp */
    const uint8_t *row = w + (size_t)o * (n / blk) * bytes;
    float acc[CUDA_GEMV_MAX_TOK];
#pragma unroll
    for (uint32_t t = 0; t < CUDA_GEMV_MAX_TOK; t++)
        acc[t] = 0.0f;
    for (uint32_t i = lane * 32; i < n; i += 32 * 32) {
        const uint8_t *b = row + (size_t)(i / blk) * bytes;
        for (uint32_t j = 0; j < 32; j++) {
            float wv = devio_quant_elem(G, b, i % blk + j);
#pragma unroll
            for (uint32_t t = 0; t < CUDA_GEMV_MAX_TOK; t++) {
                if (t >= n_tok)
                    break;
                acc[t] = acc[t] + wv * x[(size_t)t * ldx + i + j];
            }
        }
    }
    gemv_store(acc, n_tok, alpha, beta, y + o, ldy);
}

/* ggml's number of a quantized CUDA dtype, or 0. */
static uint32_t ggml_of(int dtype)
{
    switch (dtype) {
    case CUDA_Q8_0: return DEVIO_QT_Q8_0;
    case CUDA_Q4_0: return DEVIO_QT_Q4_0;
    case CUDA_Q4_1: return DEVIO_QT_Q4_1;
    case CUDA_Q5_0: return DEVIO_QT_Q5_0;
    case CUDA_Q5_1: return DEVIO_QT_Q5_1;
    case CUDA_Q4_K: return DEVIO_QT_Q4_K;
    case CUDA_Q5_K: return DEVIO_QT_Q5_K;
    case CUDA_Q6_K: return DEVIO_QT_Q6_K;
    default: return 0;
    }
}

int cuda_gemv_fits(int dtype, uint32_t n)
{
    if (ggml_of(dtype))
        return n > 0 && n % devio_quant_block(ggml_of(dtype)) == 0;
    return dtype <= CUDA_BF16 && n > 0 && (size_t)n * (dtype == CUDA_F32 ? 4 : 2) % 16 == 0;
}

template <int DT>
static void gemv_dt(const void *w, uint32_t m, uint32_t n, const float *x, uint32_t ldx,
                    uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy,
                    cudaStream_t s)
{
    LAUNCH((k_gemv<DT>), cuda_blocks_for(m, GEMV_WARPS), 32 * GEMV_WARPS, 0, s, w, m, n, x, ldx,
           n_tok, alpha, beta, y, ldy);
}

int cuda_gemv(int dtype, const void *w, uint32_t m, uint32_t n, const float *x, uint32_t ldx,
              uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy, void *stream)
{
    if (!cuda_gemv_fits(dtype, n) || n_tok > CUDA_GEMV_MAX_TOK)
        return (int)cudaErrorInvalidValue;
    if (m == 0 || n_tok == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const uint8_t *q = static_cast<const uint8_t *>(w);
    uint32_t grid = cuda_blocks_for(m, GEMV_WARPS), T = 32 * GEMV_WARPS;
#define GEMV_Q(G) LAUNCH((k_gemv_q<G>), grid, T, 0, s, q, m, n, x, ldx, n_tok, alpha, beta, y, ldy)
    switch (ggml_of(dtype)) {
    case DEVIO_QT_Q8_0: GEMV_Q(DEVIO_QT_Q8_0); return cuda_launched();
    case DEVIO_QT_Q4_0: GEMV_Q(DEVIO_QT_Q4_0); return cuda_launched();
    case DEVIO_QT_Q4_1: GEMV_Q(DEVIO_QT_Q4_1); return cuda_launched();
    case DEVIO_QT_Q5_0: GEMV_Q(DEVIO_QT_Q5_0); return cuda_launched();
    case DEVIO_QT_Q5_1: GEMV_Q(DEVIO_QT_Q5_1); return cuda_launched();
    case DEVIO_QT_Q4_K: GEMV_Q(DEVIO_QT_Q4_K); return cuda_launched();
    case DEVIO_QT_Q5_K: GEMV_Q(DEVIO_QT_Q5_K); return cuda_launched();
    case DEVIO_QT_Q6_K: GEMV_Q(DEVIO_QT_Q6_K); return cuda_launched();
    default: break;
    }
#undef GEMV_Q
    if (dtype == CUDA_F32)
        gemv_dt<CUDA_F32>(w, m, n, x, ldx, n_tok, alpha, beta, y, ldy, s);
    else if (dtype == CUDA_F16)
        gemv_dt<CUDA_F16>(w, m, n, x, ldx, n_tok, alpha, beta, y, ldy, s);
    else
        gemv_dt<CUDA_BF16>(w, m, n, x, ldx, n_tok, alpha, beta, y, ldy, s);
    return cuda_launched();
}

/* ---- grouped LoRA (SGMV) ---- */

#define SG_TOK 8     /* tokens of one slot whose sums a thread holds at once */
#define SG_WARPS 4   /* rank rows per shrink block */
#define SG_OUT 128   /* output rows per expand block */

/* acc[tt] = sum of row[i] * src[toks[tt] * ld + i] over i = start, start + step, .. < len,
 * for the nt <= SG_TOK tokens toks. */
__device__ inline void sg_dots(const float *row, uint32_t len, uint32_t start, uint32_t step,
                               const float *src, size_t ld, const uint32_t *toks, uint32_t nt,
                               float *acc)
{
#pragma unroll
    for (uint32_t tt = 0; tt < SG_TOK; tt++)
        acc[tt] = 0.0f;
    for (uint32_t i = start; i < len; i += step) {
        float w = row[i];
#pragma unroll
        for (uint32_t tt = 0; tt < SG_TOK; tt++) {
            if (tt >= nt)
                break;
            acc[tt] = acc[tt] + w * src[(size_t)toks[tt] * ld + i];
        }
    }
}

__global__ void __launch_bounds__(32 * SG_WARPS)
    k_sgmv_shrink(const cuda_lora_mod *mods, uint32_t per_slot, uint32_t idx, uint32_t n_slots,
                  const uint32_t *seg, const float *x, uint32_t ldx, uint32_t max_rank,
                  float *a_buf)
{
    uint32_t s = blockIdx.x, lane = threadIdx.x % 32;
    uint32_t j = blockIdx.y * SG_WARPS + threadIdx.x / 32;
    const uint32_t *list = seg + n_slots + 1;
    uint32_t b = seg[s], e = seg[s + 1];
    const cuda_lora_mod *md = &mods[(size_t)s * per_slot + idx];
    if (b == e || !md->a || j >= md->rank)
        return; /* the whole warp */
    const float *ar = md->a + (size_t)j * md->in;
    for (uint32_t t0 = b; t0 < e; t0 += SG_TOK) {
        uint32_t nt = e - t0 < SG_TOK ? e - t0 : SG_TOK;
        float acc[SG_TOK];
        sg_dots(ar, md->in, lane, 32, x, ldx, list + t0, nt, acc);
#pragma unroll
        for (uint32_t tt = 0; tt < SG_TOK; tt++) {
            if (tt >= nt)
                break;
            float d = warp_sum(acc[tt]);
            if (lane == 0)
                a_buf[(size_t)list[t0 + tt] * max_rank + j] = d;
        }
    }
}

__global__ void __launch_bounds__(SG_OUT)
    k_sgmv_expand(const cuda_lora_mod *mods, uint32_t per_slot, uint32_t idx, uint32_t n_slots,
                  const uint32_t *seg, uint32_t max_rank, const float *a_buf, float *y,
                  uint32_t ldy)
{
    uint32_t s = blockIdx.x, o = blockIdx.y * SG_OUT + threadIdx.x;
    const uint32_t *list = seg + n_slots + 1;
    uint32_t b = seg[s], e = seg[s + 1];
    const cuda_lora_mod *md = &mods[(size_t)s * per_slot + idx];
    if (b == e || !md->a || o >= md->out)
        return;
    const float *br = md->b + (size_t)o * md->rank;
    for (uint32_t t0 = b; t0 < e; t0 += SG_TOK) {
        uint32_t nt = e - t0 < SG_TOK ? e - t0 : SG_TOK;
        float acc[SG_TOK];
        sg_dots(br, md->rank, 0, 1, a_buf, max_rank, list + t0, nt, acc);
#pragma unroll
        for (uint32_t tt = 0; tt < SG_TOK; tt++) {
            if (tt >= nt)
                break;
            float *yo = y + (size_t)list[t0 + tt] * ldy + o;
            *yo = *yo + acc[tt] * md->scale;
        }
    }
}

int cuda_sgmv(const cuda_lora_mod *mods, uint32_t per_slot, uint32_t idx, uint32_t n_slots,
              const uint32_t *seg, const float *x, uint32_t ldx, float *y, uint32_t ldy,
              uint32_t max_rank, uint32_t max_out, float *a_buf, void *stream)
{
    if (n_slots == 0 || max_rank == 0 || max_out == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    LAUNCH((k_sgmv_shrink), dim3(n_slots, cuda_blocks_for(max_rank, SG_WARPS)), 32 * SG_WARPS, 0,
           s, mods, per_slot, idx, n_slots, seg, x, ldx, max_rank, a_buf);
    if (cudaPeekAtLastError() == cudaSuccess)
        LAUNCH((k_sgmv_expand), dim3(n_slots, cuda_blocks_for(max_out, SG_OUT)), SG_OUT, 0, s,
               mods, per_slot, idx, n_slots, seg, max_rank, a_buf, y, ldy);
    return cuda_launched();
}

/* ---- paged attention over 16-bit pools, split along the keys (flash-decoding) ---- */

#define A16_KEYS 32      /* keys a block stages in shared memory at once: one per lane, so 32 */
#define A16_WARPS 8      /* heads of a GQA group one block computes, at most */
#define A16_SPLIT_MIN 64 /* keys per range, at least */
#define A16_PAIRS (CUDA_ATTN16_MAX_HD / 64) /* column pairs a lane holds */
#define A16_QTILE 8 /* tokens a block of the tiled (prefill) kernel serves */

/* Keys per range when n_keys are cut into `splits`: whole chunks of A16_KEYS. */
__host__ __device__ inline uint32_t a16_per(uint32_t n_keys, uint32_t splits)
{
    uint32_t per = (n_keys + splits - 1) / splits;
    return (per + A16_KEYS - 1) / A16_KEYS * A16_KEYS;
}

/* The first key a token at pos reads (a sliding window's) and how many. */
__device__ inline uint32_t a16_keys(const cuda_kv &kv, uint32_t pos, uint32_t *j0)
{
    *j0 = kv.window && pos + 1 > kv.window ? pos + 1 - kv.window : 0;
    return pos + 1 - *j0;
}

/* The two 16-bit K or V elements of a 32-bit word, element 2i in the low half. */
__device__ inline float kv_lo(uint32_t u) { return kv16_load((uint16_t)(u & 0xffffu)); }
__device__ inline float kv_hi(uint32_t u) { return kv16_load((uint16_t)(u >> 16)); }

/* One chunk of nk staged keys and values (ks, vs: rows of `row` words, hw pairs each) into a
 * warp's online softmax: lane j scores key j with query qh when `valid`, then the running max
 * m, sum l and output columns acc (P pairs a lane: l, l + 32, ...) move on. */
template <uint32_t P, class Q, class S>
__device__ __forceinline__ void a16_chunk(Q qh, S ks, S vs, uint32_t row, uint32_t hw,
                                          uint32_t nk, bool valid, float scale, float *m,
                                          float *l, float *acc)
{
    uint32_t lane = threadIdx.x % 32;
    float sc = -FLT_MAX;
    if (valid) {
        float d = 0.0f;
        for (uint32_t i = 0; i < hw; i++) {
            uint32_t k2 = ks[lane * row + i];
            d = d + qh[2 * i] * kv_lo(k2) + qh[2 * i + 1] * kv_hi(k2);
        }
        sc = d * scale;
    }
    float mn = warp_max(sc);
    mn = *m > mn ? *m : mn;
    float alpha = devio_expf(*m - mn), e = valid ? devio_expf(sc - mn) : 0.0f;
    *l = *l * alpha + warp_sum(e);
    *m = mn;
#pragma unroll
    for (uint32_t r = 0; r < 2 * P; r++)
        acc[r] = acc[r] * alpha;
    for (uint32_t j = 0; j < nk; j++) {
        float ej = __shfl_sync(FULL, e, (int)j);
#pragma unroll
        for (uint32_t r = 0; r < P; r++) {
            uint32_t p = lane + 32 * r;
            if (p < hw) {
                uint32_t v2 = vs[j * row + p];
                acc[2 * r] = acc[2 * r] + ej * kv_lo(v2);
                acc[2 * r + 1] = acc[2 * r + 1] + ej * kv_hi(v2);
            }
        }
    }
}

/* Block (token t, heads of group g, range s). Every thread stages the chunk's keys and values
 * (as pairs of 16-bit elements, rows padded by one word); warp w is one head: lane j scores key j, then the
 * running max, sum and output columns move on by the online softmax. Lane l holds the column
 * pairs l, l + 32, ... of the output. */
__global__ void __launch_bounds__(32 * A16_WARPS) k_attention16(cuda_kv kv, const float *q,
                                                                float scale, float *out,
                                                                float *part, uint32_t splits)
{
    DEVIO_DYN_SHARED(float, sm);
    uint32_t t = blockIdx.x, s = blockIdx.z, hd = kv.hd, hw = hd / 2, row = hw + 1;
    uint32_t nw = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint32_t G = kv.n_heads / kv.n_kv, per_g = (G + nw - 1) / nw;
    uint32_t g = blockIdx.y / per_g, hg = (blockIdx.y % per_g) * nw + w, h = g * G + hg;
    bool active = hg < G;
    uint32_t j0, n_keys = a16_keys(kv, kv.pos[t], &j0), per = a16_per(n_keys, splits);
    uint32_t k0 = s * per, k1 = k0 + per < n_keys ? k0 + per : n_keys;
    if (k0 >= k1)
        return; /* the whole block: this token has fewer ranges */
    const uint32_t *bt = kv.bt + kv.bt_off[t];
    const uint32_t *kw = reinterpret_cast<const uint32_t *>(kv.k16);
    const uint32_t *vw = reinterpret_cast<const uint32_t *>(kv.v16);
    auto qs = sm + w * hd;
    DEVIO_SHARED_VIEW(uint32_t, ks, sm, nw * hd);
    auto vs = ks + A16_KEYS * row;
    if (active)
        for (uint32_t i = lane; i < hd; i += 32)
            qs[i] = q[((size_t)t * kv.n_heads + h) * hd + i];
    float m = -FLT_MAX, l = 0.0f, acc[2 * A16_PAIRS];
#pragma unroll
    for (uint32_t r = 0; r < 2 * A16_PAIRS; r++)
        acc[r] = 0.0f;
    for (uint32_t c0 = k0; c0 < k1; c0 += A16_KEYS) {
        uint32_t nk = k1 - c0 < A16_KEYS ? k1 - c0 : A16_KEYS;
        __syncthreads(); /* the last chunk's readers are done */
        for (uint32_t idx = threadIdx.x; idx < nk * hw; idx += blockDim.x) {
            uint32_t j = idx / hw, i = idx % hw;
            size_t at = cuda_kv_slot(&kv, bt, j0 + c0 + j, g) / 2 + i;
            ks[j * row + i] = kw[at];
            vs[j * row + i] = vw[at];
        }
        __syncthreads();
        if (active)
            a16_chunk<A16_PAIRS>(qs, ks, vs, row, hw, nk, lane < nk, scale, &m, &l, acc);
    }
    if (!active)
        return;
    float *o = splits == 1 ? out + ((size_t)t * kv.n_heads + h) * hd
                           : part + (((size_t)t * kv.n_heads + h) * splits + s) * (hd + 2);
    if (splits > 1) {
        if (lane == 0) {
            o[0] = m;
            o[1] = l;
        }
        o += 2;
    }
#pragma unroll
    for (uint32_t r = 0; r < A16_PAIRS; r++) {
        uint32_t p = lane + 32 * r;
        if (p < hw) {
            o[2 * p] = splits == 1 ? acc[2 * r] / l : acc[2 * r];
            o[2 * p + 1] = splits == 1 ? acc[2 * r + 1] / l : acc[2 * r + 1];
        }
    }
}

/* Block (token t, head h): the token's ranges, each [m, l, sums over hd], brought to their
 * common max and added in range order. */
__global__ void k_attention16_combine(cuda_kv kv, const float *part, uint32_t splits, float *out)
{
    uint32_t t = blockIdx.x, h = blockIdx.y, hd = kv.hd;
    uint32_t j0, n_keys = a16_keys(kv, kv.pos[t], &j0), per = a16_per(n_keys, splits);
    uint32_t used = (n_keys + per - 1) / per;
    const float *pt = part + ((size_t)t * kv.n_heads + h) * splits * (hd + 2);
    float M = -FLT_MAX, L = 0.0f;
    for (uint32_t s = 0; s < used; s++)
        M = pt[s * (hd + 2)] > M ? pt[s * (hd + 2)] : M;
    for (uint32_t s = 0; s < used; s++)
        L = L + pt[s * (hd + 2) + 1] * devio_expf(pt[s * (hd + 2)] - M);
    for (uint32_t c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0.0f;
        for (uint32_t s = 0; s < used; s++) {
            const float *rng = pt + s * (hd + 2);
            o = o + rng[2 + c] * devio_expf(rng[0] - M);
        }
        out[((size_t)t * kv.n_heads + h) * hd + c] = o / L;
    }
}

/* Block (tile x: tokens x * A16_QTILE .. + A16_QTILE of the step, heads of group g), for
 * prefill. The tile's tokens are taken in runs that share a block table (one row's); a run's
 * keys, from the lowest any of its tokens reads to the highest, are staged a chunk at a time
 * once for all of them, and warp w (head hg) moves each token's online softmax on over the
 * chunk as k_attention16 does, keys outside the token's own range scoring nothing: the K and
 * V reads of a row fall by up to A16_QTILE times. The query is read where it lies (every lane
 * the same address). P: the column pairs a lane holds, hd <= 64 P (registers follow hd). */
template <uint32_t P>
__global__ void __launch_bounds__(32 * A16_WARPS) k_attention16_tiled(cuda_kv kv, const float *q,
                                                                      float scale, float *out,
                                                                      uint32_t n_tok)
{
    DEVIO_DYN_SHARED(uint32_t, ks);
    uint32_t hd = kv.hd, hw = hd / 2, row = hw + 1;
    uint32_t nw = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint32_t G = kv.n_heads / kv.n_kv, per_g = (G + nw - 1) / nw;
    uint32_t g = blockIdx.y / per_g, hg = (blockIdx.y % per_g) * nw + w, h = g * G + hg;
    bool active = hg < G;
    uint32_t t_end = (blockIdx.x + 1) * A16_QTILE < n_tok ? (blockIdx.x + 1) * A16_QTILE : n_tok;
    const uint32_t *kw = reinterpret_cast<const uint32_t *>(kv.k16);
    const uint32_t *vw = reinterpret_cast<const uint32_t *>(kv.v16);
    auto vs = ks + A16_KEYS * row;
    for (uint32_t ta = blockIdx.x * A16_QTILE, tb; ta < t_end; ta = tb) {
        uint32_t off = kv.bt_off[ta], lo = UINT32_MAX, hi = 0;
        for (tb = ta + 1; tb < t_end && kv.bt_off[tb] == off;)
            tb++;
        uint32_t nq = tb - ta, j0[A16_QTILE], j1[A16_QTILE];
        float m[A16_QTILE], l[A16_QTILE], acc[A16_QTILE][2 * P];
#pragma unroll
        for (uint32_t u = 0; u < A16_QTILE; u++) {
            j0[u] = j1[u] = 0;
            if (u < nq) {
                uint32_t n_keys = a16_keys(kv, kv.pos[ta + u], &j0[u]);
                j1[u] = j0[u] + n_keys;
                lo = j0[u] < lo ? j0[u] : lo;
                hi = j1[u] > hi ? j1[u] : hi;
            }
            m[u] = -FLT_MAX;
            l[u] = 0.0f;
#pragma unroll
            for (uint32_t r = 0; r < 2 * P; r++)
                acc[u][r] = 0.0f;
        }
        const uint32_t *bt = kv.bt + off;
        for (uint32_t c0 = lo; c0 < hi; c0 += A16_KEYS) {
            uint32_t nk = hi - c0 < A16_KEYS ? hi - c0 : A16_KEYS;
            __syncthreads(); /* the last chunk's readers are done */
            for (uint32_t idx = threadIdx.x; idx < nk * hw; idx += blockDim.x) {
                uint32_t j = idx / hw, i = idx % hw;
                size_t at = cuda_kv_slot(&kv, bt, c0 + j, g) / 2 + i;
                ks[j * row + i] = kw[at];
                vs[j * row + i] = vw[at];
            }
            __syncthreads();
            if (!active)
                continue;
#pragma unroll
            for (uint32_t u = 0; u < A16_QTILE; u++) {
                if (u >= nq || c0 >= j1[u] || c0 + nk <= j0[u])
                    continue; /* the whole warp: no key of this chunk is the token's */
                const float *qh = q + ((size_t)(ta + u) * kv.n_heads + h) * hd;
                bool valid = lane < nk && c0 + lane >= j0[u] && c0 + lane < j1[u];
                a16_chunk<P>(qh, ks, vs, row, hw, nk, valid, scale, &m[u], &l[u], acc[u]);
            }
        }
        if (!active)
            continue;
#pragma unroll
        for (uint32_t u = 0; u < A16_QTILE; u++) {
            if (u >= nq)
                continue;
            float *o = out + ((size_t)(ta + u) * kv.n_heads + h) * hd;
#pragma unroll
            for (uint32_t r = 0; r < P; r++) {
                uint32_t p = lane + 32 * r;
                if (p < hw) {
                    o[2 * p] = acc[u][2 * r] / l[u];
                    o[2 * p + 1] = acc[u][2 * r + 1] / l[u];
                }
            }
        }
    }
}

uint32_t cuda_attn16_splits(uint32_t n_tok, uint32_t max_keys)
{
    if (n_tok == 0 || n_tok > CUDA_ATTN16_PART_ROWS / 2)
        return 1;
    uint32_t z = (max_keys + A16_SPLIT_MIN - 1) / A16_SPLIT_MIN, cap = CUDA_ATTN16_PART_ROWS / n_tok;
    z = z < cap ? z : cap;
    z = z < 32 ? z : 32;
    return z ? z : 1;
}

int cuda_attention16(const cuda_kv *kv, const float *q, float scale, float *out, uint32_t n_tok,
                     uint32_t splits, float *part, void *stream)
{
    if (n_tok == 0)
        return 0;
    uint32_t G = kv->n_heads / kv->n_kv, nw = G < A16_WARPS ? G : A16_WARPS;
    uint32_t per_g = (G + nw - 1) / nw;
    size_t smem = ((size_t)nw * kv->hd + 2u * A16_KEYS * (kv->hd / 2 + 1)) * sizeof(float);
    dim3 grid(n_tok, kv->n_kv * per_g, splits);
    cudaStream_t st = (cudaStream_t)stream;
    LAUNCH((k_attention16), grid, 32 * nw, smem, st, *kv, q, scale, out, part, splits);
    if (splits > 1 && cudaPeekAtLastError() == cudaSuccess)
        LAUNCH((k_attention16_combine), dim3(n_tok, kv->n_heads), 64, 0, st, *kv, part, splits,
               out);
    return cuda_launched();
}

bool cuda_attn16_tiled(uint32_t n_tok, uint32_t n_rows, uint32_t splits)
{
    return splits == 1 && n_tok >= CUDA_ATTN16_TILE_ROW_TOKENS * (n_rows ? n_rows : 1);
}

int cuda_attention16_tiled(const cuda_kv *kv, const float *q, float scale, float *out,
                           uint32_t n_tok, void *stream)
{
    if (n_tok == 0)
        return 0;
    uint32_t G = kv->n_heads / kv->n_kv, nw = G < A16_WARPS ? G : A16_WARPS;
    uint32_t per_g = (G + nw - 1) / nw;
    size_t smem = 2u * A16_KEYS * (kv->hd / 2 + 1) * sizeof(uint32_t);
    dim3 grid((n_tok + A16_QTILE - 1) / A16_QTILE, kv->n_kv * per_g);
    cudaStream_t st = (cudaStream_t)stream;
    if (kv->hd <= 64)
        LAUNCH((k_attention16_tiled<1>), grid, 32 * nw, smem, st, *kv, q, scale, out, n_tok);
    else if (kv->hd <= 128)
        LAUNCH((k_attention16_tiled<2>), grid, 32 * nw, smem, st, *kv, q, scale, out, n_tok);
    else
        LAUNCH((k_attention16_tiled<A16_PAIRS>), grid, 32 * nw, smem, st, *kv, q, scale, out,
               n_tok);
    return cuda_launched();
}
