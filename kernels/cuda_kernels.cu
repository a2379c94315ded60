/* cuda_kernels.cu - the kernels of cuda_kernels.h: device/numerics/numspec.h on a GPU.
 * The definition's 32 lanes are a warp's 32 threads: lane l accumulates the
 * terms l, l+32, ... in order, and fold() (kernels/cuda_warp.cuh) is its
 * xor-shuffle tree, so every reduction gives the reference's bits. Every
 * float operation is one of numerics.h's DEVIO_ADD/SUB/MUL/DIV (the _rn
 * intrinsics, never contracted into FMA); the build adds -fmad=false as
 * well. It must never use a CUDA math function (expf, rsqrtf, ...):
 * numerics.h has the only ones allowed. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_warp.cuh"

#define WARPS 8 /* warps per block in the one-warp-per-output kernels */
#define TILE 8  /* token rows a warp's lanes hold partial sums for at once */
#define KEYS 4  /* keys whose scores attention computes at once */

/* ggml's number of a quantized dtype (device/numerics/quant.h), 0 for the others. */
__host__ __device__ constexpr uint32_t ggml_type(int dt)
{
    return dt == CUDA_Q8_0 ? (uint32_t)DEVIO_QT_Q8_0 : dt == CUDA_Q4_0 ? (uint32_t)DEVIO_QT_Q4_0
         : dt == CUDA_Q4_1 ? (uint32_t)DEVIO_QT_Q4_1 : dt == CUDA_Q5_0 ? (uint32_t)DEVIO_QT_Q5_0
         : dt == CUDA_Q5_1 ? (uint32_t)DEVIO_QT_Q5_1 : dt == CUDA_Q4_K ? (uint32_t)DEVIO_QT_Q4_K
         : dt == CUDA_Q5_K ? (uint32_t)DEVIO_QT_Q5_K : dt == CUDA_Q6_K ? (uint32_t)DEVIO_QT_Q6_K
         : 0u;
}

/* Element i of a weight of dtype DT, widened exactly to f32. A quantized
 * weight's rows are whole blocks, so element i of the whole tensor is
 * element i % blk of block i / blk. */
template <int DT>
__device__ __forceinline__ float ld(const void *p, size_t i)
{
    if (DT == CUDA_F32)
        return static_cast<const float *>(p)[i];
    if (ggml_type(DT)) {
        constexpr uint32_t G = ggml_type(DT);
        const uint32_t blk = devio_quant_block(G);
        const uint8_t *b = static_cast<const uint8_t *>(p) + (i / blk) * devio_quant_block_bytes(G);
        return devio_quant_elem(G, b, (uint32_t)(i % blk));
    }
    uint16_t h = static_cast<const uint16_t *>(p)[i];
    return DT == CUDA_F16 ? devio_f16_to_f32(h) : devio_bf16_to_f32(h);
}

/* fn<DT>(args...) for the dtype dt names: the one switch over dtypes. */
#define DTYPE_SWITCH(dt, fn, ...)                                                              \
    switch (dt) {                                                                              \
    case CUDA_F32: fn<CUDA_F32>(__VA_ARGS__); break;                                           \
    case CUDA_F16: fn<CUDA_F16>(__VA_ARGS__); break;                                           \
    case CUDA_BF16: fn<CUDA_BF16>(__VA_ARGS__); break;                                         \
    case CUDA_Q8_0: fn<CUDA_Q8_0>(__VA_ARGS__); break;                                         \
    case CUDA_Q4_0: fn<CUDA_Q4_0>(__VA_ARGS__); break;                                         \
    case CUDA_Q4_1: fn<CUDA_Q4_1>(__VA_ARGS__); break;                                         \
    case CUDA_Q5_0: fn<CUDA_Q5_0>(__VA_ARGS__); break;                                         \
    case CUDA_Q5_1: fn<CUDA_Q5_1>(__VA_ARGS__); break;                                         \
    case CUDA_Q4_K: fn<CUDA_Q4_K>(__VA_ARGS__); break;                                         \
    case CUDA_Q5_K: fn<CUDA_Q5_K>(__VA_ARGS__); break;                                         \
    case CUDA_Q6_K: fn<CUDA_Q6_K>(__VA_ARGS__); break;                                         \
    }

