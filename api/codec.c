/* codec.c - JSON codecs for ids, plans, effects, results, facts, sequences and errors.
 * Pure translation: it must never call the device or accept a value it cannot represent. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "api/json_fields.h"
#include "device/status.h"

static const char *const effect_names[] = {
    [DEVIO_EFFECT_SAMPLE] = "sample",     [DEVIO_EFFECT_FORK] = "fork",
    [DEVIO_EFFECT_TRUNCATE] = "truncate", [DEVIO_EFFECT_SNAPSHOT] = "snapshot",
    [DEVIO_EFFECT_FREE] = "free",         [DEVIO_EFFECT_RELEASE] = "release",
    [DEVIO_EFFECT_PARK] = "park",         [DEVIO_EFFECT_RESTORE] = "restore",
};

const char *devio_effect_kind_str(devio_effect_kind k)
{
    return (unsigned)k < sizeof effect_names / sizeof *effect_names ? effect_names[k] : "unknown";
}

int devio_effect_kind_parse(const char *s)
{
    for (unsigned i = 0; s && i < sizeof effect_names / sizeof *effect_names; i++)
        if (strcmp(s, effect_names[i]) == 0)
            return (int)i;
    return -1;
}

json_t *devio_json_float(float x)
{
    return isfinite(x) ? json_real((double)x) : json_null();
}

/* ---- decoders --------------------------------------------------------- */

/* A nested decoder's failure, pinned to plan row r (its message kept). */
static devio_status in_row(devio_error *err, uint32_t r, devio_status s)
{
    if (err) {
        snprintf(err->detail_key, sizeof err->detail_key, "row");
        err->detail_val = r;
    }
    return s;
}

static devio_status decode_row(const json_t *jr, uint32_t r, devio_plan_buf *buf,
                               uint32_t *tok, uint32_t max_tokens, devio_error *err)
{
    static const char *const keys[] = {"seq", "tokens", "logits", "adapter", "sample",
                                       "snapshot", "prompt_logprobs", NULL};
    devio_row *row = &buf->rows[r];
    if (!json_is_object(jr))
        return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u must be an object", r);
    uint64_t seq = 0;
    devio_status s = devio_json_check_object(jr, keys, "a plan row", err);
    if (s != DEVIO_OK)
        return in_row(err, r, s);
    s = devio_json_get_uint(jr, "seq", UINT64_MAX, true, &seq, err);
    if (s != DEVIO_OK)
        return devio_fail_at(err, s, "row", r, "row %u: 'seq' must be a sequence id", r);
    row->seq = seq;
    const json_t *jt = json_object_get(jr, "tokens");
    if (!json_is_array(jt) || json_array_size(jt) == 0)
        return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                             "row %u: 'tokens' must be a non-empty array", r);
    size_t n = json_array_size(jt);
    if (n > max_tokens - *tok)
        return devio_fail_at(err, DEVIO_E_TOO_LARGE, "row", r,
                             "plan has more than %u tokens", max_tokens);
    row->tokens = buf->tokens + *tok;
    row->n_tokens = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(jt, i);
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
            json_integer_value(v) > INT32_MAX)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u: tokens must be integers", r);
        buf->tokens[*tok + i] = (int32_t)json_integer_value(v);
    }
    *tok += (uint32_t)n;
    const json_t *jl = json_object_get(jr, "logits");
    row->logits = DEVIO_LOGITS_NONE;
    if (jl) {
        const char *m = json_string_value(jl);
        if (m && strcmp(m, "none") == 0)
            row->logits = DEVIO_LOGITS_NONE;
        else if (m && strcmp(m, "last") == 0)
            row->logits = DEVIO_LOGITS_LAST;
        else if (m && strcmp(m, "all") == 0)
            row->logits = DEVIO_LOGITS_ALL;
        else
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u: 'logits' must be \"none\", \"last\" or \"all\"", r);
    }
    const json_t *ja = json_object_get(jr, "adapter");
    if (ja && !json_is_null(ja)) {
        if (!json_is_string(ja))
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u: 'adapter' must be a string", r);
        buf->adapters[r] = strdup(json_string_value(ja));
        if (!buf->adapters[r])
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        row->adapter = buf->adapters[r];
    }
    s = devio_json_get_bool(jr, "prompt_logprobs", &row->prompt_logprobs, err);
    if (s != DEVIO_OK)
        return in_row(err, r, s);
    const json_t *js = json_object_get(jr, "sample");
    if (js && !json_is_null(js)) {
        row->has_sample = true;
        s = devio_json_sample_decode(js, &row->sample, &buf->samples[r], err);
        if (s != DEVIO_OK)
            return in_row(err, r, s);
    }
    const json_t *jn = json_object_get(jr, "snapshot");
    if (jn && !json_is_null(jn)) {
        const char *m = json_string_value(jn);
        if (m && strcmp(m, "end") == 0)
            row->snapshot = DEVIO_SNAP_END;
        else if (m && strcmp(m, "each") == 0)
            row->snapshot = DEVIO_SNAP_EACH;
        else
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u: 'snapshot' must be \"end\" or \"each\"", r);
    }
    return DEVIO_OK;
}

