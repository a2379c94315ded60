/* config.c - the device configuration: its defaults, the numerics names, and the check at open.
 * Pure values: it never touches a device, and fills only what the caller left 0. */
#include <string.h>

#include "common/cpus.h"
#include "device/core/core.h"
#include "device/status.h"

devio_config devio_config_default(void)
{
    return (devio_config){
        .kv_blocks = 0,
        .block_size = 16,
        .max_depth = 2,
        .max_seqs = 256,
        .max_seq_len = 0,
        .max_rows = 64,
        .max_batch_tokens = 2048,
        .logits_handles = 64,
        .logits_rows = 256,
        .max_loras = 4,
        .max_lora_rank = 64,
        .threads = 0,
        .numerics = DEVIO_NUMERICS_STRICT,
        .epoch = 1,
        .first_ticket_id = 1,
        .use_worker_thread = true,
    };
}

devio_sample_params devio_sample_params_default(void)
{
    return (devio_sample_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                 .seed = 0};
}

static const char *const numerics_names[] = {"strict", "fast"};

const char *devio_numerics_str(devio_numerics n)
{
    return (unsigned)n < 2 ? numerics_names[n] : "unknown";
}

bool devio_numerics_parse(const char *s, devio_numerics *out)
{
    for (int i = 0; s && i < 2; i++)
        if (strcmp(s, numerics_names[i]) == 0) {
            *out = (devio_numerics)i;
            return true;
        }
    return false;
}

/* --threads 0: the CPUs this process may use (affinity and cgroup quota, common/cpus.h). */
static uint32_t default_threads(void) { return devio_usable_cpus(); }

devio_status dv_config_check(devio_config *c, const devio_model *m, devio_error *err)
{
    if (c->block_size == 0 || c->block_size > 1024)
        return devio_fail(err, DEVIO_E_INVALID, "block_size must be in 1..1024");
    if (c->max_depth == 0 || c->max_depth > 64)
        return devio_fail(err, DEVIO_E_INVALID, "max_depth must be in 1..64");
    if (c->max_seqs == 0 || c->max_rows == 0 || c->max_batch_tokens == 0)
        return devio_fail(err, DEVIO_E_INVALID, "max_seqs, max_rows, max_batch_tokens must be > 0");
    if (c->logits_handles == 0 || c->logits_rows == 0)
        return devio_fail(err, DEVIO_E_INVALID, "logits_handles and logits_rows must be > 0");
    if (c->numerics != DEVIO_NUMERICS_STRICT && c->numerics != DEVIO_NUMERICS_FAST)
        return devio_fail(err, DEVIO_E_INVALID, "numerics must be strict or fast");
    uint32_t model_max = m->cfg.max_position_embeddings ? m->cfg.max_position_embeddings : 4096;
    if (c->max_seq_len == 0)
        c->max_seq_len = model_max < DEVIO_MAX_SEQ_LEN_DEFAULT ? model_max
                                                              : DEVIO_MAX_SEQ_LEN_DEFAULT;
    if (c->max_seq_len > model_max)
        return devio_fail(err, DEVIO_E_INVALID, "max_seq_len %u exceeds the model's %u positions",
                          c->max_seq_len, model_max);
    if (c->kv_blocks >= DEVIO_KV_BLOCK_RELEASED)
        return devio_fail(err, DEVIO_E_INVALID, "kv_blocks must be below %u",
                          DEVIO_KV_BLOCK_RELEASED);
    if (c->max_rows > c->max_batch_tokens)
        c->max_rows = c->max_batch_tokens;
    uint32_t per_seq = (c->max_seq_len + c->block_size - 1) / c->block_size;
    if (c->kv_blocks == 0) {
        /* 16 full-length sequences, within the memory budget, and one at
         * least (a smaller pool could never hold a sequence it admits). */
        uint64_t want = (uint64_t)per_seq * (c->max_seqs < 16 ? c->max_seqs : 16);
        uint64_t per_block = devio_kv_block_bytes(&m->cfg, c->block_size,
                                                  c->numerics == DEVIO_NUMERICS_FAST);
        uint64_t budget = (uint64_t)(c->kv_memory_mib ? c->kv_memory_mib : 1024) << 20;
        if (per_block > 0 && want > budget / per_block)
            want = budget / per_block > per_seq ? budget / per_block : per_seq;
        c->kv_blocks = (uint32_t)(want > 1u << 20 ? 1u << 20 : want);
    }
    if (c->threads == 0)
        c->threads = default_threads();
    if (c->first_ticket_id == 0)
        c->first_ticket_id = 1;
    if (c->first_seq_id == 0)
        c->first_seq_id = 1;
    if (c->first_logits_id == 0)
        c->first_logits_id = 1;
#ifdef DEVIO_NO_THREADS
    c->use_worker_thread = false;
    c->threads = 1;
#endif
    return DEVIO_OK;
}
