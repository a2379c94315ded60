/* store.h - devio's SQLite file: ticket history, adapter metadata, process metadata.
 * Writes go through one writer thread in batched transactions; callers never run SQL on the step path. */
#ifndef DEVIO_STORE_H
#define DEVIO_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"

typedef struct devio_store devio_store;

typedef struct devio_store_options {
    uint32_t retention;    /* keep at most this many ticket rows (oldest deleted); 0 = all */
    uint32_t busy_timeout_ms; /* SQLite busy timeout, default 5000 */
} devio_store_options;

devio_store_options devio_store_options_default(void);

/* Open or create the database at `path` (WAL mode), create or migrate the
 * schema forward, bump the epoch, and mark every ticket left "in_flight" by
 * an earlier process as "aborted". Starts the writer thread.
 * On success *out is owned by the caller (devio_store_close). On failure
 * *out is NULL and err names the file and the SQLite message.
 * A database whose schema version is newer than this build is refused. */
devio_status devio_store_open(const char *path, const devio_store_options *o,
                              devio_store **out, devio_error *err);

/* Flush every queued write, stop the writer, close the database. s may be NULL. */
void devio_store_close(devio_store *s);

/* This process's epoch (1 for a new database, +1 per open). */
uint64_t devio_store_epoch(const devio_store *s);
/* One more than the largest ticket id ever stored (1 for a new database). */
uint64_t devio_store_next_ticket_id(const devio_store *s);
uint32_t devio_store_schema_version(const devio_store *s);

/* What a ticket row holds. Strings are borrowed for the call. */
typedef struct devio_ticket_record {
    uint64_t id;
    const char *status;     /* "in_flight", "ok", "failed", "aborted" */
    int64_t launched_ms;    /* unix time, ms */
    int64_t settled_ms;     /* 0 while in flight */
    uint32_t rows, tokens;
    const char *seqs;       /* JSON array text of the sequence ids, e.g. "[7,8]" */
    uint64_t queued_us, compute_us;
    const char *error_code;    /* NULL unless failed/aborted */
    const char *error_message; /* NULL unless failed/aborted */
} devio_ticket_record;

/* Queue an insert (launch) or an update (settle: status, settled_ms, timings,
 * error) of a ticket row. Never blocks on SQLite. Returns a write number
 * to pass to devio_store_wait, or 0 when the queue could not take it (out of
 * memory or store closed). */
uint64_t devio_store_ticket_launched(devio_store *s, const devio_ticket_record *r);
uint64_t devio_store_ticket_settled(devio_store *s, const devio_ticket_record *r);

/* Mark every "in_flight" ticket of this epoch "aborted" (teardown). */
uint64_t devio_store_abort_in_flight(devio_store *s, const char *reason);

/* Block until write `n` is committed (0 returns at once). DEVIO_E_IO when
 * the write failed; the failure is also logged to stderr once. */
devio_status devio_store_wait(devio_store *s, uint64_t n, devio_error *err);

/* History, newest first: status filter (NULL = any), launched_ms in
 * [since_ms, until_ms) (0 = unbounded), ids below before_id (0 = none),
 * at most limit rows (1..1000). *out = {"tickets":[...], "next": id|null}
 * where next is the before_id for the following page. Reads committed data
 * only (call devio_store_wait first for read-your-writes). */
typedef struct devio_ticket_query {
    const char *status;
    int64_t since_ms, until_ms;
    uint64_t before_id;
    uint32_t limit;
} devio_ticket_query;

devio_status devio_store_tickets_query(devio_store *s, const devio_ticket_query *q,
                                       json_t **out, devio_error *err);

/* Adapter metadata rows (synchronous; never on the step path). */
typedef struct devio_adapter_record {
    const char *name, *path;
    uint32_t rank;
    double alpha, scale;
    const char *targets;   /* comma-separated module names */
    const char *sha256;    /* hex of the weights file */
    uint64_t size;         /* bytes of the weights file */
    const char *state;     /* "loaded", "unloaded", "stale", "failed" */
    bool pinned;
    int64_t loaded_ms, last_used_ms;
    const char *reason;    /* failure reason or NULL */
} devio_adapter_record;

/* Insert or replace the row of r->name, in one transaction. */
devio_status devio_store_adapter_put(devio_store *s, const devio_adapter_record *r,
                                     devio_error *err);
/* Delete the row of `name`; DEVIO_E_UNKNOWN_ADAPTER when absent. */
devio_status devio_store_adapter_delete(devio_store *s, const char *name, devio_error *err);
/* All rows as a JSON array of objects (fields as in the record), by name. */
devio_status devio_store_adapters_list(devio_store *s, json_t **out, devio_error *err);

/* Metadata key/value (text). */
devio_status devio_store_meta_get(devio_store *s, const char *key, char *buf, size_t len,
                                  bool *found, devio_error *err);
devio_status devio_store_meta_set(devio_store *s, const char *key, const char *value,
                                  devio_error *err);

#endif
