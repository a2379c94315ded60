/* adapter.c - loads a PEFT LoRA adapter directory for a loaded base model and hashes its weights file.
 * It must never open a file outside the adapters root, accept a tensor it would not apply, or leave anything behind on failure. */
/* glibc declares realpath() only for XSI; the build's _POSIX_C_SOURCE alone hides it. */
#define _XOPEN_SOURCE 700
#include "device/adapter.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/sha256.h"
#include "device/numerics.h"
#include "device/safetensors.h"
#include "device/status.h"

#define CONFIG_NAME "adapter_config.json"
#define WEIGHTS_NAME "adapter_model.safetensors"
/* PEFT's LoraConfig default for lora_alpha. */
#define DEFAULT_ALPHA 8.0
/* An adapter_config.json is a few hundred bytes; anything this large is not one. */
#define MAX_CONFIG_BYTES (4 * 1024 * 1024)
/* PEFT's prefix for a causal LM's decoder layers, adapter name removed as
 * get_peft_model_state_dict saves it. */
#define TENSOR_PREFIX "base_model.model.model.layers."
#define HASH_CHUNK 65536

static const struct {
    const char *name;  /* PEFT module name, as in target_modules */
    const char *block; /* the submodule holding it in a Llama decoder layer */
} target_info[DEVIO_LORA_N_TARGETS] = {
    [DEVIO_LORA_Q] = {"q_proj", "self_attn"},   [DEVIO_LORA_K] = {"k_proj", "self_attn"},
    [DEVIO_LORA_V] = {"v_proj", "self_attn"},   [DEVIO_LORA_O] = {"o_proj", "self_attn"},
    [DEVIO_LORA_GATE] = {"gate_proj", "mlp"},   [DEVIO_LORA_UP] = {"up_proj", "mlp"},
    [DEVIO_LORA_DOWN] = {"down_proj", "mlp"},
};

/* Storage behind the tensor views. */
typedef struct adapter_priv {
    devio_st_file *file; /* mapped (native) or read (WASI) for the adapter's life */
    void **owned;        /* aligned copies of tensors stored at unaligned offsets */
    size_t n_owned;
} adapter_priv;

/* What adapter_config.json says, after checking. */
typedef struct lora_config {
    uint32_t rank;
    float alpha;
    bool use_rslora;
    uint32_t targets;
    bool *layer_on; /* n_layers entries: layers_to_transform */
} lora_config;

/* Resolved, contained paths of one adapter directory. */
typedef struct adapter_paths {
    char *dir;
    char *config;
    char *weights;
} adapter_paths;

/* Who a file is, to notice it being replaced between hashing and mapping. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} file_id;

const char *devio_lora_target_name(devio_lora_target t)
{
    if ((unsigned)t >= DEVIO_LORA_N_TARGETS)
        return "?";
    return target_info[t].name;
}

bool devio_lora_target_parse(const char *name, devio_lora_target *t)
{
    if (!name)
        return false;
    for (int i = 0; i < DEVIO_LORA_N_TARGETS; i++) {
        if (strcmp(name, target_info[i].name) == 0) {
            *t = (devio_lora_target)i;
            return true;
        }
    }
    return false;
}

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
    case DEVIO_LORA_N_TARGETS: return false;
    }
    *out_dim = w->shape[0];
    *in_dim = w->shape[1];
    return true;
}

/* ---- paths ---- */

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static void paths_free(adapter_paths *p)
{
    free(p->dir);
    free(p->config);
    free(p->weights);
    memset(p, 0, sizeof *p);
}

/* The lexical rule every build applies before touching the file system:
 * relative, non-empty, and no ".." that climbs above the root. */
