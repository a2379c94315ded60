/* options.h - devio_config's command-line options, one table for every binary
 * that opens a device (devio-server, devio-ref): --threads, --kv-blocks,
 * --block-size, --max-depth, --max-seqs, --max-seq-len, --max-rows,
 * --max-batch-tokens, --logits-handles, --logits-rows, --max-loras,
 * --max-lora-rank, --numerics,
 * --ssm-slots, --ssm-snapshots; and devio_model_params's, --skip-weight-scan.
 * Static data only. */
#ifndef DEVIO_OPTIONS_H
#define DEVIO_OPTIONS_H

#include "common/cli.h"

/* Offsets are within devio_config; the table ends at an entry whose flag is
 * NULL. Use as a group: {devio_config_options, offsetof(T, config_field)}. */
extern const devio_opt devio_config_options[];
/* Offsets are within devio_model_params (device/model/model.h), the options
 * of loading the model: {devio_model_options, offsetof(T, params_field)}. */
extern const devio_opt devio_model_options[];

#endif
