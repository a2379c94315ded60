/* json_fields.c - the field readers every decoder in api/ uses: object, keys, integers, numbers, text.
 * Each failure names the field; a reader must never accept a value its target cannot hold. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "api/json_fields.h"
#include "device/status.h"

devio_status devio_json_check_object(const json_t *j, const char *const *allowed,
                                     const char *what, devio_error *err)
{
    if (!json_is_object(j))
        return devio_fail(err, DEVIO_E_INVALID, "%s must be a JSON object", what);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)j, k, v) {
        bool ok = !allowed;
        for (size_t i = 0; allowed && allowed[i] && !ok; i++)
            ok = strcmp(k, allowed[i]) == 0;
        if (!ok)
            return devio_fail(err, DEVIO_E_INVALID, "unknown field '%s' in %s", k, what);
    }
    return DEVIO_OK;
}

devio_status devio_json_get_uint(const json_t *obj, const char *key, uint64_t max, bool required,
                                 uint64_t *out, devio_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return devio_fail(err, DEVIO_E_INVALID, "missing field '%s'", key);
        return DEVIO_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) > max)
        return devio_fail(err, DEVIO_E_INVALID, "field '%s' must be an integer in [0, %llu]", key,
                          (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return DEVIO_OK;
}

devio_status devio_json_get_float(const json_t *obj, const char *key, double lo, bool lo_open,
                                  double hi, float *out, devio_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return DEVIO_OK;
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    /* Written as !(in range) so that NaN fails. */
    if (!((lo_open ? d > lo : d >= lo) && d <= hi)) {
        if (!json_is_number(v))
            return devio_fail(err, DEVIO_E_INVALID, "field '%s' must be a number in %c%.9g, %.9g]",
                              key, lo_open ? '(' : '[', lo, hi);
        return devio_fail(err, DEVIO_E_INVALID, "field '%s' must be a number in %c%.9g, %.9g]"
                          " (got %.17g)", key, lo_open ? '(' : '[', lo, hi, d);
    }
    float f = (float)d;
    if (f == 0.0f && d != 0.0)
        f = copysignf(FLT_TRUE_MIN, (float)d);
    *out = f;
    return DEVIO_OK;
}

devio_status devio_json_get_bool(const json_t *obj, const char *key, bool *out, devio_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return DEVIO_OK;
    if (!json_is_boolean(v))
        return devio_fail(err, DEVIO_E_INVALID, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return DEVIO_OK;
}

devio_status devio_json_get_text(const json_t *obj, const char *key, char *buf, size_t size,
                                 devio_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return DEVIO_OK;
    if (!json_is_string(v))
        return devio_fail(err, DEVIO_E_INVALID, "field '%s' must be a string", key);
    size_t n = json_string_length(v);
    if (n >= size || strlen(json_string_value(v)) != n)
        return devio_fail(err, DEVIO_E_INVALID, "field '%s' must be text shorter than %zu bytes",
                          key, size);
    memcpy(buf, json_string_value(v), n + 1);
    return DEVIO_OK;
}
