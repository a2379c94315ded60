/* adapter.c - loads a PEFT LoRA adapter for a loaded base model: where each target lives, tensor names, views (target names: lora_target.c; paths: adapter_files.c; config: adapter_config.c).
 * It must never accept a tensor it would not apply, or leave anything behind on failure. */
#include "device/adapter/adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/adapter/adapter_config.h"
#include "device/adapter/adapter_files.h"
#include "device/numerics/numerics.h"
#include "device/model/safetensors.h"
#include "common/sha256.h"
#include "device/status.h"

/* PEFT's prefix for a causal LM's decoder layers, adapter name removed as
 * get_peft_model_state_dict saves it: the model's own module path under
 * base_model.model. */
static const char *tensor_prefix(devio_arch arch)
{
    return arch == DEVIO_ARCH_MAMBA2 ? "base_model.model.backbone.layers."
                                     : "base_model.model.model.layers.";
}

/* The submodule holding target t in a decoder layer of arch. */
static const char *target_block(devio_arch arch, devio_lora_target t)
{
    switch (t) {
    case DEVIO_LORA_Q:
    case DEVIO_LORA_K:
    case DEVIO_LORA_V:
    case DEVIO_LORA_O: return "self_attn";
    case DEVIO_LORA_GATE:
    case DEVIO_LORA_UP:
    case DEVIO_LORA_DOWN: return arch == DEVIO_ARCH_BAMBA ? "feed_forward" : "mlp";
    default: return arch == DEVIO_ARCH_BAMBA ? "mamba" : "mixer";
    }
}

/* Storage behind the tensor views. */
typedef struct adapter_priv {
    devio_st_file *file; /* the weights file, read into memory for the adapter's life */
    struct owned_copy {
        void *p;
        size_t n;
    } *owned; /* aligned copies of tensors stored at unaligned offsets (devio_st_pages) */
    size_t n_owned;
} adapter_priv;

bool devio_lora_target_dims(const devio_model *base, uint32_t layer, devio_lora_target target,
                            uint64_t *out_dim, uint64_t *in_dim)
{
    if (!base || layer >= base->cfg.n_layers || (unsigned)target >= DEVIO_LORA_N_TARGETS)
        return false;
    const devio_layer *ly = &base->layers[layer];
    const devio_tensor *w = NULL;
    switch (target) {
    case DEVIO_LORA_Q: w = &ly->wq; break;
    case DEVIO_LORA_K: w = &ly->wk; break;
    case DEVIO_LORA_V: w = &ly->wv; break;
    case DEVIO_LORA_O: w = &ly->wo; break;
    case DEVIO_LORA_GATE: w = &ly->w_gate; break;
    case DEVIO_LORA_UP: w = &ly->w_up; break;
    case DEVIO_LORA_DOWN: w = &ly->w_down; break;
    case DEVIO_LORA_IN_PROJ: w = &ly->mixer.in_proj; break;
    case DEVIO_LORA_OUT_PROJ: w = &ly->mixer.out_proj; break;
    case DEVIO_LORA_N_TARGETS: return false;
    }
    if (!w->data)
        return false;
    *out_dim = w->shape[0];
    *in_dim = w->shape[1];
    return true;
}

/* ---- tensors ---- */

static devio_status priv_own(adapter_priv *p, void *buf, size_t n, size_t cap)
{
    if (p->n_owned == cap)
        return DEVIO_E_NOMEM;
    p->owned[p->n_owned++] = (struct owned_copy){buf, n};
    return DEVIO_OK;
}

/* Parses "{prefix}{i}.{block}.{proj}.lora_{A|B}.weight" for arch.
 * Layer numbers must be written canonically (no sign, no leading zero), so
 * two names never denote the same module. */
static bool parse_tensor_name(devio_arch arch, const char *s, uint32_t *layer,
                              devio_lora_target *t, int *ab)
{
    const char *prefix = tensor_prefix(arch);
    size_t np = strlen(prefix);
    if (strncmp(s, prefix, np) != 0)
        return false;
    s += np;
    if (s[0] < '0' || s[0] > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
        return false;
    uint32_t li = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (++digits > 9)
            return false;
        li = li * 10 + (uint32_t)(*s - '0');
    }
    if (*s++ != '.')
        return false;
    for (int i = 0; i < DEVIO_LORA_N_TARGETS; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s.%s.lora_", target_block(arch, (devio_lora_target)i),
                 devio_lora_target_name((devio_lora_target)i));
        size_t n = strlen(want);
        if (strncmp(s, want, n) != 0)
            continue;
        const char *r = s + n;
        if ((r[0] != 'A' && r[0] != 'B') || strcmp(r + 1, ".weight") != 0)
            return false;
        *layer = li;
        *t = (devio_lora_target)i;
        *ab = r[0] == 'A' ? 0 : 1;
        return true;
    }
    return false;
}