static devio_status check_rel_lexical(const char *rel, devio_error *err)
{
    if (!rel || !rel[0])
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter path is empty: it must name a directory inside the adapters "
                          "root");
    if (rel[0] == '/')
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter path '%.120s' is absolute, which is outside the adapters root "
                          "(paths are relative to it)",
                          rel);
    long depth = 0;
    for (const char *s = rel; *s;) {
        size_t n = strcspn(s, "/");
        if (n == 2 && s[0] == '.' && s[1] == '.')
            depth--;
        else if (n > 0 && !(n == 1 && s[0] == '.'))
            depth++;
        if (depth < 0)
            return devio_fail(err, DEVIO_E_INVALID,
                              "adapter path '%.120s' climbs with '..' to outside the adapters "
                              "root",
                              rel);
        s += n;
        while (*s == '/')
            s++;
    }
    return DEVIO_OK;
}

/* WASI runtimes refuse a symlink that leads out of a preopened directory
 * with ENOTCAPABLE; that is the same escape realpath() catches natively, and
 * must give the same status. */
static bool escaped(int e)
{
#ifdef ENOTCAPABLE
    return e == ENOTCAPABLE;
#else
    (void)e;
    return false;
#endif
}

#ifndef __wasi__
/* True when `p` is `root` or lies below it; both are realpath() results. */
static bool path_within(const char *root, const char *p)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return true;
    return strncmp(root, p, n) == 0 && (p[n] == '\0' || p[n] == '/');
}
#endif

/* Resolves DIR/NAME to a real, contained path. A missing file (a dangling
 * symlink included) is DEVIO_E_IO naming it. */
static devio_status resolve_file(const char *root_real, const char *dir, const char *rel,
                                 const char *name, char **out, devio_error *err)
{
    *out = NULL;
    char *p = path_join(dir, name);
    if (!p)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    struct stat sb;
    if (stat(p, &sb) != 0) {
        int e = errno;
        free(p);
        if (escaped(e))
            return devio_fail(err, DEVIO_E_INVALID,
                              "%.120s/%s is a link to outside the adapters root", rel, name);
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: %s", rel, name,
                          e == ENOENT ? "not found in the adapter directory" : strerror(e));
    }
#ifdef __wasi__
    (void)root_real;
    *out = p;
#else
    char *real = realpath(p, NULL);
    int e = errno;
    free(p);
    if (!real)
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: cannot resolve: %s", rel, name,
                          strerror(e));
    if (!path_within(root_real, real)) {
        free(real);
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.120s/%s is a link to outside the adapters root", rel, name);
    }
    *out = real;
#endif
    if (!S_ISREG(sb.st_mode)) {
        free(*out);
        *out = NULL;
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: not a regular file", rel, name);
    }
    return DEVIO_OK;
}

/* Resolves root/rel to a contained directory and, for each wanted file,
 * its contained path. Natively, root, directory and files all go through
 * realpath(), so symlinks and ".." are judged by where they lead. */
static devio_status resolve_paths(const char *root, const char *rel, bool want_config,
                                  adapter_paths *P, devio_error *err)
{
    memset(P, 0, sizeof *P);
    if (!root || !root[0])
        return devio_fail(err, DEVIO_E_INVALID, "no adapters root is configured");
    devio_status st = check_rel_lexical(rel, err);
    if (st != DEVIO_OK)
        return st;
    char *root_real = NULL;
#ifdef __wasi__
    /* No realpath: the lexical rule above plus the runtime's preopen sandbox. */
    root_real = strdup(root);
    if (!root_real)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    P->dir = path_join(root_real, rel);
    if (!P->dir) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        goto out;
    }
    struct stat sb;
    if (stat(P->dir, &sb) != 0) {
        if (escaped(errno))
            st = devio_fail(err, DEVIO_E_INVALID,
                            "adapter path '%.120s' resolves to outside the adapters root", rel);
        else
            st = devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel,
                            errno == ENOENT ? "not found in the adapters root" : strerror(errno));
        goto out;
    }
