/* routes_state.c - a sequence's state over HTTP: GET /v1/sequences/{id}/state streams its export,
 * POST /v1/sequences with an application/octet-stream body imports one as a new sequence.
 * Neither holds a state whole: the export is made a chunk at a time on workers while it is sent
 * (service/http/body_out.h), the import written a chunk at a time as it arrives (body_in.h). */
#include <string.h>

#include "api/codec.h"
#include "device/status.h"
#include "service/http/body_in.h"
#include "service/http/body_out.h"
#include "service/http/request.h"
#include "service/routes/route_handlers.h"
#include "service/server.h"

/* Why the export's bytes are made on workers, not in libmicrohttpd's content reader: each
 * devio_export_read takes the device lock and waits for the steps in flight (the backend seam
 * reads state only at quiescence), which can last a whole step. Made in the reader, that wait
 * would stall the HTTP thread's event loop and every other connection on it; made on a worker,
 * only this response waits (its connection set aside while the next chunk is not ready). */
devio_status devio_route_seq_state(devio_server *s, const devio_request *rq, devio_reply *out,
                                   devio_error *err)
{
    const char *v = devio_request_query(rq, "snapshots");
    bool snapshots = v && strcmp(v, "true") == 0;
    if (v && !snapshots && strcmp(v, "false") != 0)
        return devio_fail(err, DEVIO_E_INVALID, "snapshots must be true or false");
    devio_state_cursor *c;
    uint64_t bytes = 0;
    devio_status st = devio_state_export_open(s, rq->params.id, snapshots, &c, &bytes, err);
    if (st != DEVIO_OK)
        return st;
    devio_body_out *b = devio_body_out_new(&s->offload, bytes, devio_state_export_read,
                                           devio_state_cursor_close, c);
    if (!b)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an export's buffers");
    devio_reply_stream(out, 200, "application/octet-stream", b);
    return DEVIO_OK;
}

/* The import's sink: opened on the request's headers, bounded by --max-state-bytes. */
static devio_status import_open(devio_server *s, void **sink, devio_error *err)
{
    devio_state_cursor *c = NULL;
    devio_status st = devio_state_import_open(s, s->cfg.max_state_bytes, &c, err);
    *sink = c;
    return st;
}

const devio_route_sink devio_route_state_sink = {
    .open = import_open,
    .write = devio_state_import_write,
    .close = devio_state_cursor_close,
};

/* Runs once the body is whole (written by the server before the handler: rq->upload): the
 * sequence goes live and the answer is a create's. The import is keyed like a create; a
 * refusal on the way (another model, a bad checksum, no room) is answered here. */
devio_status devio_route_seq_import(devio_server *s, const devio_request *rq, devio_reply *out,
                                    devio_error *err)
{
    (void)s;
    devio_status st = devio_body_in_result(rq->upload, err);
    uint64_t seq = 0;
    if (st == DEVIO_OK)
        st = devio_state_import_finish(rq->sink, &seq, err);
    if (st != DEVIO_OK)
        return st;
    devio_keyed_undo_with(rq->keyed, devio_route_free_made_seq, seq);
    return devio_reply_json(out, 201, devio_json_seq_ref(seq), err);
}
