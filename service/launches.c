/* launches.c - launches whose history row is being written: listed, and ended (commit or cancel) by the store's writer once the row is done.
 * The list's lock is held while an end half runs, so that a request that ends meanwhile never frees an op in use. */
#include "device/status.h"
#include "service/server.h"

void devio_launches_end(devio_server *s, devio_ticket_op *op)
{
    devio_device *dev;
    devio_error err = {0};
    devio_status st = devio_server_hold(s, &dev, &err);
    if (st == DEVIO_OK) {
        st = devio_tickets_launch_end(&s->tickets, dev, op, &err);
        devio_server_release(s);
    } else {
        op->phase = DEVIO_OP_NONE;
    }
    op->st = st;
    op->err = err;
    op->tracked = false;
    atomic_fetch_sub(&s->launching, 1);
}

static bool unlink_op(devio_server *s, devio_ticket_op *op)
{
    for (devio_ticket_op **at = &s->launches; *at; at = &(*at)->next_launch)
        if (*at == op) {
            *at = op->next_launch;
            op->next_launch = NULL;
            return true;
        }
    return false;
}

void devio_launches_track(devio_server *s, devio_ticket_op *op)
{
    pthread_mutex_lock(&s->launch_mu);
    op->tracked = true;
    op->next_launch = s->launches;
    s->launches = op;
    /* Written before it was listed: the writer's hook has passed it by. */
    if (devio_store_done(s->store, op->write)) {
        unlink_op(s, op);
        devio_launches_end(s, op);
    }
    pthread_mutex_unlock(&s->launch_mu);
}

bool devio_launches_pending(devio_server *s, devio_ticket_op *op)
{
    pthread_mutex_lock(&s->launch_mu);
    bool p = op->tracked;
    pthread_mutex_unlock(&s->launch_mu);
    return p;
}

devio_op_phase devio_launches_phase(devio_server *s, devio_ticket_op *op)
{
    pthread_mutex_lock(&s->launch_mu);
    devio_op_phase p = op->phase;
    pthread_mutex_unlock(&s->launch_mu);
    return p;
}

bool devio_launches_untrack(devio_server *s, devio_ticket_op *op)
{
    pthread_mutex_lock(&s->launch_mu);
    bool was = op->tracked && unlink_op(s, op);
    op->tracked = false;
    pthread_mutex_unlock(&s->launch_mu);
    return was;
}

void devio_server_written(void *ctx, uint64_t done)
{
    devio_server *s = ctx;
    pthread_mutex_lock(&s->launch_mu);
    for (devio_ticket_op **at = &s->launches; *at;) {
        devio_ticket_op *op = *at;
        if (op->write > done) {
            at = &op->next_launch;
            continue;
        }
        *at = op->next_launch;
        op->next_launch = NULL;
        devio_launches_end(s, op);
    }
    pthread_mutex_unlock(&s->launch_mu);
    devio_waits_written(&s->waits, done);
}