/* ---- rule 1: embedding -------------------------------------------------- */

/* Granite's embedding_multiplier: one rounded multiply, and none at all
 * when it is 1 (the reference's branch; x * 1 is x anyway). */
template <int DT>
__global__ void k_embed(const void *embed, int lane_major, uint32_t d, const int32_t *tokens,
                        float mult, float *x)
{
    uint32_t t = blockIdx.y;
    size_t row = (size_t)(uint32_t)tokens[t] * d;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < d; i += gridDim.x * blockDim.x) {
        float e = ld<DT>(embed, row + (lane_major ? cuda_lane_pos(i, d, DT) : i));
        x[(size_t)t * d + i] = mult != 1.0f ? DEVIO_MUL(e, mult) : e;
    }
}

template <int DT>
static void embed_dt(dim3 grid, cudaStream_t s, const void *embed, int lane_major, uint32_t d,
                     const int32_t *tokens, float mult, float *x)
{
    LAUNCH((k_embed<DT>), grid, 256, 0, s, embed, lane_major, d, tokens, mult, x);
}

int cuda_embed(const void *embed, int dtype, int lane_major, uint32_t d, const int32_t *tokens,
               uint32_t n_tok, float mult, float *x, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid(cuda_blocks_for(d, 256), n_tok);
    DTYPE_SWITCH(dtype, embed_dt, grid, s, embed, lane_major, d, tokens, mult, x);
    return cuda_launched();
}

/* ---- rule 2: rmsnorm, one warp per token --------------------------------- */

/* In place (y == x) as well: lane l reads xr[i] and writes y[i] for the same
 * i = l, l + 32, ... only, so no lane reads what another wrote. Rule 4a
 * (Qwen3's q_norm and k_norm) is this kernel over head rows of hd floats. */

/* A block per token: its threads load the row into shared memory, all
 * loads in flight at once (a lone warp waiting on each load in turn made
 * this the largest kernel of a decode step); warp 0 sums the squares out of
 * shared memory by the lane rule (lane l adds l, l + 32, ... in order) and
 * leaves r there; then every thread scales its elements. y may be x: the
 * row is in shared memory before the first element is written. */
#define NORM_THREADS 256
#define NORM_U 8
__global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(const float *x, const float *w,
                                                          float *y, uint32_t d, float eps,
                                                          uint16_t *y16, int bf16)
{
    DEVIO_DYN_SHARED(float, sm); /* d floats, then r */
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = y + (size_t)blockIdx.x * d;
    uint16_t *y16r = y16 ? y16 + (size_t)blockIdx.x * d : NULL;
    uint32_t step = blockDim.x;
    for (uint32_t i0 = threadIdx.x; i0 < d; i0 += step * NORM_U) {
        float v[NORM_U];
#pragma unroll
        for (int u = 0; u < NORM_U; u++)
            if (i0 + step * u < d)
                v[u] = xr[i0 + step * u];
#pragma unroll
        for (int u = 0; u < NORM_U; u++)
            if (i0 + step * u < d)
                sm[i0 + step * u] = v[u];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float p = 0.0f;
        for (uint32_t i = threadIdx.x; i < d; i += 32)
            p = DEVIO_ADD(p, DEVIO_MUL(sm[i], sm[i]));
        float ss = fold(p);
        if (threadIdx.x == 0)
            sm[d] = devio_rsqrtf(DEVIO_ADD(DEVIO_DIV(ss, (float)d), eps));
    }
    __syncthreads();
    float r = sm[d];
    for (uint32_t i0 = threadIdx.x; i0 < d; i0 += step * NORM_U) {
        float g[NORM_U];
#pragma unroll
        for (int u = 0; u < NORM_U; u++)
            if (i0 + step * u < d)
                g[u] = w[i0 + step * u];
#pragma unroll
        for (int u = 0; u < NORM_U; u++)
            if (i0 + step * u < d) {
                float v = DEVIO_MUL(g[u], DEVIO_MUL(sm[i0 + step * u], r));
                yr[i0 + step * u] = v;
                if (y16r)
                    y16r[i0 + step * u] = bf16 ? devio_f32_to_bf16_rne(v)
                                               : devio_f32_to_f16_rne(v);
            }
    }
}

