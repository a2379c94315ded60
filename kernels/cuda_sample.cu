/* cuda_sample.cu - device/sampler.h on the GPU for the rows cuda_sample.h takes: a block of
 * SAMPLE_THREADS per row. Maxima and argmaxes are exact whatever the order of the reduction
 * (ties to the lowest id, as the definition says); the definition's sums (devio_lane_sum) run
 * as it writes them, lane l of warp 0 adding ids l, l + 32, ... in order and the lanes folded
 * by fold(). Only fast numerics call it; its results are the host sampler's on the same
 * logits (tests/cuda_fast_kernels_test.c holds it to that). */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "device/numerics.h"
#include "device/sample_rule.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_sample.h"
#include "kernels/cuda_warp.cuh"

#define SAMPLE_THREADS 1024u
#define SAMPLE_WARPS (SAMPLE_THREADS / 32u)

/* (v, id) before (w, jd) in "larger value first, equal values lower id first". */
__device__ inline bool ahead(float v, uint32_t id, float w, uint32_t jd)
{
    return v > w || (v == w && id < jd);
}

/* The block's first (v, id) in that order, in every thread; red holds 2 * SAMPLE_WARPS words.
 * Every thread of the block calls it. */
template <class P> __device__ inline void block_first(float *v, uint32_t *id, P red)
{
#pragma unroll
    for (int w = 16; w >= 1; w >>= 1) {
        float ov = __shfl_xor_sync(FULL, *v, w);
        uint32_t oi = __shfl_xor_sync(FULL, *id, w);
        if (ahead(ov, oi, *v, *id)) {
            *v = ov;
            *id = oi;
        }
    }
    uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    DEVIO_SHARED_VIEW(uint32_t, ids, red, SAMPLE_WARPS);
    __syncthreads(); /* red's last readers are done */
    if (lane == 0) {
        red[warp] = *v;
        ids[warp] = *id;
    }
    __syncthreads();
    *v = -INFINITY;
    *id = UINT32_MAX;
    for (uint32_t k = 0; k < nw; k++)
        if (ahead(red[k], ids[k], *v, *id)) {
            *v = red[k];
            *id = ids[k];
        }
}

/* The sum of every thread's v, in every thread (counts: exact in any order). */
template <class P> __device__ inline uint32_t block_count(uint32_t v, P red)
{
#pragma unroll
    for (int w = 16; w >= 1; w >>= 1)
        v += __shfl_xor_sync(FULL, v, w);
    DEVIO_SHARED_VIEW(uint32_t, cnt, red, 0);
    __syncthreads(); /* red's last readers are done */
    if (threadIdx.x % 32 == 0)
        cnt[threadIdx.x / 32] = v;
    __syncthreads();
    uint32_t sum = 0;
    for (uint32_t k = 0; k < blockDim.x / 32; k++)
        sum += cnt[k];
    return sum;
}

/* Step 4's order as one unsigned key, larger first: z (-0 as +0), then the lower id. */
__device__ inline uint64_t z_key(float z, uint32_t id)
{
    uint32_t b = devio_num_bits(z == 0.0f ? 0.0f : z);
    b = b & 0x80000000u ? ~b : b | 0x80000000u;
    return (uint64_t)b << 32 | (0xFFFFFFFFu - id);
}

/* devio_lane_sum(e, V) in every thread: warp 0 adds, the result passes through red[0]. */
template <class P> __device__ inline float block_lane_sum(const float *e, uint32_t V, P red)
{
    __syncthreads(); /* e is written, red's last readers are done */
    if (threadIdx.x < 32) {
        float p = 0.0f;
        for (uint32_t i = threadIdx.x; i < V; i += 32)
            p = DEVIO_ADD(p, e[i]);
        p = fold(p);
        if (threadIdx.x == 0)
            red[0] = p;
    }
    __syncthreads();
    return red[0];
}

