/* routes_events.c - GET /v1/events: the device's events as server-sent events (events.h),
 * resumable with Last-Event-ID. The handler only subscribes; the stream is sent by libmicrohttpd
 * and never touches the device. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "device/status.h"
#include "service/http/request.h"
#include "service/routes/route_handlers.h"
#include "service/server.h"

/* Last-Event-ID (the header, else ?last_event_id=): *present false when neither is given. */
static devio_status last_event_id(const devio_request *rq, uint64_t *id, bool *present,
                                  devio_error *err)
{
    const char *h = devio_request_header(rq, "Last-Event-ID");
    if (!h)
        return devio_request_query_u64(rq, "last_event_id", id, present, err);
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(h, &end, 10);
    if (errno || end == h || *end || h[0] == '-')
        return devio_fail(err, DEVIO_E_INVALID, "Last-Event-ID must be an event id");
    *id = v;
    *present = true;
    return DEVIO_OK;
}

devio_status devio_route_events(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    uint64_t after = 0, epoch = 0;
    bool resume = false, epoch_given = false;
    devio_status st = last_event_id(rq, &after, &resume, err);
    if (st == DEVIO_OK)
        st = devio_request_query_u64(rq, "epoch", &epoch, &epoch_given, err);
    if (st != DEVIO_OK)
        return st;
    /* Ids from another process's epoch mean nothing here: resumed from the oldest kept. */
    if (resume && epoch_given && epoch != s->events.epoch)
        after = 0;
    struct MHD_Connection *c = rq->conn;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct MHD_Response *resp = NULL;
    st = devio_events_subscribe(&s->events, c, ci ? ci->connect_fd : -1, resume, after, &resp,
                                err);
    if (st != DEVIO_OK)
        return st;
    devio_reply_bytes(out, 200, "text/event-stream", NULL, 0);
    out->response = resp;
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    return DEVIO_OK;
}