devio_status devio_json_plan_decode(const json_t *j, uint32_t max_rows, uint32_t max_tokens,
                                    devio_plan_buf *buf, devio_error *err)
{
    static const char *const keys[] = {"rows", NULL};
    memset(buf, 0, sizeof *buf);
    devio_status s = devio_json_check_object(j, keys, "the plan", err);
    if (s != DEVIO_OK)
        return s;
    const json_t *jrows = json_object_get(j, "rows");
    if (!json_is_array(jrows) || json_array_size(jrows) == 0)
        return devio_fail(err, DEVIO_E_INVALID, "plan needs a non-empty 'rows' array");
    size_t n = json_array_size(jrows);
    if (n > max_rows)
        return devio_fail_at(err, DEVIO_E_TOO_LARGE, "max_rows", max_rows,
                             "plan has %zu rows, max_rows is %u", n, max_rows);
    size_t total = 0;
    for (size_t r = 0; r < n; r++)
        total += json_array_size(json_object_get(json_array_get(jrows, r), "tokens"));
    if (total > max_tokens)
        return devio_fail_at(err, DEVIO_E_TOO_LARGE, "max_batch_tokens", max_tokens,
                             "plan has %zu tokens, max_batch_tokens is %u", total, max_tokens);
    buf->rows = calloc(n, sizeof *buf->rows);
    buf->tokens = calloc(total ? total : 1, sizeof *buf->tokens);
    buf->adapters = calloc(n, sizeof *buf->adapters);
    buf->samples = calloc(n, sizeof *buf->samples);
    if (!buf->rows || !buf->tokens || !buf->adapters || !buf->samples) {
        devio_plan_buf_free(buf);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory decoding the plan");
    }
    buf->plan.rows = buf->rows;
    buf->plan.n_rows = (uint32_t)n;
    uint32_t tok = 0;
    for (uint32_t r = 0; r < n; r++) {
        s = decode_row(json_array_get(jrows, r), r, buf, &tok, (uint32_t)total, err);
        if (s != DEVIO_OK) {
            devio_plan_buf_free(buf);
            return s;
        }
    }
    return DEVIO_OK;
}

void devio_plan_buf_free(devio_plan_buf *buf)
{
    if (buf->adapters)
        for (uint32_t r = 0; r < buf->plan.n_rows; r++)
            free(buf->adapters[r]);
    if (buf->samples)
        for (uint32_t r = 0; r < buf->plan.n_rows; r++)
            devio_sample_buf_free(&buf->samples[r]);
    free(buf->samples);
    free(buf->adapters);
    free(buf->rows);
    free(buf->tokens);
    memset(buf, 0, sizeof *buf);
}