#else
    root_real = realpath(root, NULL);
    if (!root_real)
        return devio_fail(err, DEVIO_E_INVALID, "adapters root '%.120s' cannot be resolved: %s",
                          root, strerror(errno));
    char *joined = path_join(root_real, rel);
    if (!joined) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        goto out;
    }
    P->dir = realpath(joined, NULL);
    int e = errno;
    free(joined);
    if (!P->dir) {
        st = devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel,
                        e == ENOENT ? "not found in the adapters root" : strerror(e));
        goto out;
    }
    if (!path_within(root_real, P->dir)) {
        st = devio_fail(err, DEVIO_E_INVALID,
                        "adapter path '%.120s' resolves to outside the adapters root", rel);
        goto out;
    }
    struct stat sb;
    if (stat(P->dir, &sb) != 0) {
        st = devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel, strerror(errno));
        goto out;
    }
#endif
    if (!S_ISDIR(sb.st_mode)) {
        st = devio_fail(err, DEVIO_E_IO, "adapter path '%.120s' is not a directory", rel);
        goto out;
    }
    if (want_config &&
        (st = resolve_file(root_real, P->dir, rel, CONFIG_NAME, &P->config, err)) != DEVIO_OK)
        goto out;
    st = resolve_file(root_real, P->dir, rel, WEIGHTS_NAME, &P->weights, err);
out:
    free(root_real);
    if (st != DEVIO_OK)
        paths_free(P);
    return st;
}

/* ---- adapter_config.json ---- */

/* True when a JSON value switches a feature on: anything but absent, null,
 * false, or an empty string, array or object. */
static bool json_is_set(const json_t *v)
{
    if (!v || json_is_null(v) || json_is_false(v))
        return false;
    if (json_is_string(v))
        return json_string_length(v) > 0;
    if (json_is_array(v))
        return json_array_size(v) > 0;
    if (json_is_object(v))
        return json_object_size(v) > 0;
    return true;
}

static devio_status cfg_bool(const json_t *root, const char *key, const char *label, bool *out,
                             devio_error *err)
{
    const json_t *v = json_object_get(root, key);
    *out = false;
    if (!v || json_is_null(v))
        return DEVIO_OK;
    if (!json_is_boolean(v))
        return devio_fail(err, DEVIO_E_INVALID, "%.120s: '%s' is not true or false", label, key);
    *out = json_is_true(v);
    return DEVIO_OK;
}

/* One target_modules entry. */
static devio_status cfg_target(const char *s, const char *label, uint32_t *targets,
                               devio_error *err)
{
    devio_lora_target t;
    if (!devio_lora_target_parse(s, &t))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.120s: target_modules names '%.40s', which this device does not "
                          "adapt (supported: q_proj k_proj v_proj o_proj gate_proj up_proj "
                          "down_proj)",
                          label, s);
    *targets |= 1u << t;
    return DEVIO_OK;
}

static devio_status cfg_targets(const json_t *root, const char *label, uint32_t *targets,
                                devio_error *err)
{
    const json_t *v = json_object_get(root, "target_modules");
    *targets = 0;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        /* PEFT's shorthand for every linear layer but the output head. */
        if (strcmp(s, "all-linear") == 0) {
            *targets = DEVIO_LORA_ALL_TARGETS;
            return DEVIO_OK;
        }
        devio_lora_target t;
        if (devio_lora_target_parse(s, &t)) {
            *targets = 1u << t;
            return DEVIO_OK;
        }
        /* PEFT reads any other string as a regular expression over module
         * paths; only a list says unambiguously which modules are adapted. */
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.120s: target_modules '%.60s' is a pattern; only a list of module "
                          "names (or one name, or \"all-linear\") is supported",
                          label, s);
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.120s: target_modules must be a non-empty list of module names",
                          label);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e))
            return devio_fail(err, DEVIO_E_INVALID,
                              "%.120s: target_modules[%zu] is not a string", label, i);
        devio_status st = cfg_target(json_string_value(e), label, targets, err);
        if (st != DEVIO_OK)
            return st;
    }
    return DEVIO_OK;
}

static devio_status cfg_layer(const json_t *v, const char *label, uint32_t n_layers,
                              bool *layer_on, devio_error *err)
{
    if (!json_is_integer(v))
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.120s: layers_to_transform holds a value that is not an integer",
                          label);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= (json_int_t)n_layers)
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.120s: layers_to_transform names layer %lld, but the base model "
                          "has %u layers",
                          label, (long long)x, n_layers);
    layer_on[x] = true;
    return DEVIO_OK;
}

