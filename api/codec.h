/* codec.h - JSON <-> C for the wire shapes of docs/http.md (jansson); adapters are in adapter_codec.h.
 * Decoders validate types and ranges and never touch the device; encoders never fail silently. */
#ifndef DEVIO_CODEC_H
#define DEVIO_CODEC_H

#include <jansson.h>

#include "device/devio.h"

/* Every float goes out with 9 significant digits: enough to round-trip binary32. */
#define DEVIO_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* The arrays behind a decoded sample's processing (the decoded
 * devio_sample_params points into them). Release with devio_sample_buf_free(). */
typedef struct devio_sample_buf {
    int32_t *ids;      /* logit_bias ids */
    float *bias;       /* logit_bias values */
    uint32_t *allowed; /* allowed_tokens words */
    int32_t *banned;   /* banned_tokens */
} devio_sample_buf;

void devio_sample_buf_free(devio_sample_buf *pb);

/* A decoded plan and the storage behind it. Release with devio_plan_buf_free(). */
typedef struct devio_plan_buf {
    devio_plan plan;
    devio_row *rows;
    int32_t *tokens;
    char **adapters;
    devio_sample_buf *samples; /* one per row: the arrays of each sampled row's processing */
} devio_plan_buf;

/* Decode {"rows":[...]} into buf (zeroed on failure). Caps the sizes it
 * will allocate at max_rows rows and max_tokens tokens (DEVIO_E_TOO_LARGE). */
devio_status devio_json_plan_decode(const json_t *j, uint32_t max_rows, uint32_t max_tokens,
                                    devio_plan_buf *buf, devio_error *err);
void devio_plan_buf_free(devio_plan_buf *buf);

/* A `sample` object (api/sample_codec.c) into *out, the arrays of its logit
 * processing held by *pb (zeroed first; released on failure), which *out
 * points into. */
devio_status devio_json_sample_decode(const json_t *j, devio_sample_params *out,
                                      devio_sample_buf *pb, devio_error *err);
/* An effect; a sample's arrays land in *pb, which out->params points into:
 * release *pb after the effect (on failure it is empty). */
devio_status devio_json_effect_decode(const json_t *j, devio_effect *out,
                                      devio_sample_buf *pb, devio_error *err);
/* [{"id":..,"logprob":..}, ...] of n top logprobs. */
json_t *devio_json_top_logprobs(const int32_t *ids, const float *lps, uint32_t n);

/* {"<key>": id}: a sequence ({"seq":N}) or a ticket ({"ticket":N}). */
devio_status devio_json_id_decode(const json_t *j, const char *key, uint64_t *out,
                                  devio_error *err);
/* {"ticket":N, "timeout_ms"?:M}; *timeout_ms is -1 (wait) when absent. */
devio_status devio_json_await_decode(const json_t *j, uint64_t *ticket, int64_t *timeout_ms,
                                     devio_error *err);

/* Encoders: each returns a new reference (caller json_decref), NULL on out of memory. */
json_t *devio_json_seq_ref(uint64_t seq);       /* {"seq":N}, a created sequence */
json_t *devio_json_ticket_ref(uint64_t ticket); /* {"ticket":N}, a launched step */
json_t *devio_json_step_result(const devio_step_result *r);
/* The answer text of a settled step, byte for byte what an await sends
 * (malloc'd; NULL when out of memory): the server keeps it with the
 * ticket's history row, so that a replay sends the same bytes. */
char *devio_step_answer_text(const devio_step_result *r);
/* The outcome of effect e (the effect applied, for what only it says: a release
 * of a sequence's snapshots answers freed_snapshots, a release of a logits handle
 * its kind only). */
json_t *devio_json_outcome(const devio_effect *e, const devio_outcome *o);
json_t *devio_json_facts(const devio_facts *f);
/* {"handles":[{"logits","seq","ticket","rows","position","state"}...]}: GET /v1/logits. */
json_t *devio_json_logits_list(const devio_logits_info *h, uint32_t n);
json_t *devio_json_seq_info(const devio_seq_info *s);
/* {"sequences":[seq_info...]}: GET /v1/sequences. */
json_t *devio_json_seq_list(const devio_seq_info *s, uint32_t n);
/* {"error":{"code":..., "message":..., "details":{...}}} */
json_t *devio_json_error(const devio_error *e);

/* A binary32 value as JSON: a real, or null when it is NaN or infinite
 * (JSON has no such numbers). New reference. */
json_t *devio_json_float(float x);

/* Effect kind names: "sample", "fork", ... ; -1 when unknown. */
const char *devio_effect_kind_str(devio_effect_kind k);
int devio_effect_kind_parse(const char *s);

#endif