static uint32_t norm_smem(uint32_t d)
{
    return (d + 1) * (uint32_t)sizeof(float);
}

int cuda_rmsnorm_prepare(uint32_t max_d)
{
    return (int)cudaFuncSetAttribute(k_rmsnorm, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)norm_smem(max_d));
}

int cuda_rmsnorm16(const float *x, const float *w, float *y, void *y16, int dtype16, uint32_t d,
                   float eps, uint32_t n_tok, void *stream)
{
    if (n_tok == 0)
        return 0;
    uint32_t threads = d < NORM_THREADS ? (d + 31u) & ~31u : NORM_THREADS;
    LAUNCH((k_rmsnorm), n_tok, threads, norm_smem(d), (cudaStream_t)stream, x, w, y, d, eps,
           (uint16_t *)y16, dtype16 == CUDA_BF16);
    return cuda_launched();
}

int cuda_rmsnorm(const float *x, const float *w, float *y, uint32_t d, float eps, uint32_t n_tok,
                 void *stream)
{
    return cuda_rmsnorm16(x, w, y, NULL, CUDA_F32, d, eps, n_tok, stream);
}

/* ---- rule 3: projections, one warp per output row ------------------------ */

/* Warp o of the grid computes output row o for every token: its lanes read
 * the weight row once per TILE tokens (the row stays in L1 between tiles)
 * and hold TILE partial sums each; a step of up to TILE tokens reads each
 * weight exactly once. A lane's terms are i = lane, lane + 32, ... in order,
 * as the definition says. A lane-major row (cuda_kernels.h) is read in
 * whole chunks first, CHUNKS of them loaded (16 bytes per lane each) before
 * any is added, so that a warp keeps 2 KiB in flight (8 chunks, 4 KiB,
 * measured slower on the H200: docs/gpu-check.md); then the elements past
 * the last chunk, or a row that is not lane-major, UNROLL terms loaded at a
 * time. Either way lane l adds l, l + 32, l + 64, ... in increasing order. */
#define UNROLL 8
#define CHUNKS 4

/* Every token of the tile adds N more of its lane's terms, w[u] * x[i0 + 32 u]
 * (and w2[u] times the same into acc2 when TWO) in u order: the lane rule's
 * order, whichever path loaded the weights. */
template <int N, bool TWO>
__device__ __forceinline__ void add_terms(const float *w, const float *w2, const float *x,
                                          uint32_t ldx, size_t i0, uint32_t nt, float *acc,
                                          float *acc2)
{
#pragma unroll
    for (int tt = 0; tt < TILE; tt++) {
        if ((uint32_t)tt >= nt)
            break;
        const float *xt = x + (size_t)tt * ldx + i0;
        float xv[N];
#pragma unroll
        for (int u = 0; u < N; u++)
            xv[u] = xt[32 * u];
#pragma unroll
        for (int u = 0; u < N; u++) {
            acc[tt] = DEVIO_ADD(acc[tt], DEVIO_MUL(w[u], xv[u]));
            if (TWO)
                acc2[tt] = DEVIO_ADD(acc2[tt], DEVIO_MUL(w2[u], xv[u]));
        }
    }
}

