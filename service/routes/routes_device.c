/* routes_device.c - the routes over device state: sequences, effects, logits, facts, the device, teardown.
 * Decode with api/, call device/devio.h under the server's device lock, encode with api/; nothing else. */
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "common/clock.h"
#include "common/version.h"
#include "device/status.h"
#include "service/http/request.h"
#include "service/routes/route_handlers.h"
#include "service/server.h"

/* How often a teardown parked behind awaits under way looks again. */
#define TEARDOWN_POLL_US 5000

/* Makes an answer's JSON from the device, which the caller holds. */
typedef devio_status device_answer(devio_server *s, const devio_request *rq, devio_device *dev,
                                   json_t **j, devio_error *err);

/* Under the device read lock, `make` the answer; then send it with `code`. */
static devio_status answer(devio_server *s, const devio_request *rq, device_answer *make,
                           unsigned code, devio_reply *out, devio_error *err)
{
    devio_device *dev;
    json_t *j = NULL;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = make(s, rq, dev, &j, err);
    devio_server_release(s);
    return st == DEVIO_OK ? devio_reply_json(out, code, j, err) : st;
}

/* A keyed request that made a sequence (create, fork, import) whose answer could not
 * be kept under its key: the sequence goes, so that the retry makes it once. */
void devio_route_free_made_seq(devio_server *s, uint64_t seq)
{
    devio_device *dev;
    if (devio_server_hold(s, &dev, NULL) != DEVIO_OK)
        return;
    devio_outcome o;
    devio_effect e = {.kind = DEVIO_EFFECT_FREE, .seq = seq};
    if (devio_apply(dev, &e, &o, NULL) == DEVIO_OK)
        devio_outcome_free(&o);
    devio_server_release(s);
}

static devio_status seq_created(devio_server *s, const devio_request *rq, devio_device *dev,
                                json_t **j, devio_error *err)
{
    (void)s;
    uint64_t seq = 0;
    devio_status st = devio_seq_create(dev, &seq, err);
    if (st == DEVIO_OK) {
        devio_keyed_undo_with(rq->keyed, devio_route_free_made_seq, seq);
        *j = devio_json_seq_ref(seq);
    }
    return st;
}

static devio_status seq_info(devio_server *s, const devio_request *rq, devio_device *dev,
                             json_t **j, devio_error *err)
{
    (void)s;
    devio_seq_info info;
    devio_status st = devio_seq_info_get(dev, rq->params.id, &info, err);
    if (st == DEVIO_OK)
        *j = devio_json_seq_info(&info);
    return st;
}

static devio_status seqs_listed(devio_server *s, const devio_request *rq, devio_device *dev,
                                json_t **j, devio_error *err)
{
    (void)s;
    (void)rq;
    uint32_t cap = devio_config_of(dev)->max_seqs, n = 0;
    devio_seq_info *v = calloc(cap ? cap : 1, sizeof *v);
    if (!v)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory listing sequences");
    devio_status st = devio_seq_list(dev, v, cap, &n, err);
    if (st == DEVIO_OK)
        *j = devio_json_seq_list(v, n < cap ? n : cap);
    free(v);
    return st;
}

static devio_status outcome_of(devio_server *s, const devio_request *rq, devio_device *dev,
                               const devio_effect *e, json_t **j, devio_error *err)
{
    devio_outcome o;
    devio_status st = devio_apply(dev, e, &o, err);
    if (st == DEVIO_OK) {
        if (e->kind == DEVIO_EFFECT_SAMPLE)
            devio_metrics_sampled(&s->metrics, o.n_tokens);
        if (e->kind == DEVIO_EFFECT_FORK)
            devio_keyed_undo_with(rq->keyed, devio_route_free_made_seq, o.seq);
        *j = devio_json_outcome(e, &o);
        devio_outcome_free(&o);
    }
    return st;
}

/* DELETE /v1/sequences/{id} is the free effect. */
static devio_status seq_freed(devio_server *s, const devio_request *rq, devio_device *dev,
                              json_t **j, devio_error *err)
{
    devio_effect e = {.kind = DEVIO_EFFECT_FREE, .seq = rq->params.id};
    return outcome_of(s, rq, dev, &e, j, err);
}

