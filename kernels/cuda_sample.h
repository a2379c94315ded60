/* cuda_sample.h - sampling on the GPU under fast numerics (kernels/cuda_sample.cu): device/
 * sampler.h's definition, bit for bit on the same logits, for the rows whose parameters ask
 * for no top-p (greedy, temperature, top-k, min-p; the Philox stream and Gumbel noise of
 * device/sample_rule.h). As cuda_kernels.h: no CUDA types cross it, 0 = cudaSuccess, device
 * pointers borrowed for the life of the enqueued work. */
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
    float min_p;       /* 0: off */
    uint32_t top_k;    /* 0: off (the caller maps top_k >= vocab to 0) */
    uint64_t seed, position;
} cuda_sample_job;

/* A job's result: the token and its logprob (step 1), or token -1 when every logit of the row
 * is NaN or -inf. */
typedef struct cuda_sample_out {
    int32_t token;
    float logprob;
} cuda_sample_out;

/* For each of the n jobs (device memory), sample from logits[job.row * vocab ..] into out[j]
 * (device memory), with scratch [n, vocab] floats. A block per job. */
int cuda_sample(const float *logits, uint32_t vocab, const cuda_sample_job *jobs, uint32_t n,
                float *scratch, cuda_sample_out *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