/* layers_to_transform (an int or a list) restricts the adapted layers; the
 * layer is found through layers_pattern, which for this family is "layers". */
static devio_status cfg_layers(const json_t *root, const char *label, uint32_t n_layers,
                               bool *layer_on, devio_error *err)
{
    const json_t *v = json_object_get(root, "layers_to_transform");
    if (!v || json_is_null(v)) {
        for (uint32_t i = 0; i < n_layers; i++)
            layer_on[i] = true;
        return DEVIO_OK;
    }
    const json_t *pat = json_object_get(root, "layers_pattern");
    if (pat && !json_is_null(pat)) {
        bool ok = json_is_string(pat) && strcmp(json_string_value(pat), "layers") == 0;
        if (json_is_array(pat)) {
            size_t i;
            const json_t *e;
            ok = json_array_size(pat) > 0;
            json_array_foreach(pat, i, e)
            {
                ok = ok && json_is_string(e) && strcmp(json_string_value(e), "layers") == 0;
            }
        }
        if (!ok)
            return devio_fail(err, DEVIO_E_UNSUPPORTED,
                              "%.120s: layers_pattern other than \"layers\" is not supported",
                              label);
    }
    memset(layer_on, 0, n_layers * sizeof *layer_on);
    devio_status st;
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return devio_fail(err, DEVIO_E_INVALID,
                              "%.120s: layers_to_transform is an empty list (no layer adapted)",
                              label);
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e)
        {
            if ((st = cfg_layer(e, label, n_layers, layer_on, err)) != DEVIO_OK)
                return st;
        }
        return DEVIO_OK;
    }
    return cfg_layer(v, label, n_layers, layer_on, err);
}

static devio_status parse_config(const json_t *root, const char *label, uint32_t n_layers,
                                 uint32_t max_rank, lora_config *c, devio_error *err)
{
    devio_status st;
    const json_t *v = json_object_get(root, "peft_type");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return devio_fail(err, DEVIO_E_INVALID, "%.120s: peft_type is not a string", label);
        if (strcmp(json_string_value(v), "LORA") != 0)
            return devio_fail(err, DEVIO_E_UNSUPPORTED,
                              "%.120s: peft_type '%.40s' is not supported; only LORA is", label,
                              json_string_value(v));
    }

    v = json_object_get(root, "r");
    if (!v || json_is_null(v))
        return devio_fail(err, DEVIO_E_INVALID, "%.120s: rank 'r' is missing", label);
    if (!json_is_integer(v))
        return devio_fail(err, DEVIO_E_INVALID, "%.120s: rank 'r' is not an integer", label);
    json_int_t r = json_integer_value(v);
    if (r < 1)
        return devio_fail(err, DEVIO_E_INVALID, "%.120s: rank %lld must be at least 1", label,
                          (long long)r);
    if (r > (json_int_t)max_rank)
        return devio_fail(err, DEVIO_E_INVALID, "%.120s: rank %lld exceeds max_lora_rank %u",
                          label, (long long)r, max_rank);
    c->rank = (uint32_t)r;

    v = json_object_get(root, "lora_alpha");
    double alpha = DEFAULT_ALPHA;
    if (v && !json_is_null(v)) {
        if (!json_is_number(v))
            return devio_fail(err, DEVIO_E_INVALID, "%.120s: lora_alpha is not a number", label);
        alpha = json_number_value(v);
    }
    c->alpha = (float)alpha;
    /* A finite float minus itself is zero; inf and NaN give NaN. */
    if (!(c->alpha - c->alpha == 0.0f))
        return devio_fail(err, DEVIO_E_INVALID, "%.120s: lora_alpha %g is out of range", label,
                          alpha);

    if ((st = cfg_bool(root, "use_rslora", label, &c->use_rslora, err)) != DEVIO_OK)
        return st;
    if ((st = cfg_targets(root, label, &c->targets, err)) != DEVIO_OK)
        return st;

    v = json_object_get(root, "bias");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return devio_fail(err, DEVIO_E_INVALID, "%.120s: bias is not a string", label);
        if (strcmp(json_string_value(v), "none") != 0)
            return devio_fail(err, DEVIO_E_UNSUPPORTED,
                              "%.120s: bias '%.20s' is not supported; only \"none\" is", label,
                              json_string_value(v));
    }
    /* Features that change what the adapter computes or which weights it
     * carries; applying the rest without them would give other numbers. */
    static const struct {
        const char *key, *what;
    } refused[] = {
        {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style transposed weights)"},
        {"use_dora", "use_dora (DoRA)"},
        {"lora_bias", "lora_bias"},
        {"use_qalora", "use_qalora"},
        {"rank_pattern", "rank_pattern (per-module ranks)"},
        {"alpha_pattern", "alpha_pattern (per-module alphas)"},
        {"modules_to_save", "modules_to_save"},
        {"exclude_modules", "exclude_modules"},
        {"trainable_token_indices", "trainable_token_indices"},
        {"layer_replication", "layer_replication"},
        {"target_parameters", "target_parameters"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        v = json_object_get(root, refused[i].key);
        if (json_is_set(v))
            return devio_fail(err, DEVIO_E_UNSUPPORTED, "%.120s: %s is not supported", label,
                              refused[i].what);
    }
    return cfg_layers(root, label, n_layers, c->layer_on, err);
}