static devio_status effect_applied(devio_server *s, const devio_request *rq, devio_device *dev,
                                   json_t **j, devio_error *err)
{
    devio_effect e;
    devio_sample_buf pb;
    devio_status st = devio_json_effect_decode(rq->body, &e, &pb, err);
    if (st == DEVIO_OK)
        st = outcome_of(s, rq, dev, &e, j, err);
    devio_sample_buf_free(&pb);
    return st;
}

static devio_status facts(devio_server *s, const devio_request *rq, devio_device *dev,
                          json_t **j, devio_error *err)
{
    (void)s;
    (void)rq;
    (void)err;
    devio_facts f = devio_facts_get(dev);
    *j = devio_json_facts(&f);
    return DEVIO_OK;
}

devio_status devio_route_seq_create(devio_server *s, const devio_request *rq, devio_reply *out,
                                    devio_error *err)
{
    return answer(s, rq, seq_created, 201, out, err);
}

devio_status devio_route_seq_list(devio_server *s, const devio_request *rq, devio_reply *out,
                                  devio_error *err)
{
    return answer(s, rq, seqs_listed, 200, out, err);
}

devio_status devio_route_seq_get(devio_server *s, const devio_request *rq, devio_reply *out,
                                 devio_error *err)
{
    return answer(s, rq, seq_info, 200, out, err);
}

devio_status devio_route_seq_delete(devio_server *s, const devio_request *rq, devio_reply *out,
                                    devio_error *err)
{
    return answer(s, rq, seq_freed, 200, out, err);
}

devio_status devio_route_effects(devio_server *s, const devio_request *rq, devio_reply *out,
                                 devio_error *err)
{
    return answer(s, rq, effect_applied, 200, out, err);
}

devio_status devio_route_facts(devio_server *s, const devio_request *rq, devio_reply *out,
                               devio_error *err)
{
    return answer(s, rq, facts, 200, out, err);
}

/* ---- logits ------------------------------------------------------------------- */

/* Every position of handle `id`: *data holds rows * vocab floats (caller frees). */
static devio_status read_logits(devio_server *s, uint64_t id, float **data, uint32_t *rows,
                                devio_error *err)
{
    devio_device *dev;
    *data = NULL;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    uint32_t vocab = devio_model_of(dev)->cfg.vocab_size;
    st = devio_logits_read(dev, id, 0, 0, NULL, rows, err);
    if (st == DEVIO_OK) {
        *data = malloc((size_t)*rows * vocab * sizeof **data + 1);
        st = *data ? devio_logits_read(dev, id, 0, *rows, *data, rows, err)
                   : devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    }
    devio_server_release(s);
    if (st != DEVIO_OK) {
        free(*data);
        *data = NULL;
    }
    return st;
}

/* The k largest of v[0..vocab) by value, first index first among equals, into
 * best (k entries); returns how many (min(k, vocab)). Partial selection: k is
 * small, vocab is large. */
static uint32_t top_k(const float *v, uint32_t vocab, uint32_t k, int32_t *best)
{
    uint32_t n = 0;
    for (uint32_t i = 0; k && i < vocab; i++) {
        uint32_t pos = n;
        while (pos > 0 && (v[i] > v[best[pos - 1]]))
            pos--;
        if (pos >= k)
            continue;
        uint32_t end = n < k ? n : k - 1;
        memmove(best + pos + 1, best + pos, (end - pos) * sizeof *best);
        best[pos] = (int32_t)i;
        if (n < k)
            n++;
    }
    return n;
}

static json_t *top_json(const float *v, uint32_t vocab, uint32_t k)
{
    int32_t *best = calloc(k ? k : 1, sizeof *best);
    json_t *list = best ? json_array() : NULL;
    uint32_t n = list ? top_k(v, vocab, k, best) : 0;
    for (uint32_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, json_pack("[i,o]", best[i], devio_json_float(v[best[i]]))))
            break;
    free(best);
    return list;
}

