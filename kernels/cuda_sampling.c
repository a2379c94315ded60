/* cuda_sampling.c - the backend's sample slot (device/backend.h) under fast numerics: the rows
 * whose parameters ask for no top-p are sampled on the GPU from the logits
 * staging rows (kernels/cuda_sample.h), and their logits never reach the host when no handle
 * holds them; the others are sampled by device/sampler.c in wait, from the logits submit
 * copied as always. Every result is device/sampler.h's definition on the step's logits. */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "device/sampler.h"
#include "device/status.h"
#include "kernels/cuda_sample.h"
#include "kernels/cuda_state.h"

devio_status cuda_sampling_create(cuda_state *st, devio_error *err)
{
    if (!st->fast)
        return DEVIO_OK;
    uint32_t rows = st->plan.logits_rows, depth = st->cfg.max_depth;
    devio_status s;
    if ((s = devio_sampler_create(st->sh.vocab, &st->sampler)) != DEVIO_OK)
        return devio_fail(err, s, "no memory for the host sampler");
    if ((s = cuda_dalloc(st, (void **)&st->sample_jobs, (uint64_t)rows * sizeof(cuda_sample_job),
                         err)) ||
        (s = cuda_dalloc(st, (void **)&st->sample_out, (uint64_t)rows * sizeof(cuda_sample_out),
                         err)) ||
        (s = cuda_dalloc(st, (void **)&st->sample_scratch,
                         (uint64_t)rows * st->sh.vocab * sizeof(float), err)))
        return s;
    if (!(st->rings = calloc(depth, sizeof *st->rings)))
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory");
    for (uint32_t i = 0; i < depth; i++) {
        cuda_ring_samples *r = &st->rings[i];
        if (!(r->job_of = calloc(st->cfg.max_rows, sizeof *r->job_of)))
            return devio_fail(err, DEVIO_E_NOMEM, "out of host memory");
        if ((s = cuda_check(st, cudaMallocHost((void **)&r->jobs, rows * sizeof *r->jobs),
                            "cudaMallocHost", err)) ||
            (s = cuda_check(st, cudaMallocHost((void **)&r->out, rows * sizeof *r->out),
                            "cudaMallocHost", err)))
            return s;
    }
    return DEVIO_OK;
}

void cuda_sampling_destroy(cuda_state *st)
{
    for (uint32_t i = 0; st->rings && i < st->cfg.max_depth; i++) {
        if (st->rings[i].jobs)
            cudaFreeHost(st->rings[i].jobs);
        if (st->rings[i].out)
            cudaFreeHost(st->rings[i].out);
        free(st->rings[i].job_of);
    }
    free(st->rings);
    devio_sampler_free(st->sampler);
}

/* Whether the GPU samples sm of b: the backend was asked to (b->device_sampling), every
 * output's logits are in the staging rows, and the parameters ask for no top-p. */
static bool on_gpu(const cuda_state *st, const devio_batch *b, const devio_batch_sample *sm)
{
    return b->device_sampling && b->n_out <= st->plan.logits_rows && !(sm->params.top_p < 1.0f);
}

bool cuda_sampling_skips(const cuda_state *st, const devio_batch *b, uint32_t slot)
{
    for (uint32_t i = 0; i < b->n_samples; i++)
        if (b->samples[i].slot == slot)
            return b->samples[i].sample_only && on_gpu(st, b, &b->samples[i]);
    return false;
}

/* The staging row of logits slot `slot`: its output's index. */
static uint32_t staging_row(const devio_batch *b, uint32_t slot)
{
    uint32_t k = 0;
    while (k + 1 < b->n_out && b->out_slot[k] != slot)
        k++;
    return k;
}

devio_status cuda_sample_batch(void *state, const devio_batch *b, devio_error *err)
{
    cuda_state *st = state;
    uint64_t n = atomic_load(&st->submitted);
    if (!st->fast || n == 0)
        return devio_fail(err, DEVIO_E_DEVICE, "sampling without a step of fast numerics");
    uint32_t ring = (uint32_t)((n - 1) % st->cfg.max_depth);
    cuda_ring_samples *r = &st->rings[ring];
    r->n_jobs = 0;
    r->active = true;
    for (uint32_t i = 0; i < b->n_samples; i++) {
        const devio_batch_sample *sm = &b->samples[i];
        r->job_of[i] = -1;
        if (!on_gpu(st, b, sm))
            continue;
        float t = sm->params.temperature;
        int32_t k = sm->params.top_k;
        r->jobs[r->n_jobs] = (cuda_sample_job){
            .row = staging_row(b, sm->slot), .temperature = t < DEVIO_GREEDY_BELOW ? 0.0f : t,
            .min_p = sm->params.min_p,
            .top_k = k > 0 && (uint32_t)k < st->sh.vocab ? (uint32_t)k : 0,
            .seed = sm->params.seed, .position = sm->position};
        r->job_of[i] = (int32_t)r->n_jobs++;
    }
    if (r->n_jobs == 0)
        return DEVIO_OK;
    cudaStream_t s = st->stream;
    devio_status rc;
    if ((rc = cuda_check(st, cudaMemcpyAsync(st->sample_jobs, r->jobs,
                                             r->n_jobs * sizeof *r->jobs,
                                             cudaMemcpyHostToDevice, s),
                         "uploading the samples", err)) ||
        (rc = cuda_check(st, cuda_sample(st->logits, st->sh.vocab, st->sample_jobs, r->n_jobs,
                                         st->sample_scratch, st->sample_out, s),
                         "sampling", err)) ||
        (rc = cuda_check(st, cudaMemcpyAsync(r->out, st->sample_out,
                                             r->n_jobs * sizeof *r->out,
                                             cudaMemcpyDeviceToHost, s),
                         "copying the samples", err)))
        return rc;
    /* The step's event moves past the sampling, which wait then covers. */
    return cuda_check(st, cudaEventRecord(st->done[ring], s), "cudaEventRecord", err);
}

devio_status cuda_sampling_finish(cuda_state *st, uint32_t ring, const devio_batch *b,
                                  devio_error *err)
{
    cuda_ring_samples *r = st->rings ? &st->rings[ring] : NULL;
    if (!r || !r->active)
        return DEVIO_OK;
    r->active = false;
    for (uint32_t i = 0; i < b->n_samples; i++) {
        devio_batch_sample *sm = &b->samples[i];
        bool ok;
        if (r->job_of[i] >= 0) {
            const cuda_sample_out *o = &r->out[r->job_of[i]];
            ok = o->token >= 0;
            sm->token = o->token;
            sm->logprob = o->logprob;
        } else {
            const float *logits = st->cfg.logits_host + (size_t)sm->slot * st->sh.vocab;
            ok = devio_sampler_run(st->sampler, logits, &sm->params, sm->position, &sm->token,
                                   &sm->logprob) == DEVIO_OK;
        }
        if (!ok)
            return devio_fail_at(err, DEVIO_E_DEVICE, "row", sm->row,
                                 "row %u: cannot sample, every logit is NaN or -inf", sm->row);
    }
    return DEVIO_OK;
}
