/* adapter_codec.c - adapter records <-> JSON, the adapter command's acknowledgement, and the adapter command bodies.
 * The only place that spells an adapter's JSON; it must never disagree with itself between HTTP and scripts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/adapter_codec.h"
#include "api/codec.h"
#include "api/json_fields.h"
#include "device/status.h"

/* ---- records ------------------------------------------------------------- */

static json_t *targets_json(const char *t)
{
    json_t *a = json_array();
    while (a && *t) {
        size_t n = strcspn(t, ",");
        if (n > 0 && json_array_append_new(a, json_stringn(t, n)) != 0) {
            json_decref(a);
            return NULL;
        }
        t += n + (t[n] == ',');
    }
    return a;
}

static json_t *text_or_null(const char *s)
{
    return s[0] ? json_string(s) : json_null();
}

json_t *devio_json_adapter_record(const devio_adapter_record *r, devio_adapter_view view)
{
    const char *state = devio_adapter_state_str(r->state);
    json_t *j = json_pack("{s:s,s:s,s:I,s:o,s:o,s:o,s:o,s:I,s:s,s:b,s:I}", "name", r->name,
                          "path", r->path, "rank", (json_int_t)r->rank, "alpha",
                          devio_json_float(r->alpha), "scale", devio_json_float(r->scale),
                          "targets", targets_json(r->targets), "sha256", text_or_null(r->sha256),
                          "size", (json_int_t)r->size, "state", state ? state : "failed",
                          "pinned", r->pinned, "rows_served", (json_int_t)r->rows_served);
    if (!j || view == DEVIO_ADAPTER_VIEW_DEVICE)
        return j;
    if (json_object_set_new(j, "loaded_ms", json_integer(r->loaded_ms)) != 0 ||
        json_object_set_new(j, "last_used_ms", json_integer(r->last_used_ms)) != 0 ||
        json_object_set_new(j, "reason", text_or_null(r->reason)) != 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* "targets": ["q_proj", ...] back to "q_proj,..." */
static devio_status targets_decode(const json_t *j, char *buf, size_t size, devio_error *err)
{
    const json_t *a = json_object_get(j, "targets"), *v;
    size_t i, used = 0;
    if (!json_is_array(a))
        return devio_fail(err, DEVIO_E_INVALID, "adapter 'targets' must be an array of names");
    json_array_foreach(a, i, v) {
        size_t n = json_string_length(v);
        if (!json_is_string(v) || n == 0 || strchr(json_string_value(v), ','))
            return devio_fail(err, DEVIO_E_INVALID, "adapter target %zu is not a module name", i);
        if (used + (i > 0) + n >= size)
            return devio_fail(err, DEVIO_E_INVALID, "adapter targets longer than %zu bytes",
                              size - 1);
        if (i > 0)
            buf[used++] = ',';
        memcpy(buf + used, json_string_value(v), n);
        used += n;
    }
    buf[used] = '\0';
    return DEVIO_OK;
}

/* A number field that the encoder writes as null when it is not finite. */
static devio_status float_or_null(const json_t *j, const char *key, float *out, devio_error *err)
{
    const json_t *v = json_object_get(j, key);
    if (json_is_null(v)) {
        *out = NAN;
        return DEVIO_OK;
    }
    if (!json_is_number(v))
        return devio_fail(err, DEVIO_E_INVALID, "adapter '%s' must be a number or null", key);
    *out = (float)json_number_value(v);
    return DEVIO_OK;
}

devio_status devio_json_adapter_record_decode(const json_t *j, devio_adapter_record *out,
                                              devio_error *err)
{
    memset(out, 0, sizeof *out);
    uint64_t rank = 0, size = 0, rows = 0, loaded = 0, used = 0;
    devio_status s = devio_json_check_object(j, NULL, "an adapter record", err);
    if (s == DEVIO_OK && (!json_is_string(json_object_get(j, "name")) ||
                          !json_is_string(json_object_get(j, "path"))))
        s = devio_fail(err, DEVIO_E_INVALID, "an adapter record needs a 'name' and a 'path'");
    if (s == DEVIO_OK && !devio_adapter_state_parse(
                             json_string_value(json_object_get(j, "state")), &out->state))
        s = devio_fail(err, DEVIO_E_INVALID, "adapter 'state' must be loaded, unloaded, stale "
                                             "or failed");
    if (s == DEVIO_OK)
        s = devio_json_get_text(j, "name", out->name, sizeof out->name, err);
    if (s == DEVIO_OK)
        s = devio_json_get_text(j, "path", out->path, sizeof out->path, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "rank", UINT32_MAX, true, &rank, err);
    if (s == DEVIO_OK)
        s = float_or_null(j, "alpha", &out->alpha, err);
    if (s == DEVIO_OK)
        s = float_or_null(j, "scale", &out->scale, err);
    if (s == DEVIO_OK)
        s = targets_decode(j, out->targets, sizeof out->targets, err);
    if (s == DEVIO_OK)
        s = devio_json_get_text(j, "sha256", out->sha256, sizeof out->sha256, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "size", UINT64_MAX, true, &size, err);
    if (s == DEVIO_OK && !json_is_boolean(json_object_get(j, "pinned")))
        s = devio_fail(err, DEVIO_E_INVALID, "adapter 'pinned' must be a boolean");
    out->pinned = json_is_true(json_object_get(j, "pinned"));
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "rows_served", UINT64_MAX, true, &rows, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "loaded_ms", INT64_MAX, false, &loaded, err);
    if (s == DEVIO_OK)
        s = devio_json_get_uint(j, "last_used_ms", INT64_MAX, false, &used, err);
    if (s == DEVIO_OK)
        s = devio_json_get_text(j, "reason", out->reason, sizeof out->reason, err);
    out->rank = (uint32_t)rank;
    out->size = size;
    out->rows_served = rows;
    out->loaded_ms = (int64_t)loaded;
    out->last_used_ms = (int64_t)used;
    return s;
}

/* ---- an adapter command's acknowledgement --------------------------------- */

json_t *devio_json_adapter_ack(const devio_adapter_record *recs, uint32_t n,
                               const char *evicted)
{
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, devio_json_adapter_record(
                                            &recs[i], DEVIO_ADAPTER_VIEW_DEVICE)) != 0) {
            json_decref(list);
            list = NULL;
        }
    json_t *j = json_pack("{s:o}", "adapters", list); /* takes list, even on failure */
    if (j && evicted && evicted[0] &&
        json_object_set_new(j, "evicted", json_string(evicted)) != 0) {
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* ---- command bodies ------------------------------------------------------- */

/* The load fields, wherever they come from: "path" (required for a load) and "pin". */
static devio_status load_fields(const json_t *j, bool need_path, devio_adapter_load_body *out,
                                devio_error *err)
{
    out->path = json_string_value(json_object_get(j, "path"));
    out->pin = false;
    devio_status s = devio_json_get_bool(j, "pin", &out->pin, err);
    if (s == DEVIO_OK && need_path && (!out->path || !out->path[0]))
        s = devio_fail(err, DEVIO_E_INVALID, "load needs a non-empty string 'path'");
    return s;
}

devio_status devio_json_adapter_load_decode(const json_t *j, devio_adapter_load_body *out,
                                            devio_error *err)
{
    static const char *const keys[] = {"path", "pin", NULL};
    memset(out, 0, sizeof *out);
    devio_status s = devio_json_check_object(j, keys, "the adapter body", err);
    return s == DEVIO_OK ? load_fields(j, true, out, err) : s;
}

devio_status devio_json_adapter_cmd_decode(const json_t *j, devio_adapter_cmd *out, devio_error *err)
{
    static const char *const kinds[] = {"load", "unload", "list", "pin", "unpin"};
    static const char *const keys[] = {"kind", "name", "path", "pin", NULL};
    memset(out, 0, sizeof *out);
    devio_status s = devio_json_check_object(j, keys, "the adapter command", err);
    if (s != DEVIO_OK)
        return s;
    const char *k = json_string_value(json_object_get(j, "kind"));
    int kind = -1;
    for (int i = 0; k && i < 5; i++)
        if (strcmp(k, kinds[i]) == 0)
            kind = i;
    if (kind < 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter command 'kind' must be load, unload, list, pin or unpin");
    out->kind = (devio_adapter_cmd_kind)kind;
    out->name = json_string_value(json_object_get(j, "name"));
    if (out->kind != DEVIO_ADAPTER_CMD_LIST && !out->name)
        return devio_fail(err, DEVIO_E_INVALID, "adapter command needs a 'name'");
    devio_adapter_load_body load;
    s = load_fields(j, out->kind == DEVIO_ADAPTER_CMD_LOAD, &load, err);
    out->path = load.path;
    out->pin = load.pin;
    return s;
}
