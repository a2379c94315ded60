/* cuda_state_io.c - the CUDA backend's state_read and state_write (backend.h): one K or V
 * half of an attention layer's KV block, or one state slot or snapshot, copied between the
 * device and host memory in the bytes the kernels keep (kv_elem bytes an element: binary32
 * under strict numerics, binary16 under fast). Export and import call them with no batch in
 * flight; each copy runs on the step stream, after every step that wrote its source, and
 * returns complete. Allocates nothing. */
#include <cuda_runtime_api.h>

#include "device/status.h"
#include "kernels/cuda_state.h"

/* The device bytes of one part, and their size; NULL when out of range. */
static char *part_at(cuda_state *st, devio_state_ref w, uint64_t *n)
{
    if (w.part == DEVIO_STATE_SSM) {
        uint64_t slots = w.ssm.snapshot ? st->cfg.ssm_snapshots : st->cfg.ssm_slots;
        if (!st->ssm || w.ssm.index >= slots)
            return NULL;
        uint64_t i = (w.ssm.snapshot ? st->cfg.ssm_slots : 0) + (uint64_t)w.ssm.index;
        *n = st->sh.slot_floats * sizeof(float);
        return (char *)(st->ssm + i * st->sh.slot_floats);
    }
    if (w.layer >= st->n_attn || w.block >= st->cfg.kv_blocks)
        return NULL;
    *n = (uint64_t)st->block_elems * st->kv_elem;
    char *half = w.part == DEVIO_STATE_K ? st->k_cache : st->v_cache;
    return half + ((uint64_t)w.layer * st->layer_elems + (uint64_t)w.block * st->block_elems) *
                      st->kv_elem;
}

static devio_status state_copy(cuda_state *st, devio_state_ref w, void *host, bool to_host,
                               devio_error *err)
{
    devio_status s = cuda_refuse_if_failed(st, err);
    if (s != DEVIO_OK)
        return s;
    uint64_t n = 0;
    char *dev = part_at(st, w, &n);
    if (!dev)
        return devio_fail(err, DEVIO_E_INVALID,
                          "state part %d (layer %u, block %u) is out of range", (int)w.part,
                          w.layer, w.block);
    const char *what = to_host ? "reading a sequence's state" : "writing a sequence's state";
    if ((s = cuda_check(st,
                        cudaMemcpyAsync(to_host ? host : dev, to_host ? (const void *)dev : host,
                                        n, to_host ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyHostToDevice,
                                        st->stream),
                        what, err)))
        return s;
    return cuda_check(st, cudaStreamSynchronize(st->stream), what, err);
}

devio_status cuda_state_read(void *state, devio_state_ref what, void *dst, devio_error *err)
{
    return state_copy(state, what, dst, true, err);
}

devio_status cuda_state_write(void *state, devio_state_ref what, const void *src,
                              devio_error *err)
{
    return state_copy(state, what, (void *)src, false, err);
}