devio_status devio_json_id_decode(const json_t *j, const char *key, uint64_t *out,
                                  devio_error *err)
{
    devio_status s = devio_json_check_object(j, NULL, "the body", err);
    return s == DEVIO_OK ? devio_json_get_uint(j, key, UINT64_MAX, true, out, err) : s;
}

devio_status devio_json_await_decode(const json_t *j, uint64_t *ticket, int64_t *timeout_ms,
                                     devio_error *err)
{
    uint64_t t = UINT64_MAX;
    devio_status s = devio_json_id_decode(j, "ticket", ticket, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "timeout_ms", INT64_MAX, false, &t, err);
    *timeout_ms = s == DEVIO_OK && t != UINT64_MAX ? (int64_t)t : -1;
    return s;
}

devio_status devio_json_effect_decode(const json_t *j, devio_effect *out,
                                      devio_sample_buf *pb, devio_error *err)
{
    static const char *const keys[] = {"kind", "seq", "len", "logits", "row", "params", NULL};
    memset(out, 0, sizeof *out);
    *pb = (devio_sample_buf){0};
    devio_status s = devio_json_check_object(j, keys, "the effect", err);
    if (s != DEVIO_OK)
        return s;
    int kind = devio_effect_kind_parse(json_string_value(json_object_get(j, "kind")));
    if (kind < 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "effect 'kind' must be one of sample, fork, truncate, snapshot, free, "
                          "release");
    out->kind = (devio_effect_kind)kind;
    uint64_t v = 0;
    switch (out->kind) {
    case DEVIO_EFFECT_SAMPLE: {
        s = devio_json_get_uint(j, "logits", UINT64_MAX, true, &out->logits, err);
        const json_t *jr = json_object_get(j, "row");
        if (s == DEVIO_OK && jr && !json_is_null(jr)) {
            s = devio_json_get_uint(j, "row", UINT32_MAX, true, &v, err);
            out->has_row = true;
            out->row = (uint32_t)v;
        }
        const json_t *jp = json_object_get(j, "params");
        out->params = devio_sample_params_default();
        if (s == DEVIO_OK && jp)
            s = devio_json_sample_decode(jp, &out->params, pb, err);
        return s;
    }
    case DEVIO_EFFECT_TRUNCATE:
        s = devio_json_get_uint(j, "len", UINT32_MAX, true, &v, err);
        out->len = (uint32_t)v;
        if (s != DEVIO_OK)
            return s;
        /* fall through */
    case DEVIO_EFFECT_FORK:
    case DEVIO_EFFECT_SNAPSHOT:
    case DEVIO_EFFECT_FREE:
    case DEVIO_EFFECT_PARK:
    case DEVIO_EFFECT_RESTORE:
        return devio_json_get_uint(j, "seq", UINT64_MAX, true, &out->seq, err);
    case DEVIO_EFFECT_RELEASE: {
        /* A logits handle, or every snapshot of a sequence: exactly one of the two. */
        bool by_logits = json_object_get(j, "logits") != NULL;
        if (by_logits == (json_object_get(j, "seq") != NULL))
            return devio_fail(err, DEVIO_E_INVALID,
                              "release takes exactly one of 'logits' (a handle) and 'seq' "
                              "(a sequence's snapshots)");
        return by_logits ? devio_json_get_uint(j, "logits", UINT64_MAX, true, &out->logits, err)
                         : devio_json_get_uint(j, "seq", UINT64_MAX, true, &out->seq, err);
    }
    }
    return DEVIO_OK;
}

/* ---- encoders --------------------------------------------------------- */

json_t *devio_json_seq_ref(uint64_t seq)
{
    return json_pack("{s:I}", "seq", (json_int_t)seq);
}

json_t *devio_json_ticket_ref(uint64_t ticket)
{
    return json_pack("{s:I}", "ticket", (json_int_t)ticket);
}

