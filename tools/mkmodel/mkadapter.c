/* mkadapter.c - writes deterministic random PEFT LoRA adapters (adapter_config.json, adapter_model.safetensors) for a written base model.
 * It must never let anything but the options and the base model's shapes shape its bytes, nor write a tensor the adapter loader would refuse. */
#include "tools/mkmodel/mkmodel.h"

#include <stdio.h>
#include <stdlib.h>

#include "tools/mkmodel/mkwrite.h"

#define MK_MAX_RANK 65536u

devio_mkmodel_adapter_opts devio_mkmodel_adapter_opts_default(void)
{
    devio_mkmodel_adapter_opts o = {
        .rank = 8,
        .alpha = 8.0,
        .targets = (1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_V),
        .dtype = DEVIO_F32,
        .seed = 0,
    };
    return o;
}

static devio_status mk_adapter_check(const devio_mkmodel_adapter_opts *o, devio_error *err)
{
    if (!o->model_dir || !o->model_dir[0]) {
        devio_fail(err, DEVIO_E_INVALID, "no base model directory given");
        return DEVIO_E_INVALID;
    }
    if (o->rank == 0 || o->rank > MK_MAX_RANK) {
        devio_fail(err, DEVIO_E_INVALID, "rank must be in [1, %u], got %u", MK_MAX_RANK, o->rank);
        return DEVIO_E_INVALID;
    }
    /* Written as !(x > 0) so that a NaN is refused too; float range because
     * the loader keeps alpha in binary32. */
    if (!(o->alpha > 0.0) || o->alpha > 3.0e38) {
        devio_fail(err, DEVIO_E_INVALID, "alpha must be in (0, 3e38], got %g", o->alpha);
        return DEVIO_E_INVALID;
    }
    if (o->targets == 0 || (o->targets & ~DEVIO_LORA_ALL_TARGETS) != 0) {
        devio_fail(err, DEVIO_E_INVALID, "targets must name at least one of q_proj k_proj v_proj "
                   "o_proj gate_proj up_proj down_proj");
        return DEVIO_E_INVALID;
    }
    if (o->dtype != DEVIO_F32 && o->dtype != DEVIO_F16 && o->dtype != DEVIO_BF16) {
        devio_fail(err, DEVIO_E_INVALID, "dtype must be f32, f16 or bf16");
        return DEVIO_E_INVALID;
    }
    return DEVIO_OK;
}

/* Every lora_A and lora_B tensor of the adapter, sorted by name, packed into
 * one file. Shapes and names come from the loaded base model, the same views
 * the adapter loader checks against; a targeted module a layer lacks (q_proj
 * of a Bamba mixer layer) is skipped there. *written: the targets some layer
 * has, which target_modules lists. */
static devio_status mk_adapter_list(const devio_mkmodel_adapter_opts *o, mk_list *L,
                                    uint32_t *written, devio_error *err)
{
    *written = 0;
    L->t = NULL;
    L->n = 0;
    devio_status st = mk_adapter_check(o, err);
    if (st != DEVIO_OK)
        return st;
    devio_model *m = NULL;
    if ((st = devio_model_load(o->model_dir, &m, err)) != DEVIO_OK)
        return st;
    size_t n_targets = 0;
    for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++)
        n_targets += (o->targets >> t) & 1u;
    size_t n = (size_t)m->cfg.n_layers * n_targets * 2;
    L->t = calloc(n, sizeof *L->t);
    if (!L->t) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory for %zu tensor entries", n);
        devio_model_free(m);
        return DEVIO_E_NOMEM;
    }
    const float b_scale = 0.5f * mk_inv_sqrt(o->rank);
    char name[MK_NAME_MAX];
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
            if (!((o->targets >> t) & 1u))
                continue;
            uint64_t out_dim, in_dim;
            if (!devio_lora_target_dims(m, i, (devio_lora_target)t, &out_dim, &in_dim))
                continue;
            *written |= 1u << t;
            devio_lora_tensor_name(m, i, (devio_lora_target)t, 0, name, sizeof name);
            mk_add(L, name, 2, o->rank, in_dim, MK_INIT_LINEAR, mk_inv_sqrt(in_dim));
            devio_lora_tensor_name(m, i, (devio_lora_target)t, 1, name, sizeof name);
            mk_add(L, name, 2, out_dim, o->rank, MK_INIT_LINEAR, b_scale);
        }
    }
    devio_model_free(m);
    mk_list_sort(L);
    const uint64_t es = mk_dtype_size(o->dtype);
    uint64_t at = 0;
    for (size_t i = 0; i < L->n; i++) {
        L->t[i].shard = 0;
        L->t[i].offset = at;
        at += L->t[i].nelem * es;
    }
    return DEVIO_OK;
}

