/* cuda_proc.h - step 0b's record for the GPU sampler (kernels/cuda_sample.h gives the layout)
 * from a sample's processing and its penalties' history (device/sample/sampler.h): host code only,
 * inline, nothing owned; the record's arrays are copied, the sample's are borrowed for the call. */
#ifndef DEVIO_CUDA_PROC_H
#define DEVIO_CUDA_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "device/sample/sampler.h"
#include "kernels/cuda_sample.h"

/* The words of the record of q with n_history tokens of history. */
static inline size_t cuda_proc_words(const devio_sample_params *q, uint32_t n_history,
                                     uint32_t vocab)
{
    return CUDA_PROC_HEAD + 2u * (size_t)q->n_bias + (q->allowed ? (vocab + 31u) / 32u : 0u) +
           q->n_banned + n_history;
}

/* n words from src to dst, returning the word after them (src may be NULL when n is 0). */
static inline uint32_t *cuda_proc_put(uint32_t *dst, const void *src, size_t n)
{
    if (n)
        memcpy(dst, src, n * sizeof *dst);
    return dst + n;
}

/* Lay q's record down at w (cuda_proc_words(q, n_history, vocab) words); a
 * repetition penalty of 0 (unset) goes down as 1 (off). */
static inline void cuda_proc_record(const devio_sample_params *q, const int32_t *history,
                                    uint32_t n_history, uint32_t vocab, uint32_t *w)
{
    float rp = q->repetition_penalty == 0.0f ? 1.0f : q->repetition_penalty;
    float pen[3] = {rp, q->presence_penalty, q->frequency_penalty};
    w[0] = q->n_bias, w[1] = q->n_banned, w[2] = n_history, w[3] = q->allowed != NULL;
    memcpy(w + 4, pen, sizeof pen);
    w = cuda_proc_put(w + CUDA_PROC_HEAD, q->bias_ids, q->n_bias);
    w = cuda_proc_put(w, q->bias, q->n_bias);
    w = cuda_proc_put(w, q->allowed, q->allowed ? (vocab + 31u) / 32u : 0u);
    w = cuda_proc_put(w, q->banned, q->n_banned);
    cuda_proc_put(w, history, n_history);
}

#endif