void devio_lora_tensor_name(const devio_model *base, uint32_t layer, devio_lora_target target,
                            int ab, char *dst, size_t cap)
{
    devio_arch arch = base->cfg.arch;
    if ((unsigned)target >= DEVIO_LORA_N_TARGETS)
        target = DEVIO_LORA_Q;
    snprintf(dst, cap, "%s%u.%s.%s.lora_%c.weight", tensor_prefix(arch), layer,
             target_block(arch, target), devio_lora_target_name(target), ab ? 'B' : 'A');
}

/* Checks one tensor's dtype and [s0, s1] shape and makes the view
 * (devio_st_view), copying it when the file stores it at an offset its
 * element size does not divide. Adapters are small, so they are always
 * scanned: a NaN one is refused here (DEVIO_E_MODEL, as a malformed file)
 * instead of failing steps. */
static devio_status bind_tensor(const devio_st_tensor *t, const char *label, uint64_t s0,
                                uint64_t s1, const char *why, adapter_priv *priv,
                                size_t owned_cap, devio_tensor *out, devio_error *err)
{
    devio_st_want want = {.ndim = 2, .s0 = s0, .s1 = s1, .refuse = DEVIO_E_INVALID, .why = why,
                          .scan = true};
    void *copy;
    devio_status st = devio_st_view(priv->file, t, label, &want, out, &copy, err);
    if (st == DEVIO_OK && copy && priv_own(priv, copy, (size_t)t->nbytes, owned_cap) != DEVIO_OK) {
        devio_st_pages_free(copy, (size_t)t->nbytes);
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory", label);
    }
    return st;
}

/* Matches the file's tensors to the modules the config names: first every
 * tensor in the file must be one the config asks for (so nothing is
 * silently ignored), then every module asked for must have both tensors
 * with the base model's shapes. */
static devio_status bind_tensors(devio_adapter *a, const devio_lora_config *c,
                                 const devio_model *base, adapter_priv *priv, const char *label,
                                 devio_error *err)
{
    const uint32_t L = base->cfg.n_layers, N = DEVIO_LORA_N_TARGETS;
    const devio_st_file *f = priv->file;
    size_t n_slots = (size_t)L * N * 2;
    const devio_st_tensor **found = calloc(n_slots ? n_slots : 1, sizeof *found);
    priv->owned = calloc(n_slots ? n_slots : 1, sizeof *priv->owned);
    devio_status st = DEVIO_OK;
    if (!found || !priv->owned) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory loading %.120s", label);
        goto out;
    }
    for (size_t i = 0; i < devio_st_count(f); i++) {
        const devio_st_tensor *t = devio_st_at(f, i);
        uint32_t li;
        devio_lora_target tg;
        int ab;
        uint64_t od, id;
        if (!parse_tensor_name(base->cfg.arch, t->name, &li, &tg, &ab)) {
            st = devio_fail(err, DEVIO_E_UNSUPPORTED,
                            "%.100s: tensor '%.90s' is not a lora_A or lora_B weight of a "
                            "q/k/v/o/gate/up/down/in/out projection of this model",
                            label, t->name);
            goto out;
        }
        if (li >= L) {
            st = devio_fail(err, DEVIO_E_INVALID,
                            "%.100s: tensor '%.90s' is for layer %u, but the base model has %u "
                            "layers",
                            label, t->name, li, L);
            goto out;
        }
        if (!(c->targets & (1u << tg))) {
            st = devio_fail(err, DEVIO_E_INVALID,
                            "%.100s: tensor '%.90s' adapts %s, which target_modules does not "
                            "name",
                            label, t->name, devio_lora_target_name(tg));
            goto out;
        }
        if (!c->layer_on[li]) {
            st = devio_fail(err, DEVIO_E_INVALID,
                            "%.100s: tensor '%.90s' is for layer %u, which "
                            "layers_to_transform leaves out",
                            label, t->name, li);
            goto out;
        }
        if (!devio_lora_target_dims(base, li, tg, &od, &id)) {
            st = devio_fail(err, DEVIO_E_INVALID,
                            "%.100s: tensor '%.90s' adapts %s of layer %u, which that layer "
                            "does not have",
                            label, t->name, devio_lora_target_name(tg), li);
            goto out;
        }
        found[((size_t)li * N + tg) * 2 + (size_t)ab] = t;
    }
    char name[160], why[96];
    for (uint32_t li = 0; li < L; li++) {
        if (!c->layer_on[li])
            continue;
        for (uint32_t tg = 0; tg < N; tg++) {
            if (!(c->targets & (1u << tg)))
                continue;
            uint64_t od, id;
            if (!devio_lora_target_dims(base, li, (devio_lora_target)tg, &od, &id))
                continue; /* a layer without the module (hybrid models) */
            devio_lora_module *m = &a->mods[(size_t)li * N + tg];
            for (int ab = 0; ab < 2; ab++) {
                const devio_st_tensor *t = found[((size_t)li * N + tg) * 2 + (size_t)ab];
                if (!t) {
                    devio_lora_tensor_name(base, li, (devio_lora_target)tg, ab, name,
                                           sizeof name);
                    st = devio_fail(err, DEVIO_E_INVALID, "%.100s: tensor '%.90s' is missing",
                                    label, name);
                    goto out;
                }
                snprintf(why, sizeof why, "rank %u; the base model's %s is [%llu, %llu]",
                         c->rank, devio_lora_target_name(tg), (unsigned long long)od,
                         (unsigned long long)id);
                st = ab == 0 ? bind_tensor(t, label, c->rank, id, why, priv, n_slots, &m->a, err)
                             : bind_tensor(t, label, od, c->rank, why, priv, n_slots, &m->b, err);
                if (st != DEVIO_OK)
                    goto out;
            }
        }
    }
