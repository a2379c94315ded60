/* dispatch.c - decode a JSON body, call the device, encode the answer.
 * It owns no state; it must never answer differently for HTTP and for scripts. */
#include <string.h>

#include "api/codec.h"
#include "api/dispatch.h"
#include "device/status.h"

static devio_status nomem(json_t **result, devio_error *err)
{
    if (*result)
        return DEVIO_OK;
    return devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the result");
}

static devio_status do_launch(devio_device *d, const json_t *body, uint64_t *ticket,
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

static devio_status do_await(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                             json_t **result, devio_error *err)
{
    devio_step_result r;
    devio_status s = devio_await(d, ticket, timeout_ms, &r, err);
    if (s != DEVIO_OK)
        return s;
    *result = devio_json_step_result(&r);
    devio_step_result_free(&r);
    return nomem(result, err);
}

static devio_status get_id(const json_t *body, const char *key, uint64_t *out, devio_error *err)
{
    const json_t *v = json_object_get(body, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return devio_fail(err, DEVIO_E_INVALID, "'%s' must be a non-negative integer id", key);
    *out = (uint64_t)json_integer_value(v);
    return DEVIO_OK;
}

devio_status devio_api_call(devio_device *d, const char *op, const json_t *body,
                            json_t **result, devio_error *err)
{
    *result = NULL;
    devio_status s;
    uint64_t id = 0;
    if (strcmp(op, "create") == 0) {
        s = devio_seq_create(d, &id, err);
        if (s == DEVIO_OK)
            *result = json_pack("{s:I}", "seq", (json_int_t)id);
    } else if (strcmp(op, "seq") == 0) {
        devio_seq_info info;
        s = get_id(body, "seq", &id, err);
        if (s == DEVIO_OK)
            s = devio_seq_info_get(d, id, &info, err);
        if (s == DEVIO_OK)
            *result = devio_json_seq_info(&info);
    } else if (strcmp(op, "launch") == 0) {
        s = do_launch(d, body, &id, err);
        if (s == DEVIO_OK)
            *result = json_pack("{s:I}", "ticket", (json_int_t)id);
    } else if (strcmp(op, "await") == 0) {
        s = get_id(body, "ticket", &id, err);
        const json_t *jt = json_object_get(body, "timeout_ms");
        int64_t timeout = -1;
        if (s == DEVIO_OK && jt) {
            if (!json_is_integer(jt) || json_integer_value(jt) < 0)
                return devio_fail(err, DEVIO_E_INVALID, "'timeout_ms' must be >= 0");
            timeout = json_integer_value(jt);
        }
        if (s == DEVIO_OK)
            return do_await(d, id, timeout, result, err);
    } else if (strcmp(op, "step") == 0) {
        s = do_launch(d, body, &id, err);
        if (s == DEVIO_OK)
            return do_await(d, id, -1, result, err);
    } else if (strcmp(op, "apply") == 0) {
        devio_effect e;
        devio_outcome o;
        s = devio_json_effect_decode(body, &e, err);
        if (s == DEVIO_OK)
            s = devio_apply(d, &e, &o, err);
        if (s == DEVIO_OK) {
            *result = devio_json_outcome(&o);
            devio_outcome_free(&o);
        }
    } else if (strcmp(op, "facts") == 0) {
        devio_facts f = devio_facts_get(d);
        *result = devio_json_facts(&f);
        s = DEVIO_OK;
    } else if (strcmp(op, "lora") == 0) {
        devio_lora_cmd cmd;
        devio_lora_ack ack;
        s = devio_json_lora_cmd_decode(body, &cmd, err);
        if (s == DEVIO_OK)
            s = devio_lora(d, &cmd, &ack, err);
        if (s == DEVIO_OK) {
            *result = devio_json_lora_ack(&ack);
            devio_lora_ack_free(&ack);
        }
    } else {
        return devio_fail(err, DEVIO_E_INVALID, "unknown operation '%s'", op);
    }
    if (s != DEVIO_OK)
        return s;
    return nomem(result, err);
}
