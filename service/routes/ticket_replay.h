/* ticket_replay.h - answers read again from the history (service/store/store.h):
 * what a keyed request retried, or an await of a ticket the device no longer
 * holds, is answered. Each fills `out` as a route handler does. */
#ifndef DEVIO_TICKET_REPLAY_H
#define DEVIO_TICKET_REPLAY_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"
#include "service/http/route_match.h"

/* The answer a keyed launch (`launch`: 202 {"ticket"}) or step (its settled
 * answer, or key_in_use while it runs) gives again for `ticket`, read from
 * the history: *found false when the history has no row (it never launched). */
devio_status devio_ticket_replay(devio_server *s, uint64_t ticket, bool launch, devio_reply *out,
                                 bool *found, devio_error *err);

/* What the history says of a ticket this process cannot answer from the
 * device (awaited already, reaped, or launched by an earlier process): the
 * answer it settled with, read again (200, Idempotent-Replayed); its failure;
 * or, with no row to say more, `st` as the device answered it. */
devio_status devio_ticket_from_history(devio_server *s, uint64_t ticket, devio_status st,
                                       devio_reply *out, devio_error *err);

#endif
