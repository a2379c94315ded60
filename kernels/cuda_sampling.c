/* cuda_sampling.c - where a step's logits go after lm_head, and the backend's sample and
 * logits_read slots (device/backend/backend.h). Strict numerics copy every output's logits to its
 * slot of the host arena (pinned here when it can be) and read them from there. Fast numerics
 * keep each slot's logits on the GPU (dlogits) and copy a row to the host only when the core
 * reads it; each row the core asks is sampled on the GPU from the logits staging rows
 * (kernels/cuda_sample.h), and a row only sampled is never kept; when the staging rows cannot
 * hold the step's outputs, device/sample/sampler.c samples in wait, from the kept logits. Every
 * result is device/sample/sampler.h's definition on the step's logits. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/sample/sampler.h"
#include "device/status.h"
#include "kernels/cuda_proc.h"
#include "kernels/cuda_sample.h"
#include "kernels/cuda_state.h"

devio_status cuda_sampling_create(cuda_state *st, devio_error *err)
{
    if (!st->fast) {
        /* Pinned, the host logits arena takes asynchronous copies; when it cannot be pinned,
         * copies into it are synchronous and still right. */
        size_t bytes = (size_t)st->cfg.logits_rows * st->sh.vocab * sizeof(float);
        st->logits_pinned = cudaHostRegister(st->cfg.logits_host, bytes,
                                             cudaHostRegisterDefault) == cudaSuccess;
        if (!st->logits_pinned)
            (void)cudaGetLastError();
        return DEVIO_OK;
    }
    uint32_t rows = st->plan.logits_rows, depth = st->cfg.max_depth;
    devio_status s;
    if ((s = devio_sampler_create(st->sh.vocab, &st->sampler)) != DEVIO_OK)
        return devio_fail(err, s, "no memory for the host sampler");
    if (!(st->read_buf = malloc((size_t)st->sh.vocab * sizeof *st->read_buf)))
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory");
    if ((s = cuda_dalloc(st, (void **)&st->dlogits,
                         (uint64_t)st->cfg.logits_rows * st->sh.vocab * sizeof(float), err)))
        return s;
    if ((s = cuda_dalloc(st, (void **)&st->sample_jobs, (uint64_t)rows * sizeof(cuda_sample_job),
                         err)) ||
        (s = cuda_dalloc(st, (void **)&st->sample_out, (uint64_t)rows * sizeof(cuda_sample_out),
                         err)) ||
        (s = cuda_dalloc(st, (void **)&st->sample_scratch,
                         (uint64_t)rows * 2u * st->sh.vocab * sizeof(float), err)))
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
        if (st->rings[i].args)
            cudaFreeHost(st->rings[i].args);
        if (st->rings[i].dargs)
            cudaFree(st->rings[i].dargs);
        free(st->rings[i].job_of);
    }
    free(st->rings);
    free(st->read_buf);
    devio_sampler_free(st->sampler);
    if (st->logits_pinned)
        cudaHostUnregister(st->cfg.logits_host);
}

devio_status cuda_logits_read(void *state, uint32_t slot, float *dst, devio_error *err)
{
    cuda_state *st = state;
    size_t row = (size_t)st->sh.vocab * sizeof(float);
    if (!st->fast) {
        memcpy(dst, st->cfg.logits_host + (size_t)slot * st->sh.vocab, row);
        return DEVIO_OK;
    }
    /* The step that wrote the slot was waited; the legacy stream does not wait for the
     * (non-blocking) step stream, so a step in flight goes on meanwhile. */
    return cuda_check(st, cudaMemcpy(dst, st->dlogits + (size_t)slot * st->sh.vocab, row,
                                     cudaMemcpyDeviceToHost),
                      "reading logits", err);
}

bool cuda_sampling_skips(const cuda_state *st, uint32_t ring, const devio_batch *b,
                         uint32_t slot)
{
    for (uint32_t i = 0; st->rings && st->rings[ring].gpu && i < b->n_samples; i++)
        if (b->samples[i].logits_row == slot)
            return b->samples[i].sample_only;
    return false;
}

/* The staging row of logits slot `slot`: its output's index. */
static uint32_t staging_row(const devio_batch *b, uint32_t slot)
{
    uint32_t k = 0;
    while (k + 1 < b->n_out && b->out_row[k] != slot)
        k++;
    return k;
}

