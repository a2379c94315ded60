/* sampler_cases.c - the device sampler over cases given as JSON lines, for tests/python/sampler_numpy_check.py.
 * Each input line: {"logits":[...], "sample":{...}, "history":[...], "position":P}, where a logit may
 * be a number or "nan", "inf", "-inf" and "sample" is a plan row's sample object (api/sample_codec.c).
 * Each output line: {"token":t, "logprob":x, "top":[[id, logprob], ...]} or {"error":"..."}.
 * It decodes with the codec and samples with the sampler itself: nothing is restated here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/codec.h"
#include "device/devio.h"
#include "device/sample/sampler.h"
#include "device/status.h"

static bool logit_of(const json_t *v, float *out)
{
    const char *s = json_string_value(v);
    if (json_is_number(v))
        *out = (float)json_number_value(v);
    else if (s && strcmp(s, "nan") == 0)
        *out = NAN;
    else if (s && strcmp(s, "inf") == 0)
        *out = INFINITY;
    else if (s && strcmp(s, "-inf") == 0)
        *out = -INFINITY;
    else
        return false;
    return true;
}

/* One case; the answer as a JSON object. */
static json_t *run_case(const json_t *c)
{
    const json_t *jl = json_object_get(c, "logits"), *jh = json_object_get(c, "history");
    size_t v = json_array_size(jl), nh = json_array_size(jh);
    float *logits = malloc((v ? v : 1) * sizeof *logits);
    int32_t *hist = malloc((nh ? nh : 1) * sizeof *hist);
    devio_sampler *s = NULL;
    devio_sample_params p;
    devio_sample_buf pb = {0};
    devio_error err = {0};
    json_t *out = NULL;
    if (!logits || !hist || v == 0 || devio_sampler_create((uint32_t)v, &s) != DEVIO_OK) {
        out = json_pack("{s:s}", "error", "bad case");
        goto done;
    }
    for (size_t i = 0; i < v; i++)
        if (!logit_of(json_array_get(jl, i), &logits[i]))
            logits[i] = 0.0f;
    for (size_t i = 0; i < nh; i++)
        hist[i] = (int32_t)json_integer_value(json_array_get(jh, i));
    if (devio_json_sample_decode(json_object_get(c, "sample"), &p, &pb, &err) != DEVIO_OK) {
        out = json_pack("{s:s,s:s}", "error", "decode", "message", err.message);
        goto done;
    }
    int32_t ids[DEVIO_TOP_LOGPROBS_MAX], tok = -1;
    float lps[DEVIO_TOP_LOGPROBS_MAX], lp = 0.0f;
    devio_top_logprobs top = {.n = p.logprobs, .ids = ids, .logprobs = lps};
    uint64_t pos = (uint64_t)json_integer_value(json_object_get(c, "position"));
    if (devio_sampler_run_ex(s, logits, &p, hist, (uint32_t)nh, pos, &tok, &lp, &top) != DEVIO_OK) {
        out = json_pack("{s:s}", "error", "invalid");
        goto done;
    }
    json_t *jt = json_array();
    for (uint32_t i = 0; i < top.n; i++) /* a token whose raw logit is -inf: null */
        json_array_append_new(jt, json_pack("[i,o]", ids[i], devio_json_float(lps[i])));
    out = json_pack("{s:i,s:f,s:o}", "token", tok, "logprob", (double)lp, "top", jt);
done:
    devio_sample_buf_free(&pb);
    devio_sampler_free(s);
    free(logits);
    free(hist);
    return out;
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)n, 0, &je);
        json_t *out = c ? run_case(c) : json_pack("{s:s}", "error", "bad json");
        char *t = json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(9));
        puts(t ? t : "{\"error\":\"out of memory\"}");
        free(t);
        json_decref(out);
        json_decref(c);
    }
    free(line);
    return 0;
}
