/* route_handlers.h - the handlers of devio-server's route table (service/routes/route_table.c), one per method and path.
 * Each decodes with api/, calls the device API or a service module, and encodes with api/; none touches SQL or sockets. */
#ifndef DEVIO_ROUTE_HANDLERS_H
#define DEVIO_ROUTE_HANDLERS_H

#include "service/http/route_match.h"

/* Each is a devio_route_handler (service/http/route_match.h). */

/* routes_device.c: sequences, effects, logits, facts, the device, the model, teardown */
devio_route_handler devio_route_seq_create, devio_route_seq_list, devio_route_seq_get, devio_route_seq_delete,
    devio_route_effects, devio_route_logits, devio_route_logits_list, devio_route_facts, devio_route_device, devio_route_model,
    devio_route_teardown;

/* routes_tickets.c: launch, step, await, the history */
devio_route_handler devio_route_launch, devio_route_step, devio_route_await, devio_route_tickets,
    devio_route_ticket;

/* routes_adapters.c: list, get, load, unload, pin, unpin */
devio_route_handler devio_route_adapters_list, devio_route_adapter_get, devio_route_adapter_put,
    devio_route_adapter_delete, devio_route_adapter_pin, devio_route_adapter_unpin;

/* routes_state.c: a sequence's state exported (a streamed answer) and imported (a streamed
 * body, taken by devio_route_state_sink) */
devio_route_handler devio_route_seq_state, devio_route_seq_import;
devio_route_handler devio_route_events;
extern const devio_route_sink devio_route_state_sink;

/* routes_device.c: a keyed request's undo (keys.h) for a sequence it made: freed */
void devio_route_free_made_seq(devio_server *s, uint64_t seq);

/* routes_ops.c: health, readiness, metrics, the contract document */
devio_route_handler devio_route_healthz, devio_route_readyz, devio_route_metrics,
    devio_route_openapi;

#endif
