/* cuda_adapters.c - the CUDA backend's adapter slots: an adapter's modules
 * widened to f32 in one host image, uploaded into its slot's device memory
 * with the module table the LoRA kernels read (cuda_kernels.h). */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "device/status.h"
#include "kernels/cuda_state.h"

/* An adapter naming a target this backend does not apply (one that
 * device/adapter/adapter.h gains before cuda_plan_lora_dims knows it) is refused
 * rather than run without it. */
static devio_status targets_known(const cuda_state *st, const devio_adapter *a, devio_error *err)
{
    for (uint32_t t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
        uint32_t in, out;
        if ((a->targets & (1u << t)) && !cuda_plan_lora_dims(&st->sh, t, &in, &out))
            return devio_fail(err, DEVIO_E_UNSUPPORTED,
                              "adapter '%s': the CUDA backend does not apply LoRA to %s", a->name,
                              devio_lora_target_name((devio_lora_target)t));
    }
    return DEVIO_OK;
}

/* Host: the slot's modules widened into one host image, then one upload. */
devio_status cuda_adapter_add(void *sp, uint32_t slot, uint32_t generation,
                                     const devio_adapter *a, devio_error *err)
{
    cuda_state *st = sp;
    uint32_t L = st->sh.n_layers, R = st->cfg.max_lora_rank;
    if (slot >= st->cfg.adapter_slots)
        return devio_fail(err, DEVIO_E_INVALID, "adapter slot %u of %u", slot,
                          st->cfg.adapter_slots);
    if (a->rank == 0 || a->rank > R || a->n_layers != L)
        return devio_fail(err, DEVIO_E_INVALID, "adapter '%s' of rank %u does not fit this backend",
                          a->name, a->rank);
    devio_status s = cuda_refuse_if_failed(st, err);
    if (s == DEVIO_OK)
        s = targets_known(st, a, err);
    if (s != DEVIO_OK)
        return s;
    float *img = calloc(st->plan.lora_slot / sizeof(float) + 1, sizeof(float));
    cuda_lora_mod *mods = st->host_mods + (size_t)slot * L * DEVIO_LORA_N_TARGETS;
    if (!img)
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory copying adapter '%s'", a->name);
    float *dev = st->slots[slot].mem;
    size_t off = 0;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
            uint32_t in, out;
            cuda_plan_lora_dims(&st->sh, t, &in, &out);
            const devio_lora_module *m = &a->mods[(size_t)l * DEVIO_LORA_N_TARGETS + t];
            cuda_lora_mod *cm = &mods[l * DEVIO_LORA_N_TARGETS + t];
            *cm = (cuda_lora_mod){0};
            if ((a->targets & (1u << t)) && m->a.data) {
                devio_tensor_widen(&m->a, img + off, (size_t)a->rank * in);
                devio_tensor_widen(&m->b, img + off + (size_t)R * in, (size_t)out * a->rank);
                *cm = (cuda_lora_mod){.a = dev + off, .b = dev + off + (size_t)R * in,
                                      .rank = a->rank, .in = in, .out = out, .scale = a->scale};
            }
            off += (size_t)R * (in + out);
        }
    s = cuda_check(st, cudaMemcpy(dev, img, off * sizeof(float), cudaMemcpyHostToDevice),
                   "uploading an adapter", err);
    free(img);
    if (s == DEVIO_OK)
        s = cuda_check(st, cudaMemcpy(st->mods + (size_t)slot * L * DEVIO_LORA_N_TARGETS, mods,
                                      (size_t)L * DEVIO_LORA_N_TARGETS * sizeof *mods,
                                      cudaMemcpyHostToDevice),
                       "uploading an adapter", err);
    /* The uploads went through the default stream, which the step stream
     * does not wait for: they must have landed before a step reads them. */
    if (s == DEVIO_OK)
        s = cuda_check(st, cudaDeviceSynchronize(), "uploading an adapter", err);
    if (s != DEVIO_OK)
        return s;
    st->slots[slot].held = true;
    st->slots[slot].generation = generation;
    return DEVIO_OK;
}

void cuda_adapter_remove(void *sp, uint32_t slot, uint32_t generation)
{
    cuda_state *st = sp;
    /* Rows never name a freed slot (the core and cuda_submit check); the
     * copy stays until the slot is filled again. */
    if (slot < st->cfg.adapter_slots && st->slots[slot].generation == generation)
        st->slots[slot].held = false;
}