template <int DT, int EPI>
__global__ void __launch_bounds__(32 * WARPS) k_project(cuda_matvec mv)
{
    constexpr uint32_t V = DT == CUDA_F32 ? 4 : 8, C = 32 * V, ES = DT == CUDA_F32 ? 4 : 2;
    uint32_t lane = threadIdx.x & 31u, o = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (o >= mv.m)
        return;
    constexpr bool two = EPI == CUDA_EPI_SILU_MUL;
    size_t row = (size_t)o * mv.n;
    uint32_t nfull = cuda_lane_major(mv.n, DT) ? mv.n / C : 0;
    const char *wrow = static_cast<const char *>(mv.w) + row * ES;
    const char *w2row = two ? static_cast<const char *>(mv.w2) + row * ES : wrow;
    for (uint32_t t0 = 0; t0 < mv.n_tok; t0 += TILE) {
        uint32_t nt = mv.n_tok - t0 < TILE ? mv.n_tok - t0 : TILE;
        float acc[TILE], acc2[TILE];
#pragma unroll
        for (int tt = 0; tt < TILE; tt++)
            acc[tt] = acc2[tt] = 0.0f;
        const float *x = mv.x + (size_t)t0 * mv.ldx;
        for (uint32_t c = 0; c < nfull; c += CHUNKS) {
            uint4 q[CHUNKS], q2[CHUNKS];
#pragma unroll
            for (int k = 0; k < CHUNKS; k++) {
                size_t at = ((size_t)(c + k) * C + lane * V) * ES;
                if (c + k < nfull) {
                    q[k] = ld16(wrow + at);
                    q2[k] = two ? ld16(w2row + at) : q[k];
                }
            }
#pragma unroll
            for (int k = 0; k < CHUNKS; k++) {
                if (c + k >= nfull)
                    break;
                float w[V], w2[V];
                widen16<DT>(q[k], w);
                if (two)
                    widen16<DT>(q2[k], w2);
                add_terms<V, two>(w, w2, x, mv.ldx, (size_t)(c + k) * C + lane, nt, acc, acc2);
            }
        }
        uint32_t i = nfull * C + lane;
        for (; i + 32 * (UNROLL - 1) < mv.n; i += 32 * UNROLL) {
            float w[UNROLL], w2[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                w[u] = ld<DT>(mv.w, row + i + 32 * u);
                w2[u] = two ? ld<DT>(mv.w2, row + i + 32 * u) : 0.0f;
            }
            add_terms<UNROLL, two>(w, w2, x, mv.ldx, i, nt, acc, acc2);
        }
        for (; i < mv.n; i += 32) {
            float w[1] = {ld<DT>(mv.w, row + i)};
            float w2[1] = {two ? ld<DT>(mv.w2, row + i) : 0.0f};
            add_terms<1, two>(w, w2, x, mv.ldx, i, nt, acc, acc2);
        }
#pragma unroll
        for (int tt = 0; tt < TILE; tt++) {
            if ((uint32_t)tt >= nt)
                break; /* nt is the same in every lane */
            float dot = fold(acc[tt]);
            float up = two ? fold(acc2[tt]) : 0.0f;
            if (lane != 0)
                continue;
            float *y = mv.y + (size_t)(t0 + tt) * mv.ldy + o;
            if (EPI == CUDA_EPI_STORE)
                *y = dot;
            else if (EPI == CUDA_EPI_BIAS)
                *y = DEVIO_ADD(dot, mv.bias[o]);
            else if (EPI == CUDA_EPI_ADD)
                *y = DEVIO_ADD(*y, dot);
            else if (EPI == CUDA_EPI_ADD_SCALED)
                *y = DEVIO_ADD(*y, DEVIO_MUL(dot, mv.scale));
            else if (EPI == CUDA_EPI_DIV)
                *y = DEVIO_DIV(dot, mv.scale);
            else
                *y = DEVIO_MUL(devio_siluf(dot), up);
        }
    }
}

template <int DT>
static void project_dt(const cuda_matvec *mv, cudaStream_t s)
{
    uint32_t grid = cuda_blocks_for(mv->m, WARPS), threads = 32 * WARPS;
    switch (mv->epi) {
    case CUDA_EPI_STORE: LAUNCH((k_project<DT, CUDA_EPI_STORE>), grid, threads, 0, s, *mv); break;
    case CUDA_EPI_BIAS: LAUNCH((k_project<DT, CUDA_EPI_BIAS>), grid, threads, 0, s, *mv); break;
    case CUDA_EPI_ADD: LAUNCH((k_project<DT, CUDA_EPI_ADD>), grid, threads, 0, s, *mv); break;
    case CUDA_EPI_SILU_MUL:
        LAUNCH((k_project<DT, CUDA_EPI_SILU_MUL>), grid, threads, 0, s, *mv);
        break;
    case CUDA_EPI_ADD_SCALED:
        LAUNCH((k_project<DT, CUDA_EPI_ADD_SCALED>), grid, threads, 0, s, *mv);
        break;
    case CUDA_EPI_DIV: LAUNCH((k_project<DT, CUDA_EPI_DIV>), grid, threads, 0, s, *mv); break;
    }
}

