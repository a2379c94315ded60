/* cuda_sample.cu - device/sample/sampler.h on the GPU for the rows cuda_sample.h takes: a block of
 * SAMPLE_THREADS per row. Maxima and argmaxes are exact whatever the order of the reduction
 * (ties to the lowest id, as the definition says); the definition's sums (devio_lane_sum) run
 * as it writes them, lane l of warp 0 adding ids l, l + 32, ... in order and the lanes folded
 * by fold(). Only fast numerics call it; its results are the host sampler's on the same
 * logits (tests/cuda_fast_kernels_test.c holds it to that). */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "device/numerics/numerics.h"
#include "device/numerics/sample_rule.h"
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

/* The number of v's of the threads before this one (an exclusive scan; counts are exact). */
template <class P> __device__ inline uint32_t block_before(uint32_t v, P red)
{
    uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        uint32_t y = __shfl_up_sync(FULL, x, d);
        x += lane >= (uint32_t)d ? y : 0u;
    }
    DEVIO_SHARED_VIEW(uint32_t, cnt, red, 0);
    __syncthreads(); /* red's last readers are done */
    if (lane == 31)
        cnt[warp] = x;
    __syncthreads();
    uint32_t before = x - v;
    for (uint32_t k = 0; k < warp; k++)
        before += cnt[k];
    return before;
}

/* Step 6's order as one unsigned key, smaller first: p descending, then the lower id. */
__device__ inline uint64_t p_key(float p, uint32_t id)
{
    return (uint64_t)devio_nucleus_key(p) << 32 | id;
}

/* Step 6 on K, where p[i] >= 0 is the probability of a member of K and -1 marks the others:
 * the largest key of the nucleus (UINT64_MAX when the walk ends short of top_p). K is taken
 * in order a batch of up to SAMPLE_THREADS keys at a time: the batch's last key found by
 * halving, its keys gathered into buf and put in order by rank, then thread 0 adds their p
 * one by one as the definition does, until the sum reaches top_p. Every thread calls it. */
template <class P>
__device__ uint64_t nucleus_cut(const float *p, uint32_t V, float top_p, P red, P shared)
{
    uint32_t tid = threadIdx.x, step = blockDim.x;
    DEVIO_SHARED_VIEW(uint64_t, buf, shared, 0);
    DEVIO_SHARED_VIEW(uint64_t, sorted, shared, 2u * SAMPLE_THREADS);
    DEVIO_SHARED_VIEW(uint64_t, cut, shared, 4u * SAMPLE_THREADS);
    float c = 0.0f; /* thread 0's running sum */
    for (uint64_t prev = 0;;) { /* keys are never 0: the batch takes keys > prev */
        uint32_t n = 0;
        for (uint32_t i = tid; i < V; i += step)
            n += p[i] >= 0.0f && p_key(p[i], i) > prev;
        uint32_t left = block_count(n, red);
        if (left == 0)
            return UINT64_MAX;
        uint32_t m = left < SAMPLE_THREADS ? left : SAMPLE_THREADS;
        uint64_t lo = prev + 1, hi = UINT64_MAX; /* the smallest t with m keys in (prev, t] */
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            n = 0;
            for (uint32_t i = tid; i < V; i += step)
                n += p[i] >= 0.0f && p_key(p[i], i) > prev && p_key(p[i], i) <= mid;
            if (block_count(n, red) >= m)
                hi = mid;
            else
                lo = mid + 1;
        }
        n = 0;
        for (uint32_t i = tid; i < V; i += step)
            n += p[i] >= 0.0f && p_key(p[i], i) > prev && p_key(p[i], i) <= lo;
        uint32_t at = block_before(n, red);
        for (uint32_t i = tid; i < V; i += step)
            if (p[i] >= 0.0f && p_key(p[i], i) > prev && p_key(p[i], i) <= lo)
                buf[at++] = p_key(p[i], i);
        __syncthreads();
        if (tid < m) {
            uint64_t k = buf[tid];
            uint32_t rank = 0;
            for (uint32_t j = 0; j < m; j++)
                rank += buf[j] < k;
            sorted[rank] = k;
        }
        __syncthreads();
        if (tid == 0) {
            cut[0] = 0;
            for (uint32_t j = 0; j < m; j++) {
                c = DEVIO_ADD(c, p[(uint32_t)sorted[j]]);
                if (c >= top_p) {
                    cut[0] = sorted[j];
                    break;
                }
            }
        }
        __syncthreads();
        uint64_t found = cut[0];
        __syncthreads(); /* cut and buf are read before the next batch writes them */
        if (found)
            return found;
        prev = lo;
    }
}

/* Step 0b of the record a (cuda_sample.h) into w, from the raw logits l; the penalties count
 * each id of the history in e (as words), which step 1 is done with. The mask goes first:
 * a bias cannot lift an id it left at -inf (-inf plus any bias cleans to -inf), so the order
 * gives the definition's values. Each distinct id is then changed once, from its count, as
 * the definition does. Every thread calls it. */