devio_status devio_route_logits(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    uint64_t top = 5, row = 0;
    bool present;
    devio_status st = devio_request_query_u64(rq, "top", &top, &present, err);
    if (st == DEVIO_OK)
        st = devio_request_query_u64(rq, "row", &row, &present, err);
    if (st == DEVIO_OK && top > 1000)
        st = devio_fail(err, DEVIO_E_INVALID, "top must be at most 1000");
    if (st != DEVIO_OK)
        return st;
    const char *accept = devio_request_header(rq, "Accept");
    uint32_t rows = 0, vocab = s->model->cfg.vocab_size;
    float *data = NULL;
    st = read_logits(s, rq->params.id, &data, &rows, err);
    if (st != DEVIO_OK)
        return st;
    if (accept && strstr(accept, "application/octet-stream")) {
        /* Little-endian f32, the host order of every platform devio runs on. */
        devio_reply_bytes(out, 200, "application/octet-stream", (char *)data,
                          (size_t)rows * vocab * sizeof(float));
        return DEVIO_OK;
    }
    if (row >= rows)
        st = devio_fail(err, DEVIO_E_INVALID, "row is outside the handle's rows");
    else
        st = devio_reply_json(out, 200,
                              json_pack("{s:[i,i],s:I,s:o}", "shape", rows, vocab, "row",
                                        (json_int_t)row, "top",
                                        top_json(data + (size_t)row * vocab, vocab,
                                                 (uint32_t)(top < vocab ? top : vocab))),
                              err);
    free(data);
    return st;
}

static devio_status logits_listed(devio_server *s, const devio_request *rq, devio_device *dev,
                                  json_t **j, devio_error *err)
{
    (void)s;
    (void)rq;
    uint32_t cap = devio_config_of(dev)->logits_handles, n = 0;
    devio_logits_info *h = calloc(cap ? cap : 1, sizeof *h);
    if (!h)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory listing logits handles");
    devio_status st = devio_logits_list(dev, h, cap, &n, err);
    if (st == DEVIO_OK)
        *j = devio_json_logits_list(h, n < cap ? n : cap);
    free(h);
    return st;
}

devio_status devio_route_logits_list(devio_server *s, const devio_request *rq, devio_reply *out,
                                     devio_error *err)
{
    return answer(s, rq, logits_listed, 200, out, err);
}

/* ---- the device ---------------------------------------------------------------- */

/* The body of GET /v1/device: the backend running and its device, the
 * model and the limits in force. */
static json_t *device_json(const devio_model *model, const devio_config *c,
                           const devio_device_info *d)
{
    const devio_model_config *m = &model->cfg;
    json_t *hw = json_pack("{s:s,s:I,s:I,s:I,s:s,s:s,s:s,s:s}", "name", d->device,
                           "memory_total", (json_int_t)d->memory_total, "memory_free",
                           (json_int_t)d->memory_free, "memory_used", (json_int_t)d->memory_used,
                           "compute_capability", d->compute_capability, "driver", d->driver,
                           "runtime", d->runtime, "failure", d->failure);
    return json_pack(
        "{s:s,s:s,s:s,s:o,s:{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b},s:i,s:{s:i,s:i,s:i,"
        "s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i},s:i,s:I}",
        "version", DEVIO_VERSION, "backend", d->backend, "numerics",
        devio_numerics_str(d->numerics), "device", hw, "model", "architecture", m->architecture,
        /* The embedding's: every architecture has one (layer 0 may be a mixer). */
        "dtype", devio_dtype_str(model->embed.dtype), "vocab_size", m->vocab_size,
        "hidden_size", m->hidden_size, "intermediate_size", m->intermediate_size, "layers",
        m->n_layers, "heads", m->n_heads, "kv_heads", m->n_kv_heads, "head_dim", m->head_dim,
        "max_position_embeddings", m->max_position_embeddings, "tied_embeddings",
        m->tie_word_embeddings, "max_depth", c->max_depth, "limits", "block_size", c->block_size,
        "kv_blocks", c->kv_blocks, "max_seqs", c->max_seqs, "max_seq_len", c->max_seq_len,
        "max_rows", c->max_rows, "max_batch_tokens", c->max_batch_tokens, "logits_handles",
        c->logits_handles, "logits_rows", c->logits_rows, "max_loras", c->max_loras,
        "max_lora_rank", c->max_lora_rank, "ssm_slots", c->ssm_slots, "ssm_snapshots",
        c->ssm_snapshots, "threads", c->threads, "epoch",
        (json_int_t)c->epoch);
}

