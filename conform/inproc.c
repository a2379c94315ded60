/* inproc.c - the in-process script target: each operation decode -> device call -> encode, and logits reads.
 * It owns no state; it must never encode or decode anything itself, only through the codecs of api/. */
#include <stdlib.h>
#include <string.h>

#include "api/adapter_codec.h"
#include "api/codec.h"
#include "api/plan_run.h"
#include "conform/inproc.h"
#include "device/model/model.h"
#include "device/status.h"

typedef devio_status (*op_fn)(devio_device *d, const json_t *body, json_t **result,
                              devio_error *err);

static devio_status op_create(devio_device *d, const json_t *body, json_t **result,
                              devio_error *err)
{
    (void)body;
    uint64_t seq = 0;
    devio_status s = devio_seq_create(d, &seq, err);
    if (s == DEVIO_OK)
        *result = devio_json_seq_ref(seq);
    return s;
}

static devio_status op_seq(devio_device *d, const json_t *body, json_t **result,
                           devio_error *err)
{
    uint64_t seq = 0;
    devio_seq_info info;
    devio_status s = devio_json_id_decode(body, "seq", &seq, err);
    if (s == DEVIO_OK)
        s = devio_seq_info_get(d, seq, &info, err);
    if (s == DEVIO_OK)
        *result = devio_json_seq_info(&info);
    return s;
}

/* The starter of devio_plan_run here: the plain launch, ctx its ticket. */
static devio_status start_launch(void *ctx, devio_device *d, const devio_plan *plan,
                                 devio_error *err)
{
    return devio_launch(d, plan, ctx, err);
}

static devio_status await_ticket(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                                 json_t **result, devio_error *err)
{
    devio_step_result r;
    devio_status s = devio_await(d, ticket, timeout_ms, &r, err);
    if (s != DEVIO_OK)
        return s;
    *result = devio_json_step_result(&r);
    devio_step_result_free(&r);
    return s;
}

static devio_status op_launch(devio_device *d, const json_t *body, json_t **result,
                              devio_error *err)
{
    uint64_t ticket = 0;
    devio_status s = devio_plan_run(d, body, start_launch, &ticket, err);
    if (s == DEVIO_OK)
        *result = devio_json_ticket_ref(ticket);
    return s;
}

static devio_status op_await(devio_device *d, const json_t *body, json_t **result,
                             devio_error *err)
{
    uint64_t ticket = 0;
    int64_t timeout_ms = -1;
    devio_status s = devio_json_await_decode(body, &ticket, &timeout_ms, err);
    return s == DEVIO_OK ? await_ticket(d, ticket, timeout_ms, result, err) : s;
}

static devio_status op_step(devio_device *d, const json_t *body, json_t **result,
                            devio_error *err)
{
    uint64_t ticket = 0;
    devio_status s = devio_plan_run(d, body, start_launch, &ticket, err);
    return s == DEVIO_OK ? await_ticket(d, ticket, -1, result, err) : s;
}

static devio_status op_apply(devio_device *d, const json_t *body, json_t **result,
                             devio_error *err)
{
    devio_effect e;
    devio_outcome o;
    devio_sample_buf pb;
    devio_status s = devio_json_effect_decode(body, &e, &pb, err);
    if (s == DEVIO_OK)
        s = devio_apply(d, &e, &o, err);
    if (s == DEVIO_OK) {
        *result = devio_json_outcome(&e, &o);
        devio_outcome_free(&o);
    }
    devio_sample_buf_free(&pb);
    return s;
}

static devio_status op_facts(devio_device *d, const json_t *body, json_t **result,
                             devio_error *err)
{
    (void)body;
    (void)err;
    devio_facts f = devio_facts_get(d);
    *result = devio_json_facts(&f);
    return DEVIO_OK;
}

static devio_status op_lora(devio_device *d, const json_t *body, json_t **result,
                            devio_error *err)
{
    devio_adapter_cmd cmd;
    devio_adapter_ack ack;
    devio_status s = devio_json_adapter_cmd_decode(body, &cmd, err);
    if (s == DEVIO_OK)
        s = devio_adapter_command(d, &cmd, &ack, err);
    if (s == DEVIO_OK) {
        *result = devio_json_adapter_ack(ack.adapters, ack.n_adapters, ack.evicted);
        devio_adapter_ack_free(&ack);
    }
    return s;
}

static const struct {
    const char *name;
    op_fn fn;
} ops[] = {
    {"create", op_create}, {"seq", op_seq},     {"launch", op_launch}, {"await", op_await},
    {"step", op_step},     {"apply", op_apply}, {"facts", op_facts},   {"lora", op_lora},
};

devio_status devio_inproc_call(devio_device *d, const char *op, const json_t *body,
                               json_t **result, devio_error *err)
{
    *result = NULL;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        if (strcmp(op, ops[i].name) != 0)
            continue;
        devio_status s = ops[i].fn(d, body, result, err);
        if (s == DEVIO_OK && !*result)
            s = devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the result");
        return s;
    }
    return devio_fail(err, DEVIO_E_INVALID, "unknown operation '%s'", op);
}

static devio_status inproc_call(void *ctx, const char *op, const json_t *body, json_t **result,
                                devio_error *err)
{
    return devio_inproc_call(ctx, op, body, result, err);
}

static devio_status inproc_logits(void *ctx, uint64_t id, float **data, uint32_t *n_rows,
                                  uint32_t *vocab, devio_error *err)
{
    devio_device *d = ctx;
    uint32_t rows = 0;
    *data = NULL;
    devio_status s = devio_logits_read(d, id, 0, 0, NULL, &rows, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t v = devio_model_of(d)->cfg.vocab_size;
    float *buf = malloc((size_t)rows * v * sizeof *buf + 1);
    if (!buf)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading logits");
    s = devio_logits_read(d, id, 0, rows, buf, &rows, err);
    if (s != DEVIO_OK) {
        free(buf);
        return s;
    }
    *data = buf;
    *n_rows = rows;
    *vocab = v;
    return DEVIO_OK;
}

static devio_status inproc_export(void *ctx, uint64_t seq, bool snapshots, uint8_t **data,
                                  size_t *n, devio_error *err)
{
    devio_export *x = NULL;
    uint64_t total = 0;
    *data = NULL;
    devio_status s = devio_export_open(ctx, seq, snapshots, &x, &total, err);
    if (s != DEVIO_OK)
        return s;
    uint8_t *buf = malloc((size_t)total);
    size_t got = 0, k = 1;
    if (!buf)
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory for a state of %llu bytes",
                       (unsigned long long)total);
    while (s == DEVIO_OK && k > 0 && got < total) {
        s = devio_export_read(x, buf + got, (size_t)total - got, &k, err);
        got += k;
    }
    devio_export_close(x);
    if (s != DEVIO_OK) {
        free(buf);
        return s;
    }
    *data = buf;
    *n = got;
    return DEVIO_OK;
}

static devio_status inproc_import(void *ctx, const uint8_t *data, size_t n, uint64_t *seq,
                                  devio_error *err)
{
    devio_import *m = NULL;
    devio_status s = devio_import_open(ctx, 0, &m, err);
    if (s == DEVIO_OK)
        s = devio_import_write(m, data, n, err);
    if (s == DEVIO_OK)
        s = devio_import_finish(m, seq, err);
    devio_import_close(m);
    return s;
}

void devio_inproc_target(devio_device *d, devio_script_target *t)
{
    t->ctx = d;
    t->call = inproc_call;
    t->logits = inproc_logits;
    t->state_export = inproc_export;
    t->state_import = inproc_import;
}