json_t *devio_json_step_result(const devio_step_result *r)
{
    json_t *rows = json_array();
    for (uint32_t i = 0; rows && i < r->n_rows; i++) {
        const devio_row_result *x = &r->rows[i];
        json_t *o = json_pack("{s:I,s:I}", "seq", (json_int_t)x->seq, "len", (json_int_t)x->len);
        if (o && x->logits)
            json_object_set_new(o, "logits", json_integer((json_int_t)x->logits));
        if (o && x->prompt_logprobs) {
            json_t *pl = json_array();
            for (uint32_t k = 0; pl && k < x->n_prompt; k++)
                json_array_append_new(pl, devio_json_float(x->prompt_logprobs[k]));
            json_object_set_new(o, "prompt_logprobs", pl);
        }
        if (o && x->sampled) {
            json_object_set_new(o, "tokens", json_pack("[i]", x->token));
            json_object_set_new(o, "logprobs", json_pack("[o]", devio_json_float(x->logprob)));
            if (x->n_top)
                json_object_set_new(o, "top_logprobs",
                                    json_pack("[o]", devio_json_top_logprobs(
                                                         x->top_ids, x->top_logprobs, x->n_top)));
        }
        json_array_append_new(rows, o);
    }
    return json_pack("{s:I,s:o,s:{s:I,s:I},s:I}", "ticket", (json_int_t)r->ticket, "rows", rows,
                     "timing", "queued_us", (json_int_t)r->queued_us, "compute_us",
                     (json_int_t)r->compute_us, "tokens", (json_int_t)r->n_tokens);
}

json_t *devio_json_outcome(const devio_effect *e, const devio_outcome *o)
{
    json_t *j = json_pack("{s:s}", "kind", devio_effect_kind_str(o->kind));
    if (!j)
        return NULL;
    switch (o->kind) {
    case DEVIO_EFFECT_SAMPLE: {
        json_t *t = json_array(), *l = json_array();
        for (uint32_t i = 0; i < o->n_tokens; i++) {
            json_array_append_new(t, json_integer(o->tokens[i]));
            json_array_append_new(l, devio_json_float(o->logprobs[i]));
        }
        json_object_set_new(j, "tokens", t);
        json_object_set_new(j, "logprobs", l);
        if (o->n_top) {
            json_t *top = json_array();
            for (uint32_t i = 0; i < o->n_tokens; i++)
                json_array_append_new(top, devio_json_top_logprobs(
                                               o->top_ids + (size_t)i * o->n_top,
                                               o->top_logprobs + (size_t)i * o->n_top, o->n_top));
            json_object_set_new(j, "top_logprobs", top);
        }
        break;
    }
    case DEVIO_EFFECT_FORK:
        json_object_set_new(j, "seq", json_integer((json_int_t)o->seq));
        json_object_set_new(j, "shared_blocks", json_integer(o->shared_blocks));
        break;
    case DEVIO_EFFECT_TRUNCATE:
        json_object_set_new(j, "len", json_integer(o->len));
        json_object_set_new(j, "freed_blocks", json_integer(o->freed_blocks));
        json_object_set_new(j, "freed_snapshots", json_integer(o->freed_snapshots));
        break;
    case DEVIO_EFFECT_SNAPSHOT:
        json_object_set_new(j, "len", json_integer(o->len));
        break;
    case DEVIO_EFFECT_FREE:
        json_object_set_new(j, "freed_blocks", json_integer(o->freed_blocks));
        json_object_set_new(j, "freed_snapshots", json_integer(o->freed_snapshots));
        json_object_set_new(j, "freed_logits", json_integer(o->freed_logits));
        if (o->parked_bytes) /* the sequence was parked: its host bytes went too */
            json_object_set_new(j, "parked_bytes", json_integer((json_int_t)o->parked_bytes));
        break;
    case DEVIO_EFFECT_PARK:
        json_object_set_new(j, "freed_blocks", json_integer(o->freed_blocks));
        json_object_set_new(j, "freed_snapshots", json_integer(o->freed_snapshots));
        json_object_set_new(j, "parked_bytes", json_integer((json_int_t)o->parked_bytes));
        break;
    case DEVIO_EFFECT_RESTORE:
        json_object_set_new(j, "parked_bytes", json_integer((json_int_t)o->parked_bytes));
        break;
    case DEVIO_EFFECT_RELEASE:
        /* Releasing a logits handle answers its kind only; a sequence's snapshots, their count. */
        if (e->seq)
            json_object_set_new(j, "freed_snapshots", json_integer(o->freed_snapshots));
        break;
    }
    return j;
}