static devio_status device_body(devio_server *s, const devio_request *rq, devio_device *dev,
                                json_t **j, devio_error *err)
{
    (void)rq;
    (void)err;
    devio_device_info info;
    devio_device_info_get(dev, &info);
    *j = device_json(s->model, devio_config_of(dev), &info);
    return DEVIO_OK;
}

devio_status devio_route_device(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    return answer(s, rq, device_body, 200, out, err);
}

/* ---- the model ------------------------------------------------------------------ */

static json_t *id_or_null(int64_t id)
{
    return id >= 0 ? json_integer((json_int_t)id) : json_null();
}

/* The body of GET /v1/model: what a client needs to tokenize, template and
 * stop for this model, and the limits devio applies to it. */
static json_t *model_json(const devio_model *model, const devio_config *c)
{
    const devio_model_config *m = &model->cfg;
    json_t *types = json_array();
    uint32_t bits = devio_model_dtypes(model);
    for (uint32_t dt = 0; dt < 32; dt++)
        if (bits >> dt & 1u)
            json_array_append_new(types, json_string(devio_dtype_str((devio_dtype)dt)));
    const devio_model_text *t = &model->text;
    return json_pack(
        "{s:s,s:s,s:o,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:i,s:o,s:o,s:o,s:o,s:{s:i,s:I,s:i,s:i}}",
        "format", t->format, "architecture", m->architecture, "weight_types", types,
        "vocab_size", m->vocab_size, "hidden_size", m->hidden_size, "intermediate_size",
        m->intermediate_size, "layers", m->n_layers, "heads", m->n_heads, "kv_heads",
        m->n_kv_heads, "head_dim", m->head_dim, "tied_embeddings", m->tie_word_embeddings,
        "context_length", m->max_position_embeddings, "bos_token_id", id_or_null(t->bos_id),
        "eos_token_id", id_or_null(t->eos_id), "pad_token_id", id_or_null(t->pad_id),
        "chat_template", t->chat_template ? json_string(t->chat_template) : json_null(),
        "limits", "max_seq_len", c->max_seq_len, "kv_tokens",
        (json_int_t)c->kv_blocks * c->block_size, "max_seqs", c->max_seqs, "ssm_slots",
        c->ssm_slots);
}

static devio_status model_body(devio_server *s, const devio_request *rq, devio_device *dev,
                               json_t **j, devio_error *err)
{
    (void)rq;
    *j = model_json(s->model, devio_config_of(dev));
    return *j ? DEVIO_OK : devio_fail(err, DEVIO_E_NOMEM, "out of memory");
}

devio_status devio_route_model(devio_server *s, const devio_request *rq, devio_reply *out,
                               devio_error *err)
{
    return answer(s, rq, model_body, 200, out, err);
}

devio_status devio_route_teardown(devio_server *s, const devio_request *rq, devio_reply *out,
                                  devio_error *err)
{
    /* Awaits under way get their answers first, as when each held a thread
     * the teardown waited for: park and look again every TEARDOWN_POLL_US.
     * Ticket 0 is never settled, so only the deadline resumes this wait. */
    if (rq->wait && atomic_load(&s->awaiting) > 0) {
        devio_waits_enter(&s->waits, rq->wait, rq->conn, 0,
                          (int64_t)devio_clock_us() + TEARDOWN_POLL_US);
        if (devio_waits_park(&s->waits, rq->wait) == DEVIO_WAIT_PARKED) {
            out->suspended = true;
            return DEVIO_OK;
        }
    }
    uint32_t aborted = 0;
    if (!devio_server_teardown(s, "device torn down", &aborted))
        return devio_fail(err, DEVIO_E_TORN_DOWN, "device already torn down");
    return devio_reply_json(out, 200, json_pack("{s:b,s:i}", "torn_down", 1, "aborted", aborted),
                            err);
}