int cuda_project(const cuda_matvec *mv, void *stream)
{
    if (mv->n_tok == 0 || mv->m == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    DTYPE_SWITCH(mv->dtype, project_dt, mv, s);
    return cuda_launched();
}

/* ---- rules 4 and 5: RoPE, then K and V into their slots ------------------ */

__device__ __forceinline__ size_t kv_slot(const cuda_kv &kv, const uint32_t *bt, uint32_t pos,
                                          uint32_t g)
{
    return cuda_kv_slot(&kv, bt, pos, g);
}

/* Rule 4 on n_heads heads of hd floats at x, turning dimensions [0, rd) of
 * each head; [rd, hd) stay as they are. c and sn are the position's table
 * rows, rd / 2 each. */
__device__ __forceinline__ void rope_heads(float *x, uint32_t n_heads, uint32_t hd, uint32_t rd,
                                           const float *c, const float *sn)
{
    uint32_t half = rd / 2;
    for (uint32_t idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        float *p = x + (size_t)(idx / half) * hd;
        uint32_t i = idx % half;
        float a = p[i], b = p[i + half];
        p[i] = DEVIO_SUB(DEVIO_MUL(a, c[i]), DEVIO_MUL(b, sn[i]));
        p[i + half] = DEVIO_ADD(DEVIO_MUL(b, c[i]), DEVIO_MUL(a, sn[i]));
    }
}

__global__ void k_rope_store(cuda_kv kv, float *q, float *k, const float *v, const float *cos_t,
                             const float *sin_t)
{
    uint32_t t = blockIdx.x, pos = kv.pos[t], hd = kv.hd, rd = kv.rd, kv_dim = kv.n_kv * hd;
    const float *c = cos_t + (size_t)pos * (rd / 2), *sn = sin_t + (size_t)pos * (rd / 2);
    if (rd >= 2) {
        rope_heads(q + (size_t)t * kv.n_heads * hd, kv.n_heads, hd, rd, c, sn);
        rope_heads(k + (size_t)t * kv_dim, kv.n_kv, hd, rd, c, sn);
    }
    __syncthreads();
    const uint32_t *bt = kv.bt + kv.bt_off[t];
    for (uint32_t idx = threadIdx.x; idx < kv_dim; idx += blockDim.x) {
        size_t slot = kv_slot(kv, bt, pos, idx / hd) + idx % hd;
        float kx = k[(size_t)t * kv_dim + idx], vx = v[(size_t)t * kv_dim + idx];
        if (kv.k16) {
            kv.k16[slot] = kv16_store(kx);
            kv.v16[slot] = kv16_store(vx);
        } else {
            kv.k[slot] = kx;
            kv.v[slot] = vx;
        }
    }
}

/* A block per token, wide enough that a decode token's heads (n_heads *
 * rd / 2 pairs, 1024 on a 2048-wide model) take two rounds, not eight. */
#define ROPE_THREADS 512
int cuda_rope_store(const cuda_kv *kv, float *q, float *k, const float *v, const float *cos_t,
                    const float *sin_t, uint32_t n_tok, void *stream)
{
    if (n_tok == 0)
        return 0;
    LAUNCH((k_rope_store), n_tok, ROPE_THREADS, 0, (cudaStream_t)stream, *kv, q, k, v, cos_t, sin_t);
    return cuda_launched();
}

/* ---- rule 6: attention, one warp per (token, head) ----------------------- */

/* Shared memory: the query head (hd rounded up to 32) then one score per key. */
uint32_t cuda_attention_smem(uint32_t max_keys, uint32_t hd)
{
    return (((hd + 31u) & ~31u) + max_keys) * (uint32_t)sizeof(float);
}

/* Keys are the absolute positions j = j0 .. pos (j0 > 0 only with a
 * sliding window); key j's score sits at sc[j - j0]. The sums of e_j and
 * e_j * v_j run in lane j mod 32 of the ABSOLUTE index, as the definition
 * says: lane l takes k = (l - j0) mod 32, then every 32nd. */
__global__ void __launch_bounds__(32) k_attention(cuda_kv kv, const float *q, float scale,
                                                  float *out)
{
    DEVIO_DYN_SHARED(float, sm);
    uint32_t t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, hd = kv.hd;
    uint32_t pos = kv.pos[t], g = h / (kv.n_heads / kv.n_kv);
    uint32_t j0 = kv.window && pos + 1 > kv.window ? pos + 1 - kv.window : 0;
    uint32_t n_keys = pos + 1 - j0, k1 = (lane - j0) & 31u;
    const uint32_t *bt = kv.bt + kv.bt_off[t];
    auto qs = sm + 0, sc = sm + ((hd + 31u) & ~31u);
    const float *qt = q + ((size_t)t * kv.n_heads + h) * hd;
    for (uint32_t i = lane; i < hd; i += 32)
        qs[i] = qt[i];
    __syncwarp();

    /* s_j = lane_dot(q, k_j, hd) * scale: the warp's lanes are the lanes of
     * each key's dot product. KEYS keys at a time, their rows loaded before
     * any is reduced, so that the loads overlap. */
    uint32_t k = 0;
    for (; k + KEYS <= n_keys; k += KEYS) {
        const float *kr[KEYS];
        float p[KEYS];
#pragma unroll
        for (int u = 0; u < KEYS; u++) {
            kr[u] = kv.k + kv_slot(kv, bt, j0 + k + u, g);
            p[u] = 0.0f;
        }
        for (uint32_t i = lane; i < hd; i += 32) {
            float kx[KEYS];
#pragma unroll
            for (int u = 0; u < KEYS; u++)
                kx[u] = kr[u][i];
#pragma unroll
            for (int u = 0; u < KEYS; u++)
                p[u] = DEVIO_ADD(p[u], DEVIO_MUL(qs[i], kx[u]));
        }
#pragma unroll
        for (int u = 0; u < KEYS; u++) {
            float d = fold(p[u]);
            if (lane == 0)
                sc[k + u] = DEVIO_MUL(d, scale);
        }
    }
    for (; k < n_keys; k++) {
        const float *kr = kv.k + kv_slot(kv, bt, j0 + k, g);
        float p = 0.0f;
        for (uint32_t i = lane; i < hd; i += 32)
            p = DEVIO_ADD(p, DEVIO_MUL(qs[i], kr[i]));
        p = fold(p);
        if (lane == 0)
            sc[k] = DEVIO_MUL(p, scale);
    }
    __syncwarp();

    /* m: the first largest score (what the definition's running max from
     * s_j0 keeps); each lane scans some keys, then the lanes' candidates
     * meet, the larger value winning and the lower key breaking ties. */
    float m = 0.0f;
    int32_t km = -1;
    for (uint32_t k = lane; k < n_keys; k += 32)
        if (km < 0 || sc[k] > m) {
            m = sc[k];
            km = (int32_t)k;
        }
#pragma unroll
    for (int w = 16; w >= 1; w >>= 1) {
        float m2 = __shfl_xor_sync(FULL, m, w);
        int32_t k2 = __shfl_xor_sync(FULL, km, w);
        bool take = k2 >= 0 && (km < 0 || m2 > m || (!(m > m2) && k2 < km));
        if (take) {
            m = m2;
            km = k2;
        }
    }
    m = __shfl_sync(FULL, m, 0);
    __syncwarp();

    /* e_j = expf(s_j - m) and Z = lane_sum of e_j, lane = j mod 32. */
    float z = 0.0f;
    for (uint32_t k = k1; k < n_keys; k += 32) {
        float e = devio_expf(DEVIO_SUB(sc[k], m));
        sc[k] = e;
        z = DEVIO_ADD(z, e);
    }
    z = fold_all(z);
    __syncwarp();

    /* o[c] = (lane_sum over j of e_j * v_j[c]) / Z, 32 columns at a time:
     * lane l holds the partial sums of its keys for each column. */
    float *o = out + ((size_t)t * kv.n_heads + h) * hd;
    for (uint32_t c0 = 0; c0 < hd; c0 += 32) {
        float acc[32];
#pragma unroll
        for (int cc = 0; cc < 32; cc++)
            acc[cc] = 0.0f;
        for (uint32_t k = k1; k < n_keys; k += 32) {
            const float *vr = kv.v + kv_slot(kv, bt, j0 + k, g) + c0;
            float e = sc[k];
#pragma unroll
            for (int cc = 0; cc < 32; cc++)
                if (c0 + cc < hd)
                    acc[cc] = DEVIO_ADD(acc[cc], DEVIO_MUL(e, vr[cc]));
        }
        float mine = 0.0f;
#pragma unroll
        for (int cc = 0; cc < 32; cc++) {
            float r = fold_all(acc[cc]);
            if (lane == (uint32_t)cc)
                mine = r;
        }
        if (c0 + lane < hd)
            o[c0 + lane] = DEVIO_DIV(mine, z);
    }
}

int cuda_attention_prepare(uint32_t smem_bytes)
{
    return (int)cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem_bytes);
}