json_t *devio_json_facts(const devio_facts *f)
{
    return json_pack("{s:{s:i,s:i,s:i,s:i},s:{s:i,s:i,s:i,s:i},s:{s:i,s:I},s:i,s:i,s:i,s:i,s:I}",
                     "kv", "block_size", f->block_size, "blocks_total", f->blocks_total,
                     "blocks_free", f->blocks_free, "blocks_shared", f->blocks_shared, "ssm",
                     "slots_total", f->ssm_slots_total, "slots_used", f->ssm_slots_used,
                     "snapshots_total", f->ssm_snapshots_total, "snapshots_used",
                     f->ssm_snapshots_used, "parked", "seqs", f->seqs_parked, "bytes",
                     (json_int_t)f->parked_bytes, "tickets_in_flight", f->tickets_in_flight,
                     "logits_live", f->logits_live, "logits_rows_live", f->logits_rows_live,
                     "adapters_loaded", f->adapters_loaded, "epoch", (json_int_t)f->epoch);
}

json_t *devio_json_logits_list(const devio_logits_info *h, uint32_t n)
{
    static const char *const states[] = {"pending", "ready", "failed"};
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < n; i++)
        if (json_array_append_new(
                list, json_pack("{s:I,s:I,s:I,s:i,s:i,s:s}", "logits", (json_int_t)h[i].logits,
                                "seq", (json_int_t)h[i].seq, "ticket", (json_int_t)h[i].ticket,
                                "rows", h[i].rows, "position", h[i].pos0, "state",
                                states[h[i].state])) != 0) {
            json_decref(list);
            list = NULL;
        }
    return json_pack("{s:o}", "handles", list);
}

json_t *devio_json_seq_info(const devio_seq_info *s)
{
    json_t *snaps = json_array();
    for (uint32_t i = 0; snaps && i < s->n_snapshots && i < DEVIO_SEQ_SNAPSHOTS_LISTED; i++)
        json_array_append_new(snaps, json_integer(s->snapshots[i]));
    return json_pack("{s:I,s:i,s:i,s:o,s:b,s:i,s:o,s:b}", "seq", (json_int_t)s->seq, "len",
                     s->len, "blocks", s->blocks, "busy",
                     s->busy_ticket ? json_integer((json_int_t)s->busy_ticket) : json_null(),
                     "ssm_slot", s->ssm_slot, "snapshots_held", s->n_snapshots, "snapshots",
                     snaps, "parked", s->parked);
}

json_t *devio_json_seq_list(const devio_seq_info *s, uint32_t n)
{
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, devio_json_seq_info(&s[i])) != 0) {
            json_decref(list);
            list = NULL;
        }
    return json_pack("{s:o}", "sequences", list);
}

json_t *devio_json_error(const devio_error *e)
{
    json_t *details = json_object();
    if (details && e->detail_key[0])
        json_object_set_new(details, e->detail_key, json_integer((json_int_t)e->detail_val));
    if (details && e->ticket)
        json_object_set_new(details, "ticket", json_integer((json_int_t)e->ticket));
    return json_pack("{s:{s:s,s:s,s:o}}", "error", "code", devio_status_str(e->status), "message",
                     e->message, "details", details);
}

char *devio_step_answer_text(const devio_step_result *r)
{
    json_t *j = devio_json_step_result(r);
    char *text = j ? json_dumps(j, DEVIO_JSON_FLAGS) : NULL;
    json_decref(j);
    return text;
}