static devio_status read_config(const char *path, const char *label, json_t **out,
                                devio_error *err)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return devio_fail(err, DEVIO_E_IO, "%.120s: cannot open: %s", label, strerror(errno));
    devio_status st = DEVIO_OK;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", label, strerror(errno));
        goto out;
    }
    if (sb.st_size > MAX_CONFIG_BYTES) {
        st = devio_fail(err, DEVIO_E_MODEL, "%.120s: %lld bytes is too large for an adapter "
                        "config", label, (long long)sb.st_size);
        goto out;
    }
    json_error_t jerr;
    json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = devio_fail(err, DEVIO_E_MODEL, "%.120s: not valid JSON (line %d: %.80s)", label,
                        jerr.line, jerr.text);
        goto out;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        st = devio_fail(err, DEVIO_E_MODEL, "%.120s: top level is not a JSON object", label);
        goto out;
    }
    *out = root;
out:
    fclose(fp);
    return st;
}

/* ---- the weights file ---- */

static void file_id_of(const struct stat *sb, file_id *id)
{
    id->dev = sb->st_dev;
    id->ino = sb->st_ino;
    id->size = sb->st_size;
    id->mtime = sb->st_mtim;
}

static bool file_id_equal(const file_id *a, const file_id *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Streams the file through SHA-256 without holding it in memory. */
static devio_status hash_file(const char *path, const char *label, char hex[65], uint64_t *size,
                              file_id *id, devio_error *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return devio_fail(err, DEVIO_E_IO, "%.120s: cannot open: %s", label, strerror(errno));
    devio_status st = DEVIO_OK;
    uint8_t *buf = malloc(HASH_CHUNK);
    struct stat sb;
    if (!buf) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory hashing %.120s", label);
        goto out;
    }
    if (fstat(fd, &sb) != 0) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", label, strerror(errno));
        goto out;
    }
    devio_sha256 h;
    devio_sha256_init(&h);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, HASH_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            st = devio_fail(err, DEVIO_E_IO, "%.120s: read failed at byte %llu: %s", label,
                            (unsigned long long)total, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        devio_sha256_update(&h, buf, (size_t)n);
        total += (uint64_t)n;
    }
    if (total != (uint64_t)sb.st_size) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: changed size while being read", label);
        goto out;
    }
    uint8_t digest[32];
    devio_sha256_final(&h, digest);
    devio_sha256_hex(digest, hex);
    *size = total;
    if (id)
        file_id_of(&sb, id);
out:
    free(buf);
    close(fd);
    return st;
}