/* Block j: job j (cuda_sample.h), steps 0 to 8 of device/sampler.h without 0b, 1b and 6. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(const float *logits, uint32_t V, const cuda_sample_job *jobs, float *scratch,
             cuda_sample_out *out)
{
    DEVIO_DYN_SHARED(float, red);
    cuda_sample_job job = jobs[blockIdx.x];
    const float *l = logits + (size_t)job.row * V;
    float *e = scratch + (size_t)blockIdx.x * V;
    uint32_t tid = threadIdx.x, step = blockDim.x;

    /* Steps 0 and 2: the largest cleaned logit, its first id the greedy pick. */
    float m = -INFINITY;
    uint32_t arg = UINT32_MAX;
    for (uint32_t i = tid; i < V; i += step) {
        float x = devio_clean_logit(l[i]);
        if (ahead(x, i, m, arg)) {
            m = x;
            arg = i;
        }
    }
    block_first(&m, &arg, red);
    if (m == -INFINITY) {
        if (tid == 0)
            out[blockIdx.x].token = -1;
        return;
    }
    /* Step 1: log Z of the raw logits. */
    for (uint32_t i = tid; i < V; i += step)
        e[i] = devio_expf(DEVIO_SUB(devio_clean_logit(l[i]), m));
    float log_z = devio_logf(block_lane_sum(e, V, red));

    uint32_t tok = arg;
    float t = job.temperature;
    if (t > 0.0f) {
        /* Step 4: K = the ids whose key is at least the top_k-th largest, found by halving
         * the key space (keys are distinct, so exactly top_k ids). */
        uint64_t kth = 0;
        for (uint64_t lo = 0, hi = UINT64_MAX; job.top_k > 0 && lo < hi; kth = lo) {
            uint64_t mid = lo + (hi - lo) / 2 + 1;
            uint32_t n = 0;
            for (uint32_t i = tid; i < V; i += step)
                n += z_key(devio_temper(devio_clean_logit(l[i]), t), i) >= mid;
            if (block_count(n, red) >= job.top_k)
                lo = mid;
            else
                hi = mid - 1;
        }
        /* Step 7 (min_p over K, as step 6 is off): p from step 5. */
        float thr = -1.0f, zsum = 1.0f;
        if (job.min_p > 0.0f) {
            float zmax = -INFINITY, pmax;
            uint32_t any = 0;
            for (uint32_t i = tid; i < V; i += step) {
                float z = devio_temper(devio_clean_logit(l[i]), t);
                zmax = z > zmax ? z : zmax; /* K's largest z is every id's */
            }
            block_first(&zmax, &any, red);
            for (uint32_t i = tid; i < V; i += step) {
                float z = devio_temper(devio_clean_logit(l[i]), t);
                e[i] = z_key(z, i) >= kth ? devio_expf(DEVIO_SUB(z, zmax)) : 0.0f;
            }
            zsum = block_lane_sum(e, V, red);
            pmax = 0.0f;
            for (uint32_t i = tid; i < V; i += step) {
                float p = DEVIO_DIV(e[i], zsum); /* +0 outside K */
                pmax = p > pmax ? p : pmax;
            }
            any = 0;
            block_first(&pmax, &any, red);
            thr = DEVIO_MUL(job.min_p, pmax);
        }
        /* Step 8: v = z + g over the ids kept, first in "v descending, lower id first". */
        float best = -INFINITY;
        uint32_t best_id = UINT32_MAX;
        for (uint32_t i = tid; i < V; i += step) {
            float z = devio_temper(devio_clean_logit(l[i]), t);
            if (z_key(z, i) < kth || (thr >= 0.0f && DEVIO_DIV(e[i], zsum) < thr))
                continue;
            float v = DEVIO_ADD(z, devio_gumbel_of_id(i, job.seed, job.position));
            if (ahead(v, i, best, best_id)) {
                best = v;
                best_id = i;
            }
        }
        block_first(&best, &best_id, red);
        tok = best_id;
    }
    if (tid == 0) {
        out[blockIdx.x].token = (int32_t)tok;
        out[blockIdx.x].logprob = DEVIO_SUB(DEVIO_SUB(devio_clean_logit(l[tok]), m), log_z);
    }
}

int cuda_sample(const float *logits, uint32_t vocab, const cuda_sample_job *jobs, uint32_t n,
                float *scratch, cuda_sample_out *out, void *stream)
{
    if (n == 0)
        return 0;
    size_t smem = 2u * SAMPLE_WARPS * sizeof(float);
    LAUNCH((k_sample), n, SAMPLE_THREADS, smem, (cudaStream_t)stream, logits, vocab, jobs,
           scratch, out);
    return cuda_launched();
}
