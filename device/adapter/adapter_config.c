/* adapter_config.c - reads a PEFT adapter_config.json and checks every field the adapter loader relies on.
 * It must never accept a feature that changes what the adapter computes, nor ignore a field it does not know how to apply. */
#include "device/adapter/adapter_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/adapter/lora_target.h"
#include "device/status.h"

/* PEFT's LoraConfig default for lora_alpha. */
#define DEFAULT_ALPHA 8.0
/* An adapter_config.json is a few hundred bytes; anything this large is not one. */
#define MAX_CONFIG_BYTES (4 * 1024 * 1024)

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
                          "down_proj in_proj out_proj)",
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
                                 uint32_t max_rank, devio_lora_config *c, devio_error *err)
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

/* Reads the whole of fd (from offset 0, with pread) and parses it. */
static devio_status read_config(int fd, const char *label, json_t **out, devio_error *err)
{
    *out = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", label, strerror(errno));
    if (sb.st_size > MAX_CONFIG_BYTES)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.120s: %lld bytes is too large for an adapter config", label,
                          (long long)sb.st_size);
    /* One byte of room past the limit, so that a file grown since the
     * fstat is noticed instead of cut short. */
    char *buf = malloc(MAX_CONFIG_BYTES + 1);
    if (!buf)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading %.120s", label);
    devio_status st = DEVIO_OK;
    size_t got = 0;
    for (;;) {
        ssize_t n = pread(fd, buf + got, MAX_CONFIG_BYTES + 1 - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            st = devio_fail(err, DEVIO_E_IO, "%.120s: read failed: %s", label, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        got += (size_t)n;
        if (got > MAX_CONFIG_BYTES) {
            st = devio_fail(err, DEVIO_E_MODEL,
                            "%.120s: more than %d bytes is too large for an adapter config",
                            label, MAX_CONFIG_BYTES);
            goto out;
        }
    }
    json_error_t jerr;
    json_t *root = json_loadb(buf, got, JSON_REJECT_DUPLICATES, &jerr);
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
    free(buf);
    return st;
}

devio_status devio_lora_config_load(int fd, const char *label, uint32_t n_layers,
                                    uint32_t max_rank, devio_lora_config *c, devio_error *err)
{
    json_t *root;
    devio_status st = read_config(fd, label, &root, err);
    if (st != DEVIO_OK)
        return st;
    st = parse_config(root, label, n_layers, max_rank, c, err);
    json_decref(root);
    return st;
}