static devio_status priv_own(adapter_priv *p, void *buf, size_t cap)
{
    if (p->n_owned == cap)
        return DEVIO_E_NOMEM;
    p->owned[p->n_owned++] = buf;
    return DEVIO_OK;
}

/* Parses "base_model.model.model.layers.{i}.{block}.{proj}.lora_{A|B}.weight".
 * Layer numbers must be written canonically (no sign, no leading zero), so
 * two names never denote the same module. */
static bool parse_tensor_name(const char *s, uint32_t *layer, devio_lora_target *t, int *ab)
{
    size_t np = strlen(TENSOR_PREFIX);
    if (strncmp(s, TENSOR_PREFIX, np) != 0)
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
        snprintf(want, sizeof want, "%s.%s.lora_", target_info[i].block, target_info[i].name);
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

static void tensor_name(char *dst, size_t cap, uint32_t layer, devio_lora_target t, int ab)
{
    snprintf(dst, cap, TENSOR_PREFIX "%u.%s.%s.lora_%c.weight", layer, target_info[t].block,
             target_info[t].name, ab ? 'B' : 'A');
}

/* Checks one tensor's dtype and [s0, s1] shape and makes the view, copying
 * it when the file stores it at an offset its element size does not divide. */
static devio_status bind_tensor(const devio_st_tensor *t, const char *label, uint64_t s0,
                                uint64_t s1, const char *why, adapter_priv *priv,
                                size_t owned_cap, devio_tensor *out, devio_error *err)
{
    if (!t->supported)
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.100s: tensor '%.90s' has dtype %s; only F32, F16 and BF16 are "
                          "supported",
                          label, t->name, t->dtype_str);
    if (t->ndim != 2 || t->shape[0] != s0 || t->shape[1] != s1) {
        char got[64] = "";
        size_t g = 0;
        for (uint32_t i = 0; i < t->ndim && g < sizeof got; i++)
            g += (size_t)snprintf(got + g, sizeof got - g, "%s%llu", i ? ", " : "",
                                  (unsigned long long)t->shape[i]);
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.100s: tensor '%.90s' has shape [%s], expected [%llu, %llu] (%s)",
                          label, t->name, got, (unsigned long long)s0, (unsigned long long)s1,
                          why);
    }
    out->dtype = t->dtype;
    out->ndim = 2;
    out->shape[0] = s0;
    out->shape[1] = s1;
    out->data = t->data;
    if ((uintptr_t)t->data % devio_dtype_size(t->dtype) != 0) {
        void *copy = malloc(t->nbytes ? (size_t)t->nbytes : 1);
        if (!copy)
            return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory copying '%.90s'", label,
                              t->name);
        memcpy(copy, t->data, (size_t)t->nbytes);
        if (priv_own(priv, copy, owned_cap) != DEVIO_OK) {
            free(copy);
            return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory", label);
        }
        out->data = copy;
    }
    return DEVIO_OK;
}

/* Matches the file's tensors to the modules the config names: first every
 * tensor in the file must be one the config asks for (so nothing is
 * silently ignored), then every module asked for must have both tensors
 * with the base model's shapes. */