__device__ void process(const float *l, uint32_t V, const uint32_t *a, float *w, float *e)
{
    uint32_t tid = threadIdx.x, step = blockDim.x;
    uint32_t n_bias = a[0], n_banned = a[1], n_hist = a[2];
    float rp = devio_num_float(a[4]), pp = devio_num_float(a[5]), fp = devio_num_float(a[6]);
    const uint32_t *bias_ids = a + CUDA_PROC_HEAD, *bias = bias_ids + n_bias;
    const uint32_t *allowed = bias + n_bias;
    const uint32_t *banned = allowed + (a[3] ? (V + 31) / 32 : 0), *hist = banned + n_banned;
    uint32_t *count = reinterpret_cast<uint32_t *>(e);
    bool pen = n_hist && (rp != 1.0f || pp != 0.0f || fp != 0.0f);
    for (uint32_t i = tid; i < V; i += step) {
        float x = devio_clean_logit(l[i]);
        w[i] = a[3] && !((allowed[i >> 5] >> (i & 31u)) & 1u) ? -INFINITY : x;
        if (pen)
            count[i] = 0;
    }
    __syncthreads();
    if (tid == 0) /* in order: an id may be biased more than once */
        for (uint32_t k = 0; k < n_bias; k++)
            w[bias_ids[k]] = devio_clean_logit(DEVIO_ADD(w[bias_ids[k]], devio_num_float(bias[k])));
    for (uint32_t k = tid; pen && k < n_hist; k += step)
        atomicAdd(&count[hist[k]], 1u);
    __syncthreads();
    for (uint32_t k = tid; k < n_banned; k += step)
        w[banned[k]] = -INFINITY;
    __syncthreads();
    if (!pen)
        return;
    for (uint32_t i = tid; i < V; i += step) {
        uint32_t c = count[i];
        float x = w[i];
        if (c == 0 || x == -INFINITY)
            continue;
        if (rp != 1.0f)
            x = devio_clean_logit(x > 0.0f ? DEVIO_DIV(x, rp) : DEVIO_MUL(x, rp));
        if (fp != 0.0f && x != -INFINITY)
            x = devio_clean_logit(DEVIO_SUB(x, DEVIO_MUL(fp, (float)c)));
        if (pp != 0.0f && x != -INFINITY)
            x = devio_clean_logit(DEVIO_SUB(x, pp));
        w[i] = x;
    }
    __syncthreads();
}

/* Block j: job j (cuda_sample.h), steps 0 to 8 of device/sample/sampler.h without 1b. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(const float *logits, uint32_t V, const cuda_sample_job *jobs, const uint32_t *args,
             float *scratch, cuda_sample_out *out)
{
    DEVIO_DYN_SHARED(float, red);
    DEVIO_SHARED_VIEW(float, nucleus, red, 2u * SAMPLE_WARPS);
    cuda_sample_job job = jobs[blockIdx.x];
    const float *raw = logits + (size_t)job.row * V, *l = raw;
    float *e = scratch + (size_t)blockIdx.x * 2u * V, *w = e + V;
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

    /* Step 0b: steps 2 to 8 read l'' (w) in place of l', its first largest the greedy pick. */
    uint32_t tok = arg;
    if (job.proc) {
        process(l, V, args + job.proc - 1, w, e);
        l = w;
        float mw = -INFINITY;
        tok = UINT32_MAX;
        for (uint32_t i = tid; i < V; i += step)
            if (ahead(w[i], i, mw, tok)) {
                mw = w[i];
                tok = i;
            }
        block_first(&mw, &tok, red);
        if (mw == -INFINITY) {
            if (tid == 0)
                out[blockIdx.x].token = -1;
            return;
        }
    }
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
        /* Steps 5 to 7: e becomes p over K (-1 outside it), the nucleus's largest key, and
         * min_p's threshold over the nucleus (whose largest p is K's). */
        bool use_p = job.top_p < 1.0f;
        float thr = -1.0f;
        uint64_t cut = UINT64_MAX;
        if (use_p || job.min_p > 0.0f) {
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
            float zsum = block_lane_sum(e, V, red);
            pmax = 0.0f;
            for (uint32_t i = tid; i < V; i += step) {
                float z = devio_temper(devio_clean_logit(l[i]), t);
                float p = z_key(z, i) >= kth ? DEVIO_DIV(e[i], zsum) : -1.0f;
                e[i] = p;
                pmax = p > pmax ? p : pmax;
            }
            any = 0;
            block_first(&pmax, &any, red);
            if (use_p)
                cut = nucleus_cut(e, V, job.top_p, red, nucleus);
            if (job.min_p > 0.0f)
                thr = DEVIO_MUL(job.min_p, pmax);
        }
        /* Step 8: v = z + g over the ids kept, first in "v descending, lower id first". */
        float best = -INFINITY;
        uint32_t best_id = UINT32_MAX;
        for (uint32_t i = tid; i < V; i += step) {
            float z = devio_temper(devio_clean_logit(l[i]), t);
            if (z_key(z, i) < kth || (use_p && p_key(e[i], i) > cut) ||
                (thr >= 0.0f && e[i] < thr))
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
        out[blockIdx.x].logprob = DEVIO_SUB(DEVIO_SUB(devio_clean_logit(raw[tok]), m), log_z);
    }
}

int cuda_sample(const float *logits, uint32_t vocab, const cuda_sample_job *jobs, uint32_t n,
                const uint32_t *args, float *scratch, cuda_sample_out *out, void *stream)
{
    if (n == 0)
        return 0;
    /* red, then buf, sorted and the cut of nucleus_cut */
    size_t smem = 2u * SAMPLE_WARPS * sizeof(float) + (2u * SAMPLE_THREADS + 1u) * sizeof(uint64_t);
    LAUNCH((k_sample), n, SAMPLE_THREADS, smem, (cudaStream_t)stream, logits, vocab, jobs,
           args, scratch, out);
    return cuda_launched();
}
