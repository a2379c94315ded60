/* state_cursors.c - exports and imports of sequence state under way: each device call made under
 * the server's device read lock, each cursor listed so that a teardown closes it first.
 * A teardown frees the device, and a cursor left open past it would point into freed memory;
 * the list is how it never is. */
#include <stdlib.h>

#include "device/status.h"
#include "service/server.h"
#include "service/state_cursors.h"

/* List c (device read lock held). */
static void list(devio_server *s, devio_state_cursor *c)
{
    pthread_mutex_lock(&s->cursors_mu);
    c->prev = NULL;
    c->next = s->cursors;
    if (s->cursors)
        s->cursors->prev = c;
    s->cursors = c;
    pthread_mutex_unlock(&s->cursors_mu);
}

/* Unlist c when it is listed (cursors_mu held). */
static void unlist(devio_server *s, devio_state_cursor *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else if (s->cursors == c)
        s->cursors = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* What a cursor opens on the device: an export (seq, snapshots, *bytes) or an import. */
typedef struct open_args {
    bool is_export;
    uint64_t seq;
    bool snapshots;
    uint64_t *bytes;
    uint64_t max_bytes;
} open_args;

static devio_status cursor_open(devio_server *s, const open_args *a, devio_state_cursor **out,
                                devio_error *err)
{
    *out = NULL;
    devio_state_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an %s",
                          a->is_export ? "export" : "import");
    c->s = s;
    devio_device *dev;
    devio_status st = devio_server_hold(s, &dev, err);
    if (st == DEVIO_OK) {
        st = a->is_export ? devio_export_open(dev, a->seq, a->snapshots, &c->x, a->bytes, err)
                          : devio_import_open(dev, a->max_bytes, &c->m, err);
        if (st == DEVIO_OK)
            list(s, c);
        devio_server_release(s);
    }
    if (st != DEVIO_OK) {
        free(c);
        return st;
    }
    *out = c;
    return DEVIO_OK;
}

devio_status devio_state_export_open(devio_server *s, uint64_t seq, bool snapshots,
                                     devio_state_cursor **out, uint64_t *bytes, devio_error *err)
{
    open_args a = {.is_export = true, .seq = seq, .snapshots = snapshots, .bytes = bytes};
    return cursor_open(s, &a, out, err);
}

devio_status devio_state_export_read(void *cursor, void *buf, size_t cap, size_t *n,
                                     devio_error *err)
{
    devio_state_cursor *c = cursor;
    devio_device *dev;
    *n = 0;
    devio_status st = devio_server_hold(c->s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    /* The device is up, so no teardown closed the cursor. */
    st = devio_export_read(c->x, buf, cap, n, err);
    devio_server_release(c->s);
    return st;
}

devio_status devio_state_import_open(devio_server *s, uint64_t max_bytes,
                                     devio_state_cursor **out, devio_error *err)
{
    open_args a = {.max_bytes = max_bytes};
    return cursor_open(s, &a, out, err);
}

devio_status devio_state_import_write(void *cursor, const void *buf, size_t n, devio_error *err)
{
    devio_state_cursor *c = cursor;
    devio_device *dev;
    devio_status st = devio_server_hold(c->s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = devio_import_write(c->m, buf, n, err);
    devio_server_release(c->s);
    return st;
}

devio_status devio_state_import_finish(devio_state_cursor *c, uint64_t *seq, devio_error *err)
{
    devio_device *dev;
    devio_status st = devio_server_hold(c->s, &dev, err);
    if (st != DEVIO_OK)
        return st;
    st = devio_import_finish(c->m, seq, err);
    devio_server_release(c->s);
    return st;
}

void devio_state_cursor_close(void *cursor)
{
    devio_state_cursor *c = cursor;
    if (!c)
        return;
    devio_server *s = c->s;
    devio_device *dev;
    /* Torn down: the teardown closed and unlisted it already. */
    if (devio_server_hold(s, &dev, NULL) == DEVIO_OK) {
        pthread_mutex_lock(&s->cursors_mu);
        unlist(s, c);
        pthread_mutex_unlock(&s->cursors_mu);
        devio_export_close(c->x);
        devio_import_close(c->m);
        devio_server_release(s);
    }
    free(c);
}

void devio_state_cursors_close_all(devio_server *s)
{
    pthread_mutex_lock(&s->cursors_mu);
    while (s->cursors) {
        devio_state_cursor *c = s->cursors;
        unlist(s, c);
        devio_export_close(c->x);
        devio_import_close(c->m);
        c->x = NULL;
        c->m = NULL;
    }
    pthread_mutex_unlock(&s->cursors_mu);
}
