/* sample_codec.c - the JSON of sampling: the `sample` parameters with their logit processing, and the top logprobs answered.
 * Pure translation: it checks shapes and JSON ranges; the device checks what depends on the model (token ids, the mask's size). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "api/json_fields.h"
#include "device/status.h"

/* Entries a logit_bias or banned_tokens may hold: past any vocabulary. */
#define PROC_LIST_MAX (1u << 22)

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 (RFC 4648, '=' padding required) into *out, malloc'd, *n bytes. */
static devio_status b64_decode(const char *s, size_t len, uint8_t **out, size_t *n,
                               devio_error *err)
{
    if (len == 0 || len % 4 != 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "allowed_tokens must be base64 (RFC 4648, padded) of the mask's bytes");
    size_t pad = s[len - 1] == '=' ? (s[len - 2] == '=' ? 2 : 1) : 0;
    uint8_t *b = malloc(len / 4 * 3);
    if (!b)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory decoding allowed_tokens");
    size_t k = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            bool tail = i + 4 == len && j >= 4 - (int)pad;
            v[j] = tail ? 0 : b64_value((unsigned char)s[i + j]);
            if (v[j] < 0) {
                free(b);
                return devio_fail(err, DEVIO_E_INVALID,
                                  "allowed_tokens: '%c' at %zu is not base64", s[i + j], i + j);
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        b[k++] = (uint8_t)(w >> 16);
        b[k++] = (uint8_t)(w >> 8);
        b[k++] = (uint8_t)w;
    }
    *out = b;
    *n = k - pad;
    return DEVIO_OK;
}

/* allowed_tokens: base64 of the mask's 32-bit words, least significant byte first. */
static devio_status decode_allowed(const json_t *v, devio_sample_buf *pb, devio_sample_params *out,
                                   devio_error *err)
{
    if (!json_is_string(v))
        return devio_fail(err, DEVIO_E_INVALID,
                          "allowed_tokens must be a base64 string of 32-bit little-endian words");
    uint8_t *bytes = NULL;
    size_t n = 0;
    devio_status s = b64_decode(json_string_value(v), json_string_length(v), &bytes, &n, err);
    if (s != DEVIO_OK)
        return s;
    if (n == 0 || n % 4 != 0) {
        free(bytes);
        return devio_fail(err, DEVIO_E_INVALID,
                          "allowed_tokens decodes to %zu bytes, not a whole number of 32-bit words",
                          n);
    }
    pb->allowed = malloc(n);
    if (!pb->allowed) {
        free(bytes);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory decoding allowed_tokens");
    }
    for (size_t w = 0; w < n / 4; w++)
        pb->allowed[w] = (uint32_t)bytes[4 * w] | (uint32_t)bytes[4 * w + 1] << 8 |
                         (uint32_t)bytes[4 * w + 2] << 16 | (uint32_t)bytes[4 * w + 3] << 24;
    free(bytes);
    out->allowed = pb->allowed;
    out->allowed_words = (uint32_t)(n / 4);
    return DEVIO_OK;
}

/* A token id as JSON gives it: a non-negative integer (the device checks the vocab). */
static bool token_of(const json_t *v, int32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return false;
    *out = (int32_t)json_integer_value(v);
    return true;
}

/* A bias: a number (beyond the float range it is +-inf), or "inf", "+inf", "-inf". */
static bool bias_of(const json_t *v, float *out)
{
    if (json_is_number(v)) {
        *out = (float)json_number_value(v);
        return true;
    }
    const char *s = json_string_value(v);
    if (s && (strcmp(s, "inf") == 0 || strcmp(s, "+inf") == 0)) {
        *out = INFINITY;
        return true;
    }
    if (s && strcmp(s, "-inf") == 0) {
        *out = -INFINITY;
        return true;
    }
    return false;
}

/* logit_bias: {"<token id>": bias, ...}. */
static devio_status decode_bias(const json_t *v, devio_sample_buf *pb, devio_sample_params *out,
                                devio_error *err)
{
    if (!json_is_object(v) || json_object_size(v) > PROC_LIST_MAX)
        return devio_fail(err, DEVIO_E_INVALID,
                          "logit_bias must be an object of token id -> bias (at most %u)",
                          PROC_LIST_MAX);
    size_t n = json_object_size(v);
    pb->ids = malloc((n ? n : 1) * sizeof *pb->ids);
    pb->bias = malloc((n ? n : 1) * sizeof *pb->bias);
    if (!pb->ids || !pb->bias)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory decoding logit_bias");
    const char *key;
    const json_t *b;
    uint32_t k = 0;
    json_object_foreach((json_t *)v, key, b) {
        char *end = NULL;
        unsigned long id = strtoul(key, &end, 10);
        if (!*key || *end || key[0] == '-' || key[0] == '+' || id > INT32_MAX)
            return devio_fail(err, DEVIO_E_INVALID,
                              "logit_bias: key '%.32s' is not a token id", key);
        if (!bias_of(b, &pb->bias[k]))
            return devio_fail(err, DEVIO_E_INVALID,
                              "logit_bias: the bias of token %lu must be a number, \"inf\" or "
                              "\"-inf\"", id);
        pb->ids[k++] = (int32_t)id;
    }
    out->bias_ids = pb->ids;
    out->bias = pb->bias;
    out->n_bias = k;
    return DEVIO_OK;
}

