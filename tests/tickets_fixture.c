/* tickets_fixture.c - the tickets tests' model, store, device and tickets layer (tickets_fixture.h). */
#include <stdio.h>
#include <string.h>

#include "ref/ref_backend.h"
#include "tests/tickets_fixture.h"

int tickets_ctx_open(tickets_ctx *c)
{
    memset(c, 0, sizeof *c);
    devio_metrics_init(&c->metrics);
    if (devio_fixture_preset(&c->fx, "tiny", DEVIO_F32, 5) != 0)
        return -1;
    char db[320];
    snprintf(db, sizeof db, "%s/devio.db", c->fx.dir);
    devio_config cfg = devio_config_default();
    if (devio_store_open(db, NULL, &c->store, NULL) != DEVIO_OK)
        return -1;
    cfg.first_ticket_id = devio_store_next_ticket_id(c->store);
    if (devio_open(c->fx.model, &devio_ref_backend, &cfg, &c->dev, NULL) != DEVIO_OK)
        return -1;
    c->t = (devio_tickets){.store = c->store, .metrics = &c->metrics};
    return 0;
}

int tickets_ctx_setup(void **state)
{
    static tickets_ctx c;
    *state = &c;
    return tickets_ctx_open(&c);
}

int tickets_ctx_teardown(void **state)
{
    tickets_ctx_close(*state);
    return 0;
}

void tickets_ctx_close(tickets_ctx *c)
{
    if (c->dev)
        devio_teardown(c->dev, NULL);
    devio_store_close(c->store);
    devio_metrics_fini(&c->metrics);
    devio_fixture_free(&c->fx);
}