out:
    free(found);
    return st;
}

/* The targets some layer of the model has. */
static uint32_t model_targets(const devio_model *base)
{
    uint32_t have = 0;
    uint64_t od, id;
    for (uint32_t li = 0; li < base->cfg.n_layers; li++)
        for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++)
            if (devio_lora_target_dims(base, li, (devio_lora_target)t, &od, &id))
                have |= 1u << t;
    return have;
}

/* ---- public ---- */

devio_status devio_adapter_load(const char *root, const char *rel_path, const char *name,
                                const devio_model *base, uint32_t max_rank, devio_adapter **out,
                                devio_error *err)
{
    if (!out)
        return devio_fail(err, DEVIO_E_INVALID, "adapter load needs somewhere to put it");
    *out = NULL;
    if (!base)
        return devio_fail(err, DEVIO_E_INVALID, "adapter load needs a base model");
    if (!name || !name[0] || strlen(name) >= sizeof((devio_adapter *)0)->name)
        return devio_fail(err, DEVIO_E_INVALID, "adapter name must be 1 to %zu bytes",
                          sizeof((devio_adapter *)0)->name - 1);
    if (rel_path && strlen(rel_path) >= sizeof((devio_adapter *)0)->path)
        return devio_fail(err, DEVIO_E_INVALID, "adapter path is longer than %zu bytes",
                          sizeof((devio_adapter *)0)->path - 1);

    devio_adapter_fds F;
    devio_status st = devio_adapter_open(root, rel_path, true, &F, err);
    if (st != DEVIO_OK)
        return st;

    char clabel[320], wlabel[320];
    snprintf(clabel, sizeof clabel, "%s/%s", rel_path, DEVIO_ADAPTER_CONFIG_NAME);
    snprintf(wlabel, sizeof wlabel, "%s/%s", rel_path, DEVIO_ADAPTER_WEIGHTS_NAME);
    const uint32_t L = base->cfg.n_layers;
    devio_lora_config c = {0};
    devio_adapter *a = calloc(1, sizeof *a);
    adapter_priv *priv = calloc(1, sizeof *priv);
    c.layer_on = calloc(L ? L : 1, sizeof *c.layer_on);
    if (a)
        a->mods = calloc((size_t)(L ? L : 1) * DEVIO_LORA_N_TARGETS, sizeof *a->mods);
    if (!a || !priv || !c.layer_on || !a->mods) {
        if (a)
            free(a->mods);
        free(a);
        free(priv);
        a = NULL;
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory loading adapter '%s'", name);
        goto out;
    }
    a->priv = priv;

    if ((st = devio_lora_config_load(F.config, clabel, L, max_rank, &c, err)) != DEVIO_OK)
        goto out;
    /* The weights are read into memory once, and the digest is taken of
     * those very bytes: the record can never describe other weights than
     * the ones computed with, whatever happens to the file afterwards. */
    if ((st = devio_st_open_fd(F.weights, wlabel, NULL, &priv->file, err)) != DEVIO_OK)
        goto out;
    size_t nbytes;
    const uint8_t *bytes = devio_st_bytes(priv->file, &nbytes);
    uint8_t digest[32];
    devio_sha256 h;
    devio_sha256_init(&h);
    devio_sha256_update(&h, bytes, nbytes);
    devio_sha256_final(&h, digest);
    devio_sha256_hex(digest, a->sha256);
    a->size = nbytes;
    if ((st = bind_tensors(a, &c, base, priv, wlabel, err)) != DEVIO_OK)
        goto out;

    snprintf(a->name, sizeof a->name, "%s", name);
    snprintf(a->path, sizeof a->path, "%s", rel_path);
    a->rank = c.rank;
    a->alpha = c.alpha;
    a->use_rslora = c.use_rslora;
    a->scale = c.use_rslora ? c.alpha / devio_num_sqrt((float)c.rank) : c.alpha / (float)c.rank;
    /* Only modules the model has: "all-linear" names every kind there is. */
    a->targets = c.targets & model_targets(base);
    a->n_layers = L;
    *out = a;
    a = NULL;
out:
    devio_adapter_free(a);
    free(c.layer_on);
    devio_adapter_fds_close(&F);
    return st;
}

void devio_adapter_free(devio_adapter *a)
{
    if (!a)
        return;
    adapter_priv *p = a->priv;
    if (p) {
        for (size_t i = 0; i < p->n_owned; i++)
            devio_st_pages_free(p->owned[i].p, p->owned[i].n);
        free(p->owned);
        devio_st_close(p->file);
        free(p);
    }
    free(a->mods);
    free(a);
}