int cuda_attention(const cuda_kv *kv, const float *q, float scale, float *out, uint32_t n_tok,
                   uint32_t smem_bytes, void *stream)
{
    if (n_tok == 0)
        return 0;
    dim3 grid(n_tok, kv->n_heads);
    LAUNCH((k_attention), grid, 32, smem_bytes, (cudaStream_t)stream, *kv, q, scale, out);
    return cuda_launched();
}

/* ---- rule 3a: LoRA ------------------------------------------------------- */

__global__ void k_lora_a(const cuda_lora_mod *mods, uint32_t per_slot, uint32_t idx,
                         const int32_t *tok_slot, const float *x, uint32_t ldx, uint32_t max_rank,
                         float *a_buf)
{
    uint32_t t = blockIdx.x, lane = threadIdx.x & 31u;
    uint32_t j = blockIdx.y * WARPS + (threadIdx.x >> 5);
    int32_t slot = tok_slot[t];
    if (slot < 0)
        return;
    const cuda_lora_mod *md = &mods[(size_t)slot * per_slot + idx];
    if (!md->a || j >= md->rank)
        return;
    const float *ar = md->a + (size_t)j * md->in, *xt = x + (size_t)t * ldx;
    float p = 0.0f;
    for (uint32_t i = lane; i < md->in; i += 32)
        p = DEVIO_ADD(p, DEVIO_MUL(ar[i], xt[i]));
    p = fold(p);
    if (lane == 0)
        a_buf[(size_t)t * max_rank + j] = p;
}