static devio_status bind_tensors(devio_adapter *a, const lora_config *c, const devio_model *base,
                                 adapter_priv *priv, const char *label, devio_error *err)
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
        if (!parse_tensor_name(t->name, &li, &tg, &ab)) {
            st = devio_fail(err, DEVIO_E_UNSUPPORTED,
                            "%.100s: tensor '%.90s' is not a lora_A or lora_B weight of a "
                            "q/k/v/o/gate/up/down projection",
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
                            label, t->name, target_info[tg].name);
            goto out;
        }
        if (!c->layer_on[li]) {
            st = devio_fail(err, DEVIO_E_INVALID,
                            "%.100s: tensor '%.90s' is for layer %u, which "
                            "layers_to_transform leaves out",
                            label, t->name, li);
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
            devio_lora_target_dims(base, li, (devio_lora_target)tg, &od, &id);
            devio_lora_module *m = &a->mods[(size_t)li * N + tg];
            for (int ab = 0; ab < 2; ab++) {
                const devio_st_tensor *t = found[((size_t)li * N + tg) * 2 + (size_t)ab];
                if (!t) {
                    tensor_name(name, sizeof name, li, (devio_lora_target)tg, ab);
                    st = devio_fail(err, DEVIO_E_INVALID, "%.100s: tensor '%.90s' is missing",
                                    label, name);
                    goto out;
                }
                snprintf(why, sizeof why, "rank %u; the base model's %s is [%llu, %llu]",
                         c->rank, target_info[tg].name, (unsigned long long)od,
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

    adapter_paths P;
    devio_status st = resolve_paths(root, rel_path, true, &P, err);
    if (st != DEVIO_OK)
        return st;

    char clabel[320], wlabel[320];
    snprintf(clabel, sizeof clabel, "%s/%s", rel_path, CONFIG_NAME);
    snprintf(wlabel, sizeof wlabel, "%s/%s", rel_path, WEIGHTS_NAME);
    const uint32_t L = base->cfg.n_layers;
    json_t *cj = NULL;
    lora_config c = {0};
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

    if ((st = read_config(P.config, clabel, &cj, err)) != DEVIO_OK ||
        (st = parse_config(cj, clabel, L, max_rank, &c, err)) != DEVIO_OK)
        goto out;

    file_id before, after;
    if ((st = hash_file(P.weights, wlabel, a->sha256, &a->size, &before, err)) != DEVIO_OK)
        goto out;
    if ((st = devio_st_open(P.weights, wlabel, NULL, &priv->file, err)) != DEVIO_OK)
        goto out;
    /* The hash must describe the bytes mapped: a file replaced in between
     * would be recorded under the wrong digest. */
    struct stat sb;
    if (stat(P.weights, &sb) != 0) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", wlabel, strerror(errno));
        goto out;
    }
    file_id_of(&sb, &after);
    if (!file_id_equal(&before, &after)) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: changed while being loaded; try again",
                        wlabel);
        goto out;
    }
    if ((st = bind_tensors(a, &c, base, priv, wlabel, err)) != DEVIO_OK)
        goto out;

    snprintf(a->name, sizeof a->name, "%s", name);
    snprintf(a->path, sizeof a->path, "%s", rel_path);
    a->rank = c.rank;
    a->alpha = c.alpha;
    a->use_rslora = c.use_rslora;
    a->scale = c.use_rslora ? c.alpha / devio_num_sqrt((float)c.rank) : c.alpha / (float)c.rank;
    a->targets = c.targets;
    a->n_layers = L;
    *out = a;
    a = NULL;
out:
    devio_adapter_free(a);
    free(c.layer_on);
    json_decref(cj);
    paths_free(&P);
    return st;
}

void devio_adapter_free(devio_adapter *a)
{
    if (!a)
        return;
    adapter_priv *p = a->priv;
    if (p) {
        for (size_t i = 0; i < p->n_owned; i++)
            free(p->owned[i]);
        free(p->owned);
        devio_st_close(p->file);
        free(p);
    }
    free(a->mods);
    free(a);
}

devio_status devio_adapter_path_check(const char *root, const char *rel_path, devio_error *err)
{
    adapter_paths P;
    devio_error e = {0};
    devio_status st = resolve_paths(root, rel_path, true, &P, &e);
    if (st == DEVIO_OK)
        paths_free(&P);
    if (st != DEVIO_E_INVALID)
        return DEVIO_OK; /* missing or unreadable: the load names it */
    if (err)
        *err = e;
    return st;
}

devio_status devio_adapter_file_hash(const char *root, const char *rel_path, char hex[65],
                                     uint64_t *size, devio_error *err)
{
    adapter_paths P;
    devio_status st = resolve_paths(root, rel_path, false, &P, err);
    if (st != DEVIO_OK)
        return st;
    char wlabel[320];
    snprintf(wlabel, sizeof wlabel, "%s/%s", rel_path, WEIGHTS_NAME);
    st = hash_file(P.weights, wlabel, hex, size, NULL, err);
    paths_free(&P);
    return st;
}