static devio_status decode_banned(const json_t *v, devio_sample_buf *pb, devio_sample_params *out,
                                  devio_error *err)
{
    if (!json_is_array(v) || json_array_size(v) > PROC_LIST_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "banned_tokens must be an array of token ids");
    size_t n = json_array_size(v);
    pb->banned = malloc((n ? n : 1) * sizeof *pb->banned);
    if (!pb->banned)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory decoding banned_tokens");
    for (size_t i = 0; i < n; i++)
        if (!token_of(json_array_get(v, i), &pb->banned[i]))
            return devio_fail(err, DEVIO_E_INVALID,
                              "banned_tokens: entry %zu is not a token id", i);
    out->banned = pb->banned;
    out->n_banned = (uint32_t)n;
    return DEVIO_OK;
}

/* The processing fields of a sample object into p, their arrays held by pb. */
static devio_status decode_proc(const json_t *j, devio_sample_buf *pb, devio_sample_params *p,
                                devio_error *err)
{
    const json_t *v;
    devio_status s = DEVIO_OK;
    if ((v = json_object_get(j, "logit_bias")) && !json_is_null(v))
        s = decode_bias(v, pb, p, err);
    if (s == DEVIO_OK && (v = json_object_get(j, "allowed_tokens")) && !json_is_null(v))
        s = decode_allowed(v, pb, p, err);
    if (s == DEVIO_OK && (v = json_object_get(j, "banned_tokens")) && !json_is_null(v))
        s = decode_banned(v, pb, p, err);
    if (s == DEVIO_OK)
        s = devio_json_get_float(j, "repetition_penalty", 0.0, true, FLT_MAX,
                                 &p->repetition_penalty, err);
    if (s == DEVIO_OK)
        s = devio_json_get_float(j, "presence_penalty", -FLT_MAX, false, FLT_MAX,
                                 &p->presence_penalty, err);
    if (s == DEVIO_OK)
        s = devio_json_get_float(j, "frequency_penalty", -FLT_MAX, false, FLT_MAX,
                                 &p->frequency_penalty, err);
    uint64_t from = 0, n = 0;
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "penalty_from", UINT32_MAX, false, &from, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "logprobs", DEVIO_TOP_LOGPROBS_MAX, false, &n, err);
    p->penalty_from = (uint32_t)from;
    p->logprobs = (uint32_t)n;
    return s;
}

devio_status devio_json_sample_decode(const json_t *j, devio_sample_params *out,
                                      devio_sample_buf *pb, devio_error *err)
{
    static const char *const keys[] = {
        "temperature", "top_k", "top_p", "min_p", "seed", "logit_bias", "allowed_tokens",
        "banned_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty",
        "penalty_from", "logprobs", NULL};
    *out = devio_sample_params_default();
    *pb = (devio_sample_buf){0};
    devio_status s = devio_json_check_object(j, keys, "sample params", err);
    uint64_t k = 0, seed = 0;
    if (s == DEVIO_OK)
        s = devio_json_get_float(j, "temperature", 0.0, false, FLT_MAX, &out->temperature, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "top_k", INT32_MAX, false, &k, err);
    if (s == DEVIO_OK)
        s = devio_json_get_float(j, "top_p", 0.0, true, 1.0, &out->top_p, err);
    if (s == DEVIO_OK)
        s = devio_json_get_float(j, "min_p", 0.0, false, 1.0, &out->min_p, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "seed", INT64_MAX, false, &seed, err);
    out->top_k = (int32_t)k;
    out->seed = seed;
    if (s == DEVIO_OK)
        s = decode_proc(j, pb, out, err);
    if (s != DEVIO_OK) {
        devio_sample_buf_free(pb);
        *out = devio_sample_params_default();
    }
    return s;
}

void devio_sample_buf_free(devio_sample_buf *pb)
{
    if (!pb)
        return;
    free(pb->ids);
    free(pb->bias);
    free(pb->allowed);
    free(pb->banned);
    *pb = (devio_sample_buf){0};
}

json_t *devio_json_top_logprobs(const int32_t *ids, const float *lps, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_pack("{s:i,s:o}", "id", ids[i], "logprob",
                                               devio_json_float(lps[i]))) != 0) {
            json_decref(a);
            a = NULL;
        }
    return a;
}
