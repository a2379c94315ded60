/* options.c - the table of options.h; defaults are devio_config_default()'s. */
#include "device/core/options.h"

#include <stddef.h>

#include "device/devio.h"
#include "device/model/model.h"

static bool parse_numerics(const char *v, void *field)
{
    return devio_numerics_parse(v, field);
}

#define D(f) offsetof(devio_config, f)
const devio_opt devio_config_options[] = {
    {.flag = "numerics", .type = DEVIO_OPT_CUSTOM, .offset = D(numerics), .metavar = "strict|fast",
     .help = "bit-identical to the reference, or a backend's own kernels [strict]",
     .parse = parse_numerics},
    {.flag = "threads", .type = DEVIO_OPT_U32, .offset = D(threads), .metavar = "N",
     .help = "compute threads, 0 = the CPUs this process may use (affinity, cgroup quota) [0]"},
    {.flag = "kv-blocks", .type = DEVIO_OPT_U32, .offset = D(kv_blocks), .metavar = "N",
     .help = "KV cache blocks, 0 = derived: 16 full-length sequences within --kv-memory, or "
             "what the device fits [0]"},
    {.flag = "kv-memory", .type = DEVIO_OPT_U32, .offset = D(kv_memory_mib), .metavar = "MIB",
     .help = "most memory the derived KV pool takes, in MiB, 0 = 1024 [0]"},
    {.flag = "block-size", .type = DEVIO_OPT_U32, .offset = D(block_size), .metavar = "N",
     .help = "tokens per KV block [16]"},
    {.flag = "max-depth", .type = DEVIO_OPT_U32, .offset = D(max_depth), .metavar = "N",
     .help = "tickets in flight [2]"},
    {.flag = "max-seqs", .type = DEVIO_OPT_U32, .offset = D(max_seqs), .metavar = "N",
     .help = "live sequences [256]"},
    {.flag = "max-seq-len", .type = DEVIO_OPT_U32, .offset = D(max_seq_len), .metavar = "N",
     .help = "positions per sequence, 0 = the model's, at most 131072 [0]"},
    {.flag = "max-rows", .type = DEVIO_OPT_U32, .offset = D(max_rows), .metavar = "N",
     .help = "rows per plan [64]"},
    {.flag = "max-batch-tokens", .type = DEVIO_OPT_U32, .offset = D(max_batch_tokens),
     .metavar = "N", .help = "tokens per plan [2048]"},
    {.flag = "logits-handles", .type = DEVIO_OPT_U32, .offset = D(logits_handles), .metavar = "N",
     .help = "live logits handles [64]"},
    {.flag = "logits-rows", .type = DEVIO_OPT_U32, .offset = D(logits_rows), .metavar = "N",
     .help = "live logits positions over all handles [256]"},
    {.flag = "max-loras", .type = DEVIO_OPT_U32, .offset = D(max_loras), .metavar = "N",
     .help = "adapters loaded at once [4]"},
    {.flag = "max-lora-rank", .type = DEVIO_OPT_U32, .offset = D(max_lora_rank), .metavar = "N",
     .help = "largest adapter rank [64]"},
    {.flag = "ssm-slots", .type = DEVIO_OPT_U32, .offset = D(ssm_slots), .metavar = "N",
     .help = "SSM state slots (hybrid models), 0 = derived from memory [0]"},
    {.flag = "ssm-snapshots", .type = DEVIO_OPT_U32, .offset = D(ssm_snapshots), .metavar = "N",
     .help = "SSM snapshots (hybrid models), 0 = derived from memory [0]"},
    {.flag = "park-memory", .type = DEVIO_OPT_U32, .offset = D(park_memory_mib), .metavar = "MIB",
     .help = "host memory parked sequences' states may take, MiB [1024]"},
    {.flag = NULL},
};
#undef D

#define M(f) offsetof(devio_model_params, f)
const devio_opt devio_model_options[] = {
    {.flag = "skip-weight-scan", .type = DEVIO_OPT_BOOL, .offset = M(skip_weight_scan),
     .help = "load the model without scanning its weights for NaN and infinities [false]"},
    {.flag = NULL},
};
#undef M