/* A JSON string literal for arbitrary bytes of a path. */
static void mk_json_string(mk_buf *b, const char *s)
{
    mk_buf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            mk_buf_printf(b, "\\%c", *p);
        else if (*p < 0x20)
            mk_buf_printf(b, "\\u%04x", *p);
        else
            mk_buf_printf(b, "%c", *p);
    }
    mk_buf_printf(b, "\"");
}

/* PEFT's save_pretrained layout: sorted keys, two-space indent. */
static void mk_adapter_config(const devio_mkmodel_adapter_opts *o, uint32_t targets,
                              mk_buf *b)
{
    /* target_modules sorted by name, as a set printed by PEFT would be. */
    static const devio_lora_target by_name[DEVIO_LORA_N_TARGETS] = {
        DEVIO_LORA_DOWN, DEVIO_LORA_GATE,     DEVIO_LORA_IN_PROJ, DEVIO_LORA_K,  DEVIO_LORA_O,
        DEVIO_LORA_OUT_PROJ, DEVIO_LORA_Q,    DEVIO_LORA_UP,      DEVIO_LORA_V,
    };
    mk_buf_printf(b, "{\n  \"base_model_name_or_path\": ");
    mk_json_string(b, o->model_dir);
    mk_buf_printf(b, ",\n  \"bias\": \"none\",\n");
    mk_buf_printf(b, "  \"fan_in_fan_out\": false,\n");
    mk_buf_printf(b, "  \"inference_mode\": true,\n");
    if (o->alpha < 1e15 && (double)(long long)o->alpha == o->alpha)
        mk_buf_printf(b, "  \"lora_alpha\": %lld,\n", (long long)o->alpha); /* PEFT's int */
    else {
        mk_buf_printf(b, "  \"lora_alpha\": ");
        mk_json_double(b, o->alpha);
        mk_buf_printf(b, ",\n");
    }
    mk_buf_printf(b, "  \"lora_dropout\": 0.0,\n");
    mk_buf_printf(b, "  \"peft_type\": \"LORA\",\n");
    mk_buf_printf(b, "  \"r\": %u,\n", o->rank);
    mk_buf_printf(b, "  \"target_modules\": [");
    bool first = true;
    for (int i = 0; i < DEVIO_LORA_N_TARGETS; i++) {
        if (!((targets >> by_name[i]) & 1u))
            continue;
        mk_buf_printf(b, "%s\n    \"%s\"", first ? "" : ",", devio_lora_target_name(by_name[i]));
        first = false;
    }
    mk_buf_printf(b, "\n  ],\n");
    mk_buf_printf(b, "  \"task_type\": \"CAUSAL_LM\",\n");
    mk_buf_printf(b, "  \"use_rslora\": %s\n}\n", o->use_rslora ? "true" : "false");
}

devio_status devio_mkmodel_write_adapter(const devio_mkmodel_adapter_opts *o, devio_error *err)
{
    if (!o->out_dir || !o->out_dir[0]) {
        devio_fail(err, DEVIO_E_INVALID, "no output directory given");
        return DEVIO_E_INVALID;
    }
    /* Options and the base model are checked before the file system is touched. */
    mk_list L = {0};
    uint32_t targets;
    devio_status st = mk_adapter_list(o, &L, &targets, err);
    if (st != DEVIO_OK)
        return st;
    if (targets == 0) {
        free(L.t);
        return devio_fail(err, DEVIO_E_INVALID, "the base model has none of the targeted modules");
    }
    mk_buf cb = {0};
    mk_chunk ck = {0};
    if ((st = mk_chunk_alloc(&ck, err)) != DEVIO_OK ||
        (st = mk_mkdirs(o->out_dir, err)) != DEVIO_OK)
        goto out;
    if ((st = mk_write_st(o->out_dir, "adapter_model.safetensors", &L, 0, o->dtype, o->seed, &ck,
                          err)) != DEVIO_OK)
        goto out;
    /* The config last, as for models: a directory with a config is complete. */
    mk_adapter_config(o, targets, &cb);
    st = mk_write_json(o->out_dir, "adapter_config.json", &cb, err);
out:
    free(cb.s);
    mk_chunk_free(&ck);
    free(L.t);
    return st;
}

devio_status devio_mkmodel_adapter_values(const devio_mkmodel_adapter_opts *o, const char *name,
                                          uint64_t start, size_t n, float *dst,
                                          devio_error *err)
{
    mk_list L;
    uint32_t targets;
    devio_status st = mk_adapter_list(o, &L, &targets, err);
    if (st != DEVIO_OK)
        return st;
    st = mk_list_values(&L, o->seed, name, start, n, dst, "adapter", err);
    free(L.t);
    return st;
}
