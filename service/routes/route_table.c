/* route_table.c - devio-server's route table: every route of the contract (api/openapi.yaml)
 * with its handler (service/routes/route_handlers.h) and the rules the server applies before the
 * handler runs (service/http/route_match.h). Static data; nothing to own. */
#include <stddef.h>

#include "service/routes/route_handlers.h"
#include "service/server.h"

#define ROUTE(m, p, h, a, b, d)                                                                 \
    {.method = m, .path = p, .handler = h, .auth = DEVIO_ROUTE_##a, .body = DEVIO_ROUTE_##b,     \
     .refused_while_draining = d}
/* A route that may wait on the device or SQLite: it runs on a worker (offload.h). */
#define WAITS(m, p, h, a, b, k)                                                                 \
    {.method = m, .path = p, .handler = h, .auth = DEVIO_ROUTE_##a, .body = DEVIO_ROUTE_##b,     \
     .keyed = k, .may_wait = true}
/* A route that changes state and takes an Idempotency-Key (keys.h). */
#define KEYED(m, p, h, a, b, d)                                                                 \
    {.method = m, .path = p, .handler = h, .auth = DEVIO_ROUTE_##a, .body = DEVIO_ROUTE_##b,     \
     .refused_while_draining = d, .keyed = true}

/* POST /v1/sequences with an application/octet-stream body: a sequence's state imported as a
 * new sequence, answered as a create is (routes_state.c). Its body is streamed to the state sink
 * as it arrives, bounded by --max-state-bytes; it runs on a worker (the device is waited on), and
 * is keyed like the create. Not in the table: the create's entry names it (octet_stream). */
static const devio_route seq_import = {
    .method = "POST", .path = "/v1/sequences", .handler = devio_route_seq_import,
    .auth = DEVIO_ROUTE_TOKEN, .body = DEVIO_ROUTE_STREAM_BODY, .sink = &devio_route_state_sink,
    .keyed = true, .may_wait = true};

/* Every route of the contract (api/openapi.yaml): method, path template, handler, who may call
 * it, its body, and whether it is refused while the server drains (or, for WAITS, whether it is
 * keyed). Metrics label each answer with
 * its route's path (a 405 with the path's first entry); answers decided before a route is known
 * use "auth" (401), "framing" (400), "body" (413) and "unknown" (404). */
static const devio_route routes[] = {
    ROUTE("GET", "/healthz", devio_route_healthz, HEALTH, NO_BODY, false),
    ROUTE("GET", "/readyz", devio_route_readyz, HEALTH, NO_BODY, false),
    ROUTE("GET", "/metrics", devio_route_metrics, HEALTH, NO_BODY, false),
    ROUTE("GET", "/v1/openapi.yaml", devio_route_openapi, TOKEN, NO_BODY, false),
    ROUTE("GET", "/v1/sequences", devio_route_seq_list, TOKEN, NO_BODY, false),
    {.method = "POST", .path = "/v1/sequences", .handler = devio_route_seq_create,
     .auth = DEVIO_ROUTE_TOKEN, .body = DEVIO_ROUTE_NO_BODY, .keyed = true,
     .octet_stream = &seq_import},
    ROUTE("GET", "/v1/sequences/{id}", devio_route_seq_get, TOKEN, NO_BODY, false),
    /* Streamed as it is made (routes_state.c): its bytes are made on workers. */
    ROUTE("GET", "/v1/sequences/{id}/state", devio_route_seq_state, TOKEN, NO_BODY, false),
    WAITS("DELETE", "/v1/sequences/{id}", devio_route_seq_delete, TOKEN, NO_BODY, true),
    KEYED("POST", "/v1/launch", devio_route_launch, TOKEN, JSON_BODY, true),
    KEYED("POST", "/v1/step", devio_route_step, TOKEN, JSON_BODY, true),
    ROUTE("POST", "/v1/tickets/{id}/await", devio_route_await, TOKEN, NO_BODY, false),
    WAITS("GET", "/v1/tickets", devio_route_tickets, TOKEN, NO_BODY, false),
    WAITS("GET", "/v1/tickets/{id}", devio_route_ticket, TOKEN, NO_BODY, false),
    WAITS("POST", "/v1/effects", devio_route_effects, TOKEN, JSON_BODY, true),
    ROUTE("GET", "/v1/logits", devio_route_logits_list, TOKEN, NO_BODY, false),
    WAITS("GET", "/v1/logits/{id}", devio_route_logits, TOKEN, NO_BODY, false),
    ROUTE("GET", "/v1/facts", devio_route_facts, TOKEN, NO_BODY, false),
    ROUTE("GET", "/v1/device", devio_route_device, TOKEN, NO_BODY, false),
    ROUTE("GET", "/v1/model", devio_route_model, TOKEN, NO_BODY, false),
    /* Server-sent events, open until the client goes or the server stops (events.h). */
    ROUTE("GET", "/v1/events", devio_route_events, TOKEN, NO_BODY, false),
    ROUTE("POST", "/v1/teardown", devio_route_teardown, TOKEN, NO_BODY, false),
    WAITS("GET", "/v1/adapters", devio_route_adapters_list, TOKEN, NO_BODY, false),
    WAITS("GET", "/v1/adapters/{name}", devio_route_adapter_get, TOKEN, NO_BODY, false),
    WAITS("PUT", "/v1/adapters/{name}", devio_route_adapter_put, TOKEN, JSON_BODY, false),
    WAITS("DELETE", "/v1/adapters/{name}", devio_route_adapter_delete, TOKEN, NO_BODY, false),
    WAITS("POST", "/v1/adapters/{name}/pin", devio_route_adapter_pin, TOKEN, NO_BODY, false),
    WAITS("POST", "/v1/adapters/{name}/unpin", devio_route_adapter_unpin, TOKEN, NO_BODY, false),
};
#undef ROUTE
#undef KEYED
#undef WAITS

const devio_route *devio_server_routes(size_t *n)
{
    *n = sizeof routes / sizeof *routes;
    return routes;
}
