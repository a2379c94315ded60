/* lora_target.c - the PEFT module name of each LoRA target, both ways.
 * A table of names only: it must never learn a model's layout or read an adapter. */
#include "device/adapter/lora_target.h"

#include <string.h>

static const char *const target_names[DEVIO_LORA_N_TARGETS] = {
    [DEVIO_LORA_Q] = "q_proj",       [DEVIO_LORA_K] = "k_proj",
    [DEVIO_LORA_V] = "v_proj",       [DEVIO_LORA_O] = "o_proj",
    [DEVIO_LORA_GATE] = "gate_proj", [DEVIO_LORA_UP] = "up_proj",
    [DEVIO_LORA_DOWN] = "down_proj", [DEVIO_LORA_IN_PROJ] = "in_proj",
    [DEVIO_LORA_OUT_PROJ] = "out_proj",
};

const char *devio_lora_target_name(devio_lora_target t)
{
    if ((unsigned)t >= DEVIO_LORA_N_TARGETS)
        return "?";
    return target_names[t];
}

bool devio_lora_target_parse(const char *name, devio_lora_target *t)
{
    if (!name)
        return false;
    for (int i = 0; i < DEVIO_LORA_N_TARGETS; i++) {
        if (strcmp(name, target_names[i]) == 0) {
            *t = (devio_lora_target)i;
            return true;
        }
    }
    return false;
}
