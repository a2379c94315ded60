/* request.c - request accessors over libmicrohttpd and the reply constructors every route uses.
 * A reply always ends with a body: it must never leave a handler's answer half made. */
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "api/codec.h"
#include "device/status.h"
#include "service/http/body_out.h"
#include "service/http/http_error.h"
#include "service/http/request.h"

const char *devio_request_query(const devio_request *rq, const char *key)
{
    return rq->conn ? MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, key) : NULL;
}

const char *devio_request_header(const devio_request *rq, const char *key)
{
    return rq->conn ? MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, key) : NULL;
}

devio_status devio_request_query_u64(const devio_request *rq, const char *key, uint64_t *out,
                                     bool *present, devio_error *err)
{
    const char *v = devio_request_query(rq, key);
    *present = v != NULL;
    if (v && !devio_route_parse_id(v, strlen(v), out))
        return devio_fail(err, DEVIO_E_INVALID, "%s must be a non-negative integer", key);
    return DEVIO_OK;
}

devio_status devio_request_name(const devio_request *rq, char name[DEVIO_ADAPTER_NAME_MAX],
                                devio_error *err)
{
    if (rq->params.name_len >= DEVIO_ADAPTER_NAME_MAX)
        return devio_fail(err, DEVIO_E_INVALID, "adapter name too long");
    memcpy(name, rq->params.name, rq->params.name_len);
    name[rq->params.name_len] = '\0';
    return DEVIO_OK;
}

devio_status devio_reply_json(devio_reply *r, unsigned code, json_t *j, devio_error *err)
{
    char *text = j ? json_dumps(j, DEVIO_JSON_FLAGS) : NULL;
    json_decref(j);
    if (!text)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory encoding the answer");
    devio_reply_bytes(r, code, "application/json", text, strlen(text));
    return DEVIO_OK;
}

void devio_reply_bytes(devio_reply *r, unsigned code, const char *ctype, char *body, size_t len)
{
    free(r->body);
    devio_body_out_free(r->stream);
    r->stream = NULL;
    if (r->response)
        MHD_destroy_response(r->response);
    r->response = NULL;
    r->code = code;
    r->ctype = ctype;
    r->body = body;
    r->len = len;
}

void devio_reply_error(devio_reply *r, const devio_error *e)
{
    static const char oom[] =
        "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"encoding\",\"details\":{}}}";
    devio_error nomem = {0};
    if (devio_reply_json(r, devio_http_code(e->status), devio_json_error(e), &nomem) == DEVIO_OK)
        return;
    char *text = strdup(oom);
    devio_reply_bytes(r, 500, "application/json", text, text ? strlen(text) : 0);
}

void devio_reply_stream(devio_reply *r, unsigned code, const char *ctype, devio_body_out *body)
{
    devio_reply_bytes(r, code, ctype, NULL, 0);
    r->stream = body;
}

void devio_reply_free(devio_reply *r)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
    devio_body_out_free(r->stream);
    r->stream = NULL;
    if (r->response)
        MHD_destroy_response(r->response);
    r->response = NULL;
}
