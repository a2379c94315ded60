/* tickets_fixture.h - what the service/tickets/tickets.c tests share: a tiny written model, a real
 * store beside it, a reference device whose ids continue the store's, and the tickets layer.
 * The fixture owns everything it opens; tickets_ctx_close releases it. */
#ifndef DEVIO_TESTS_TICKETS_FIXTURE_H
#define DEVIO_TESTS_TICKETS_FIXTURE_H

#include "service/metrics/metrics.h"
#include "service/store/store.h"
#include "service/tickets/tickets.h"
#include "tests/testutil.h"

typedef struct tickets_ctx {
    devio_fixture fx;
    devio_device *dev;
    devio_store *store;
    devio_metrics metrics;
    devio_tickets t;
} tickets_ctx;

/* 0 on success; -1 with whatever was opened left for tickets_ctx_close. */
int tickets_ctx_open(tickets_ctx *c);
void tickets_ctx_close(tickets_ctx *c);

/* cmocka group setup and teardown: *state is one static tickets_ctx. */
int tickets_ctx_setup(void **state);
int tickets_ctx_teardown(void **state);

#endif
