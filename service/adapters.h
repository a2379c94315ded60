/* adapters.h - adapter commands of devio-server: the device's adapter table and the store's rows kept in step.
 * Every command changes the device first and writes its rows before it answers; nothing here runs on the step path. */
#ifndef DEVIO_SERVICE_ADAPTERS_H
#define DEVIO_SERVICE_ADAPTERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "api/adapter_record.h"
#include "device/devio.h"
#include "service/store/store.h"

/* One per server. Commands are serialised by `mu`, so that the order of
 * the rows in SQLite is the order of the changes on the device. */
typedef struct devio_adapters {
    pthread_mutex_t mu;
    devio_store *store; /* borrowed; NULL until devio_adapters_start */
} devio_adapters;

/* The adapters root, checked before anything listens. A root that was given
 * must be a directory; when it is missing but its parent exists (a fresh
 * volume) it is created, empty, mode 0750. The default one may be missing,
 * which turns adapter loading off (*root NULL: loads answer unsupported)
 * with a warning, rather than a 400 blaming the first client that loads one. */
devio_status devio_adapters_root(const char *path, bool given, const char **root,
                                 devio_error *err);

void devio_adapters_init(devio_adapters *a);
void devio_adapters_fini(devio_adapters *a);

/* What devio_adapters_start did with the rows it found in state "loaded". */
typedef struct devio_adapters_restored {
    uint32_t loaded, stale, failed;
} devio_adapters_restored;

/* Binds the store and loads again every adapter whose row says "loaded",
 * least recently used first, pinned as recorded. Before loading, the
 * weights file's SHA-256 (devio_adapter_file_hash) is compared with the
 * recorded one: a difference makes the row "stale" (reason "weights changed
 * since load") and the adapter is not loaded; a failed hash or load makes
 * it "failed" with the reason. One log line per adapter (common/log.h).
 * Call once, after the device opened and before requests are served; `dev`
 * and `store` are borrowed and must outlive every later call. Only a store
 * that cannot be read fails the start; a row that cannot be written is
 * logged and the start goes on. `out` may be NULL. */
devio_status devio_adapters_start(devio_adapters *a, devio_store *store, devio_device *dev,
                                  devio_adapters_restored *out, devio_error *err);

/* The commands. `dev` is borrowed for the call (the caller keeps it alive,
 * e.g. under the server's device lock). On success *out is the adapter's
 * record (api/adapter_record.h), the one GET /v1/adapters/{name} shows:
 * rows_served counts the plan rows launched with the adapter since it was
 * loaded, from the device's table; 0 for an adapter that is not loaded,
 * except in the unload answer, which gives the count at the unload.
 * loaded_ms is when the weights were loaded (kept by an idempotent re-load),
 * last_used_ms when a command last touched the adapter; both unix ms.
 * A load that evicted an adapter names it in evicted ("" otherwise).
 *
 * Rows written, each before the answer:
 *   load ok      name -> "loaded"; an evicted adapter -> "unloaded", reason "evicted"
 *   load failed  name -> "failed" with "code: message" as reason, unless the name's
 *                row is "loaded" (a loaded adapter's row is never overwritten by a
 *                failure). A path that leads outside the adapters root is refused
 *                (DEVIO_E_INVALID) before the device is asked, and writes nothing.
 *   unload       name -> "unloaded"
 *   pin, unpin   name -> "loaded", pinned as the device says
 * When the device changed and the row write then fails, the command answers
 * DEVIO_E_IO saying what the device did and that the record could not be
 * written, and logs it to stderr. The device change is not rolled back: an
 * eviction cannot be undone, and a second device change could fail as well;
 * the next successful command on the name, or a restart, brings the row
 * back in step. Reads (list, get) merge the rows with the device's table,
 * which wins where they disagree. */
devio_status devio_adapters_load(devio_adapters *a, devio_device *dev, const char *name,
                                 const char *path, bool pin, devio_adapter_record *out,
                                 char evicted[DEVIO_ADAPTER_NAME_MAX], devio_error *err);
devio_status devio_adapters_unload(devio_adapters *a, devio_device *dev, const char *name,
                                   devio_adapter_record *out, devio_error *err);
devio_status devio_adapters_pin(devio_adapters *a, devio_device *dev, const char *name,
                                bool pin, devio_adapter_record *out, devio_error *err);
/* Every record, whatever its state, merged with the loaded adapters: the
 * loaded ones first, in the order of the device's list command (so that an
 * HTTP run of a script prints what an in-process run prints), then the
 * others by name. On success *out is a malloc'd array of *n records (caller
 * frees with free()). */
devio_status devio_adapters_list(devio_adapters *a, devio_device *dev, devio_adapter_record **out,
                                 size_t *n, devio_error *err);
/* One record in any state; DEVIO_E_UNKNOWN_ADAPTER only when neither the
 * store nor the device knows the name. */
devio_status devio_adapters_get(devio_adapters *a, devio_device *dev, const char *name,
                                devio_adapter_record *out, devio_error *err);

#endif
