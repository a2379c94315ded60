/* lora_target.h - the projections a LoRA adapter may target, and their PEFT module names.
 * Names only: it knows neither where a module lives in a model nor how an adapter is loaded. */
#ifndef DEVIO_LORA_TARGET_H
#define DEVIO_LORA_TARGET_H

#include <stdbool.h>

/* The projections an adapter may target, in PEFT's module names. */
typedef enum devio_lora_target {
    DEVIO_LORA_Q = 0, /* self_attn.q_proj */
    DEVIO_LORA_K,     /* self_attn.k_proj */
    DEVIO_LORA_V,     /* self_attn.v_proj */
    DEVIO_LORA_O,     /* self_attn.o_proj */
    DEVIO_LORA_GATE,  /* mlp.gate_proj */
    DEVIO_LORA_UP,    /* mlp.up_proj */
    DEVIO_LORA_DOWN,  /* mlp.down_proj (Bamba: feed_forward.down_proj) */
    DEVIO_LORA_IN_PROJ,  /* the Mamba-2 mixer's in_proj (Bamba: mamba., Mamba2: mixer.) */
    DEVIO_LORA_OUT_PROJ, /* the mixer's out_proj */
    DEVIO_LORA_N_TARGETS
} devio_lora_target;

#define DEVIO_LORA_ALL_TARGETS ((1u << DEVIO_LORA_N_TARGETS) - 1u)

/* "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
 * "in_proj", "out_proj"; "?" for a value outside the enum. Static storage. */
const char *devio_lora_target_name(devio_lora_target t);

/* Inverse of devio_lora_target_name. False (and *t untouched) for any other
 * string, NULL included. */
bool devio_lora_target_parse(const char *name, devio_lora_target *t);

#endif
