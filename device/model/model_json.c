/* model_json.c - reads a model directory's JSON files (config.json, the shard index) for the
 * model loader. It must accept what transformers writes (bare Infinity and NaN) and nothing that
 * is not a JSON object. */
#include "device/model/model_load.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/path.h"
#include "device/model/model_config.h"
#include "device/status.h"

/* Hugging Face writes float('inf') as the bare token Infinity (Mamba-2's
 * time_step_limit), which JSON does not allow: outside strings, the tokens
 * Infinity, -Infinity and NaN become the strings "Infinity", "-Infinity"
 * and "NaN", for the config reader to interpret. Returns a new buffer of
 * *len bytes, or NULL when memory is short. */
static char *json_quote_nonfinite(const char *src, size_t n, size_t *len)
{
    static const char *const toks[] = {"-Infinity", "Infinity", "NaN"};
    char *out = malloc(n * 2 + 1); /* each token grows by 2 and is >= 3 long */
    if (!out)
        return NULL;
    size_t o = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = src[i];
        if (in_str) {
            out[o++] = ch;
            if (ch == '\\' && i + 1 < n)
                out[o++] = src[++i];
            else if (ch == '"')
                in_str = false;
            continue;
        }
        size_t t = 0, tl = 0;
        for (; t < 3; t++) {
            tl = strlen(toks[t]);
            if (n - i >= tl && memcmp(src + i, toks[t], tl) == 0)
                break;
        }
        if (t < 3) {
            out[o++] = '"';
            memcpy(out + o, toks[t], tl);
            o += tl;
            out[o++] = '"';
            i += tl - 1;
            continue;
        }
        in_str = ch == '"';
        out[o++] = ch;
    }
    *len = o;
    return out;
}

/* Reads a whole file into a malloc'd buffer; errno set on failure. */
static char *read_all(FILE *fp, size_t *n)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, fp);
        if (len < cap)
            break;
        char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf && ferror(fp)) {
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

devio_status devio_model_load_json(const char *dir, const char *name, json_t **out, devio_error *err)
{
    *out = NULL;
    char *path = devio_path_join(dir, name);
    if (!path)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading %s", name);
    devio_status st = DEVIO_OK;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        st = errno == ENOENT ? DEVIO_E_MODEL : DEVIO_E_IO;
        devio_fail(err, st, "%s: cannot open in model directory '%.120s': %s", name, dir,
                   strerror(errno));
        goto out_path;
    }
    size_t n = 0, qn = 0;
    char *raw = read_all(fp, &n);
    fclose(fp);
    char *text = raw ? json_quote_nonfinite(raw, n, &qn) : NULL;
    free(raw);
    if (!text) {
        int e = errno ? errno : ENOMEM; /* an allocation that failed is out of memory */
        st = e == ENOMEM ? DEVIO_E_NOMEM : DEVIO_E_IO;
        devio_fail(err, st, "%s: cannot read: %s", name, strerror(e));
        goto out_path;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, qn, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        st = DEVIO_E_MODEL;
        devio_fail(err, st, "%s: not valid JSON (line %d: %.100s)", name, jerr.line, jerr.text);
        goto out_path;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        st = DEVIO_E_MODEL;
        devio_fail(err, st, "%s: top level is not a JSON object", name);
        goto out_path;
    }
    *out = root;
out_path:
    free(path);
    return st;
}

/* A token id: a non-negative integer, or the first of a list of them;
 * -1 for none (null, a negative id as older configs write it). Every id
 * of the list must be one of the vocabulary. */
static devio_status token_id(const json_t *config, const char *key, uint32_t vocab, int64_t *id,
                             devio_error *err)
{
    const json_t *v = json_object_get(config, key);
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    *id = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
        devio_status st;
        if (x >= 0 &&
            (st = devio_model_token_check(DEVIO_MODEL_CONFIG_NAME, "field", key, x, vocab, err)))
            return st;
        if (i == 0)
            *id = x >= 0 ? (int64_t)x : -1;
    }
    return DEVIO_OK;
}

devio_status devio_model_text_from_dir(const char *dir, const json_t *config, uint32_t vocab,
                                       devio_model_text *t, devio_error *err)
{
    *t = (devio_model_text){.format = "safetensors"};
    devio_status st;
    if ((st = token_id(config, "bos_token_id", vocab, &t->bos_id, err)) ||
        (st = token_id(config, "eos_token_id", vocab, &t->eos_id, err)) ||
        (st = token_id(config, "pad_token_id", vocab, &t->pad_id, err)))
        return st;
    json_t *tok = NULL;
    devio_error ignored = {0};
    if (devio_model_load_json(dir, "tokenizer_config.json", &tok, &ignored) != DEVIO_OK)
        return ignored.status == DEVIO_E_NOMEM ? devio_fail(err, DEVIO_E_NOMEM, "%s",
                                                            ignored.message)
                                               : DEVIO_OK;
    const json_t *tpl = json_object_get(tok, "chat_template");
    if (json_is_array(tpl)) { /* [{"name", "template"}, ...]: the default one */
        const json_t *pick = NULL, *e;
        size_t i;
        json_array_foreach(tpl, i, e)
        {
            const char *n = json_string_value(json_object_get(e, "name"));
            if (!pick || (n && strcmp(n, "default") == 0))
                pick = e;
        }
        tpl = pick ? json_object_get(pick, "template") : NULL;
    }
    if (json_is_string(tpl) && !(t->chat_template = strdup(json_string_value(tpl))))
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory for the chat template");
    json_decref(tok);
    return st;
}
