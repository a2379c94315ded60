/* cuda_sample.h - sampling on the GPU under fast numerics (kernels/cuda_sample.cu): device/
 * sampler.h's definition, bit for bit on the same logits, for every parameter the
 * definition has but top logprobs: step 0b's logit processing, greedy, temperature, top-k,
 * top-p, min-p; the Philox stream and Gumbel noise of device/numerics/sample_rule.h. As
 * cuda_kernels.h: no CUDA types cross it, 0 = cudaSuccess, device pointers borrowed for the
 * life of the enqueued work. */
#ifndef DEVIO_CUDA_SAMPLE_H
#define DEVIO_CUDA_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One row to sample: its logits row of the staging buffer and its parameters. */
typedef struct cuda_sample_job {
    uint32_t row;
    float temperature; /* 0: greedy (the caller maps those below DEVIO_GREEDY_BELOW to 0) */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint32_t top_k;    /* 0: off (the caller maps top_k >= vocab to 0) */
    uint32_t proc;     /* 0: no step 0b; else 1 + the word offset of its record in args */
    uint64_t seed, position;
} cuda_sample_job;

/* Step 0b's record in args, 32-bit words: n_bias, n_banned, n_history, has_allowed, then the
 * bits of repetition_penalty, presence_penalty and frequency_penalty, then bias ids [n_bias],
 * biases [n_bias] (float bits), the allowed mask [(vocab + 31) / 32] when has_allowed, banned
 * ids [n_banned] and the history [n_history] (a sample's processing and history, device/sample/sampler.h step 0b). */
enum { CUDA_PROC_HEAD = 7 }; /* kernels/cuda_proc.h lays records down */

/* A job's result: the token and its logprob (step 1), or token -1 when every logit of the row
 * is NaN or -inf. */
typedef struct cuda_sample_out {
    int32_t token;
    float logprob;
} cuda_sample_out;

/* For each of the n jobs (device memory), sample from logits[job.row * vocab ..] into out[j]
 * (device memory), with the processing records in args (device memory; NULL when no job has
 * one) and scratch [n, 2 * vocab] floats. A block per job. */
int cuda_sample(const float *logits, uint32_t vocab, const cuda_sample_job *jobs, uint32_t n,
                const uint32_t *args, float *scratch, cuda_sample_out *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