__global__ void k_lora_b(const cuda_lora_mod *mods, uint32_t per_slot, uint32_t idx,
                         const int32_t *tok_slot, uint32_t max_rank, const float *a_buf, float *y,
                         uint32_t ldy)
{
    uint32_t t = blockIdx.x, lane = threadIdx.x & 31u;
    uint32_t o = blockIdx.y * WARPS + (threadIdx.x >> 5);
    int32_t slot = tok_slot[t];
    if (slot < 0)
        return;
    const cuda_lora_mod *md = &mods[(size_t)slot * per_slot + idx];
    if (!md->a || o >= md->out)
        return;
    const float *br = md->b + (size_t)o * md->rank, *at = a_buf + (size_t)t * max_rank;
    float p = 0.0f;
    for (uint32_t i = lane; i < md->rank; i += 32)
        p = DEVIO_ADD(p, DEVIO_MUL(br[i], at[i]));
    p = fold(p);
    if (lane == 0) {
        float *yo = y + (size_t)t * ldy + o;
        *yo = DEVIO_ADD(*yo, DEVIO_MUL(p, md->scale));
    }
}

int cuda_lora(const cuda_lora_mod *mods, uint32_t mods_per_slot, uint32_t mod_index,
              const int32_t *tok_slot, const float *x, uint32_t ldx, float *y, uint32_t ldy,
              uint32_t n_tok, uint32_t max_rank, uint32_t max_out, float *a_buf, void *stream)
{
    if (n_tok == 0 || max_rank == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    dim3 ga(n_tok, cuda_blocks_for(max_rank, WARPS)), gb(n_tok, cuda_blocks_for(max_out, WARPS));
    LAUNCH((k_lora_a), ga, 32 * WARPS, 0, s, mods, mods_per_slot, mod_index, tok_slot, x, ldx,
           max_rank, a_buf);
    LAUNCH((k_lora_b), gb, 32 * WARPS, 0, s, mods, mods_per_slot, mod_index, tok_slot, max_rank,
           a_buf, y, ldy);
    return cuda_launched();
}

/* ---- element-wise -------------------------------------------------------- */

/* The residual add; Granite's x + y * r (product rounded, then added) only
 * when r != 1, as the reference branches (y * 1 is y anyway). */
__global__ void k_add(float *x, const float *y, float r, uint64_t n)
{
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        x[i] = DEVIO_ADD(x[i], r != 1.0f ? DEVIO_MUL(y[i], r) : y[i]);
}

int cuda_add(float *x, const float *y, float r, uint32_t n, uint32_t n_tok, void *stream)
{
    uint64_t total = (uint64_t)n * n_tok;
    if (total == 0)
        return 0;
    uint32_t grid = cuda_blocks_for(total, 256) < 65535 ? cuda_blocks_for(total, 256) : 65535;
    LAUNCH((k_add), grid, 256, 0, (cudaStream_t)stream, x, y, r, total);
    return cuda_launched();
}

__global__ void k_silu_mul(const float *g, const float *u, float *act, uint64_t n)
{
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        act[i] = DEVIO_MUL(devio_siluf(g[i]), u[i]);
}

int cuda_silu_mul(const float *g, const float *u, float *act, uint32_t n, uint32_t n_tok,
                  void *stream)
{
    uint64_t total = (uint64_t)n * n_tok;
    if (total == 0)
        return 0;
    uint32_t grid = cuda_blocks_for(total, 256) < 65535 ? cuda_blocks_for(total, 256) : 65535;
    LAUNCH((k_silu_mul), grid, 256, 0, (cudaStream_t)stream, g, u, act, total);
    return cuda_launched();
}

__global__ void k_gather(float *dst, const float *src, const uint32_t *idx, uint32_t width)
{
    uint32_t r = blockIdx.y;
    const float *s = src + (size_t)idx[r] * width;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x)
        dst[(size_t)r * width + i] = s[i];
}

