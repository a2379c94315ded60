/* routes_adapters.c - the adapter routes: list, get, load (PUT), unload (DELETE), pin, unpin.
 * Bodies and records go through api/adapter_codec.h; the commands through service/adapters.c, under the device lock. */
#include <stdlib.h>

#include "api/adapter_codec.h"
#include "device/status.h"
#include "service/http/request.h"
#include "service/routes/route_handlers.h"
#include "service/server.h"

/* One adapter command, as the routes below spell it. */
typedef enum cmd { CMD_GET, CMD_LOAD, CMD_UNLOAD, CMD_PIN, CMD_UNPIN } cmd;

static devio_status run(devio_server *s, devio_device *dev, cmd c, const char *name,
                        const devio_adapter_load_body *load, devio_adapter_record *rec,
                        char evicted[DEVIO_ADAPTER_NAME_MAX], devio_error *err)
{
    switch (c) {
    case CMD_GET:
        return devio_adapters_get(&s->adapters, dev, name, rec, err);
    case CMD_LOAD:
        return devio_adapters_load(&s->adapters, dev, name, load->path, load->pin, rec, evicted,
                                   err);
    case CMD_UNLOAD:
        return devio_adapters_unload(&s->adapters, dev, name, rec, err);
    case CMD_PIN:
    case CMD_UNPIN:
        return devio_adapters_pin(&s->adapters, dev, name, c == CMD_PIN, rec, err);
    }
    return devio_fail(err, DEVIO_E_INVALID, "unknown adapter command");
}

/* A command on the adapter named by the path; the answer is its record
 * (plus "evicted" when a load made room). */
static devio_status one(devio_server *s, const devio_request *rq, cmd c, devio_reply *out,
                        devio_error *err)
{
    char name[DEVIO_ADAPTER_NAME_MAX], evicted[DEVIO_ADAPTER_NAME_MAX] = "";
    devio_adapter_load_body load = {0};
    devio_adapter_record rec;
    devio_device *dev;
    devio_status st = devio_request_name(rq, name, err);
    if (st == DEVIO_OK && c == CMD_LOAD)
        st = devio_json_adapter_load_decode(rq->body, &load, err);
    if (st == DEVIO_OK)
        st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = run(s, dev, c, name, &load, &rec, evicted, err);
    devio_server_release(s);
    if (st != DEVIO_OK)
        return st;
    json_t *j = devio_json_adapter_record(&rec, DEVIO_ADAPTER_VIEW_RECORD);
    if (j && evicted[0] && json_object_set_new(j, "evicted", json_string(evicted)) != 0) {
        json_decref(j);
        j = NULL;
    }
    return devio_reply_json(out, 200, j, err);
}

devio_status devio_route_adapters_list(devio_server *s, const devio_request *rq,
                                       devio_reply *out, devio_error *err)
{
    (void)rq;
    devio_adapter_record *recs = NULL;
    size_t n = 0;
    devio_device *dev;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = devio_adapters_list(&s->adapters, dev, &recs, &n, err);
    devio_server_release(s);
    if (st != DEVIO_OK)
        return st;
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, devio_json_adapter_record(
                                            &recs[i], DEVIO_ADAPTER_VIEW_RECORD)) != 0) {
            json_decref(list);
            list = NULL;
        }
    free(recs);
    return devio_reply_json(out, 200, list, err);
}

devio_status devio_route_adapter_get(devio_server *s, const devio_request *rq, devio_reply *out,
                                     devio_error *err)
{
    return one(s, rq, CMD_GET, out, err);
}

devio_status devio_route_adapter_put(devio_server *s, const devio_request *rq, devio_reply *out,
                                     devio_error *err)
{
    return one(s, rq, CMD_LOAD, out, err);
}

devio_status devio_route_adapter_delete(devio_server *s, const devio_request *rq,
                                        devio_reply *out, devio_error *err)
{
    return one(s, rq, CMD_UNLOAD, out, err);
}

devio_status devio_route_adapter_pin(devio_server *s, const devio_request *rq, devio_reply *out,
                                     devio_error *err)
{
    return one(s, rq, CMD_PIN, out, err);
}

devio_status devio_route_adapter_unpin(devio_server *s, const devio_request *rq,
                                       devio_reply *out, devio_error *err)
{
    return one(s, rq, CMD_UNPIN, out, err);
}
