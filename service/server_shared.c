/* server_shared.c - what every route shares: the device under its lock, teardown.
 * Nothing here answers a request; it must never hold the device lock across a wait for a client. */
#include <stdatomic.h>
#include <time.h>

#include "device/status.h"
#include "service/server.h"

devio_status devio_server_hold(devio_server *s, devio_device **dev, devio_error *err)
{
    pthread_rwlock_rdlock(&s->dev_lock);
    *dev = s->dev;
    if (*dev)
        return DEVIO_OK;
    pthread_rwlock_unlock(&s->dev_lock);
    return devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
}

void devio_server_release(devio_server *s)
{
    pthread_rwlock_unlock(&s->dev_lock);
}

/* A half-made launch ends once its row is written, which the store's writer
 * always finishes within its busy timeout; this bounds the wait past that. */
#define TEARDOWN_LAUNCH_WAIT_MS 30000

bool devio_server_teardown(devio_server *s, const char *reason, uint32_t *aborted)
{
    *aborted = 0;
    /* The device waits for reserved tickets, whose end half needs the read
     * lock: let them end before the write lock is taken. */
    atomic_store(&s->tearing, true);
    for (int ms = 0; atomic_load(&s->launching) > 0 && ms < TEARDOWN_LAUNCH_WAIT_MS; ms++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000L}, NULL);
    pthread_rwlock_wrlock(&s->dev_lock);
    bool was_up = s->dev != NULL;
    if (was_up)
        devio_state_cursors_close_all(s);
    if (was_up)
        devio_teardown(s->dev, aborted);
    s->dev = NULL;
    pthread_rwlock_unlock(&s->dev_lock);
    if (!was_up)
        return false;
    if (s->leases.started)
        devio_leases_clear(&s->leases);
    atomic_store(&s->ready, false);
    devio_tickets_aborted(&s->tickets, *aborted, reason);
    return true;
}