int cuda_gather(float *dst, const float *src, const uint32_t *idx, uint32_t width, uint32_t n,
                void *stream)
{
    if (n == 0)
        return 0;
    dim3 grid(cuda_blocks_for(width, 256), n);
    LAUNCH((k_gather), grid, 256, 0, (cudaStream_t)stream, dst, src, idx, width);
    return cuda_launched();
}

__global__ void k_copy_block(uint16_t *k, uint16_t *v, uint64_t layer_words,
                             uint32_t block_words, uint32_t src, uint32_t dst)
{
    size_t base = (size_t)blockIdx.y * layer_words;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < block_words;
         i += gridDim.x * blockDim.x) {
        k[base + (size_t)dst * block_words + i] = k[base + (size_t)src * block_words + i];
        v[base + (size_t)dst * block_words + i] = v[base + (size_t)src * block_words + i];
    }
}

int cuda_copy_block(void *k, void *v, uint32_t n_layers, uint64_t layer_words,
                    uint32_t block_words, uint32_t src, uint32_t dst, void *stream)
{
    if (src == dst || n_layers == 0)
        return 0;
    dim3 grid(cuda_blocks_for(block_words, 256), n_layers);
    LAUNCH((k_copy_block), grid, 256, 0, (cudaStream_t)stream, (uint16_t *)k, (uint16_t *)v,
           layer_words, block_words, src, dst);
    return cuda_launched();
}
