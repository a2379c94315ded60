/* dispatch.c - the operations of a conformance script, each decode -> device call -> encode.
 * It owns no state; it must never encode or decode anything itself, only through the shared codecs. */
#include <string.h>

#include "api/adapter_codec.h"
#include "api/codec.h"
#include "api/dispatch.h"
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

static devio_status launch_plan(devio_device *d, const json_t *body, uint64_t *ticket,
                                devio_error *err)
{
    const devio_config *c = devio_config_of(d);
    devio_plan_buf buf;
    devio_status s = devio_json_plan_decode(body, c->max_rows, c->max_batch_tokens, &buf, err);
    if (s != DEVIO_OK)
        return s;
    s = devio_launch(d, &buf.plan, ticket, err);
    devio_plan_buf_free(&buf);
    return s;
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
    devio_status s = launch_plan(d, body, &ticket, err);
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
    devio_status s = launch_plan(d, body, &ticket, err);
    return s == DEVIO_OK ? await_ticket(d, ticket, -1, result, err) : s;
}

static devio_status op_apply(devio_device *d, const json_t *body, json_t **result,
                             devio_error *err)
{
    devio_effect e;
    devio_outcome o;
    devio_sample_proc_buf pb;
    devio_status s = devio_json_effect_decode(body, &e, &pb, err);
    if (s == DEVIO_OK)
        s = devio_apply(d, &e, &o, err);
    if (s == DEVIO_OK) {
        *result = devio_json_outcome(&e, &o);
        devio_outcome_free(&o);
    }
    devio_sample_proc_buf_free(&pb);
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
    devio_lora_cmd cmd;
    devio_lora_ack ack;
    devio_status s = devio_json_lora_cmd_decode(body, &cmd, err);
    if (s == DEVIO_OK)
        s = devio_lora(d, &cmd, &ack, err);
    if (s == DEVIO_OK) {
        *result = devio_json_lora_ack(&ack);
        devio_lora_ack_free(&ack);
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

devio_status devio_api_call(devio_device *d, const char *op, const json_t *body,
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
