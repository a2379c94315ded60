/* state_cursors.h - the sequence state exports and imports under way (device/devio.h's cursors)
 * that the state routes stream: every cursor call under the server's device lock, and every cursor
 * closed by a teardown before the device is freed. It never touches HTTP. */
#ifndef DEVIO_STATE_CURSORS_H
#define DEVIO_STATE_CURSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"

typedef struct devio_server devio_server; /* service/server.h */

/* One export or import under way. Listed in the server's table while open. */
typedef struct devio_state_cursor {
    struct devio_state_cursor *prev, *next; /* the server's list (cursors_mu) */
    devio_server *s;                        /* borrowed */
    devio_export *x;                        /* owned, or NULL; a teardown closes it */
    devio_import *m;                        /* owned, or NULL; a teardown closes it */
} devio_state_cursor;

/* Export sequence seq (devio_export_open): *out owned by the caller, who ends it with
 * devio_state_cursor_close; *bytes the stream's size. */
devio_status devio_state_export_open(devio_server *s, uint64_t seq, bool snapshots,
                                     devio_state_cursor **out, uint64_t *bytes, devio_error *err);
/* The export's next bytes (devio_export_read): a devio_body_make (service/http/body_out.h).
 * DEVIO_E_TORN_DOWN once the device is gone. May wait for the steps in flight. */
devio_status devio_state_export_read(void *cursor, void *buf, size_t cap, size_t *n,
                                     devio_error *err);

/* Import a state of at most max_bytes as a new sequence (devio_import_open): *out as above. */
devio_status devio_state_import_open(devio_server *s, uint64_t max_bytes,
                                     devio_state_cursor **out, devio_error *err);
/* The import's next bytes (devio_import_write): a devio_body_sink_write
 * (service/http/body_in.h). May wait for the steps in flight. */
devio_status devio_state_import_write(void *cursor, const void *buf, size_t n, devio_error *err);
/* The whole state is in: the sequence goes live (devio_import_finish), its id in *seq. */
devio_status devio_state_import_finish(devio_state_cursor *c, uint64_t *seq, devio_error *err);

/* Close and free a cursor (an unfinished import gives back what it reserved; an export
 * unpins its sequence); c may be NULL. A devio_body_done (body_out.h). */
void devio_state_cursor_close(void *c);

/* Close every cursor listed (the cursor objects stay their owners' to free): the device is
 * being torn down, under the server's device write lock. */
void devio_state_cursors_close_all(devio_server *s);

#endif