/* Room for `words` words of records in ring r, whose last step has been waited (neither
 * copy is in use); false when memory for them runs out, which is no fault of the device: the
 * error is cleared and the step is sampled on the host. */
static bool args_room(cuda_ring_samples *r, size_t words)
{
    if (words <= r->args_cap)
        return true;
    size_t cap = words > 2 * r->args_cap ? words : 2 * r->args_cap;
    if (r->args)
        cudaFreeHost(r->args);
    if (r->dargs)
        cudaFree(r->dargs);
    r->args = NULL, r->dargs = NULL, r->args_cap = 0;
    if (cudaMallocHost((void **)&r->args, cap * sizeof *r->args) != cudaSuccess ||
        cudaMalloc((void **)&r->dargs, cap * sizeof *r->dargs) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    r->args_cap = cap;
    return true;
}

void cuda_sampling_prepare(cuda_state *st, uint32_t ring, const devio_batch *b)
{
    if (!st->rings)
        return;
    cuda_ring_samples *r = &st->rings[ring];
    r->active = false; /* until the sample slot runs for this step */
    r->gpu = b->device_sampling && b->n_out <= st->plan.logits_rows;
    size_t words = 0;
    for (uint32_t i = 0; r->gpu && i < b->n_samples; i++) {
        const devio_batch_sample *sm = &b->samples[i];
        words += devio_sample_processes(&sm->params, sm->n_history)
                     ? cuda_proc_words(&sm->params, sm->n_history, st->sh.vocab) : 0;
    }
    r->gpu = r->gpu && args_room(r, words);
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
    size_t words = 0;
    devio_status rc;
    for (uint32_t i = 0; i < b->n_samples; i++) {
        const devio_batch_sample *sm = &b->samples[i];
        r->job_of[i] = -1;
        if (!r->gpu)
            continue;
        float t = sm->params.temperature;
        int32_t k = sm->params.top_k;
        r->jobs[r->n_jobs] = (cuda_sample_job){
            .row = staging_row(b, sm->logits_row), .temperature = t < DEVIO_GREEDY_BELOW ? 0.0f : t,
            .top_p = sm->params.top_p, .min_p = sm->params.min_p,
            .top_k = k > 0 && (uint32_t)k < st->sh.vocab ? (uint32_t)k : 0,
            .seed = sm->params.seed, .position = sm->position};
        if (devio_sample_processes(&sm->params, sm->n_history)) {
            cuda_proc_record(&sm->params, sm->history, sm->n_history, st->sh.vocab,
                             r->args + words);
            r->jobs[r->n_jobs].proc = (uint32_t)words + 1u;
            words += cuda_proc_words(&sm->params, sm->n_history, st->sh.vocab);
        }
        r->job_of[i] = (int32_t)r->n_jobs++;
    }
    if (r->n_jobs == 0)
        return DEVIO_OK;
    cudaStream_t s = st->stream;
    if ((words && (rc = cuda_check(st, cudaMemcpyAsync(r->dargs, r->args, words * sizeof *r->args,
                                                       cudaMemcpyHostToDevice, s),
                                   "uploading the logit processing", err))) ||
        (rc = cuda_check(st, cudaMemcpyAsync(st->sample_jobs, r->jobs,
                                             r->n_jobs * sizeof *r->jobs,
                                             cudaMemcpyHostToDevice, s),
                         "uploading the samples", err)) ||
        (rc = cuda_check(st, cuda_sample(st->logits, st->sh.vocab, st->sample_jobs, r->n_jobs,
                                         r->dargs, st->sample_scratch, st->sample_out, s),
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
            devio_status s = cuda_logits_read(st, sm->logits_row, st->read_buf, err);
            if (s != DEVIO_OK)
                return s;
            ok = devio_sampler_run_ex(st->sampler, st->read_buf, &sm->params, sm->history,
                                      sm->n_history, sm->position, &sm->token, &sm->logprob,
                                      NULL) == DEVIO_OK;
        }
        if (!ok)
            return devio_fail_at(err, DEVIO_E_DEVICE, "row", sm->row,
                                 "row %u: cannot sample, every logit is NaN or -inf", sm->row);
    }
    return DEVIO_OK;
}
