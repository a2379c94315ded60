/* store.h - devio's SQLite file: ticket history, idempotency keys, adapter records, process metadata.
 * Writes go through one writer thread in batched transactions; callers never run SQL on the step path, and nothing here speaks JSON. */
#ifndef DEVIO_STORE_H
#define DEVIO_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/adapter_record.h"
#include "common/hist.h"
#include "device/devio.h"

typedef struct devio_store devio_store;

typedef struct devio_store_options {
    uint32_t retention;    /* keep at most this many ticket rows (oldest deleted); 0 = all */
    uint32_t key_retention; /* keep at most this many idempotency key rows (oldest deleted),
                               besides the age bound DEVIO_KEY_KEEP_MS; 0 = no count bound */
    uint32_t busy_timeout_ms; /* SQLite busy timeout, default 5000 */
    /* Called on the writer thread each time a batch of writes has committed or
     * failed, outside the store's locks, so that callers parked on a write
     * number (devio_store_done) look again; may be NULL. It must not wait
     * on the store. */
    void (*on_written)(void *ctx, uint64_t done); /* every write <= done is done */
    void *on_written_ctx;
} devio_store_options;

devio_store_options devio_store_options_default(void);

/* ---- lifecycle (store.c, store_schema.c) ---------------------------------- */

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
/* The first ticket id this process may hand out: one more than the id
 * high-water mark (1 for a new database). The mark is reserved in meta
 * 'ticket_id_high' STORE_ID_RANGE (1024) ids at a time, in the transaction
 * of the launch row that passes it, so an id whose row was ever committed is
 * never handed out again, even when history is trimmed or deleted. After
 * launches are queued: one more than the largest id queued. */
uint64_t devio_store_next_ticket_id(const devio_store *s);
uint32_t devio_store_schema_version(const devio_store *s);

/* Sequence and logits handle ids. The first this process may hand out: one
 * more than the high-water marks in meta ('seq_id_high', 'logits_id_high';
 * for a file from before them, the largest ids its rows name). Every id
 * handed out is told here before an answer names it (the device's on_ids
 * hook; never blocks on SQLite), and each transaction that may name one
 * first moves the marks past it, STORE_ID_RANGE at a time: so no answer the
 * history keeps can name an id a later process hands out again. */
void devio_store_first_ids(const devio_store *s, uint64_t *seq, uint64_t *logits);
void devio_store_ids_used(devio_store *s, uint64_t seq_high, uint64_t logits_high);

/* ---- ticket writes (store_writer.c) --------------------------------------- */

/* What a ticket write holds. Pointers are borrowed for the call. */
typedef struct devio_ticket_record {
    uint64_t id;
    const char *status;     /* "in_flight", "ok", "failed", "aborted" */
    int64_t launched_ms;    /* unix time, ms */
    int64_t settled_ms;     /* 0 while in flight */
    uint32_t rows, tokens;
    const uint64_t *seqs;   /* launch: the sequence of each plan row (n_seqs of them) */
    uint32_t n_seqs;
    uint64_t queued_us, compute_us;
    const char *error_code;    /* NULL unless failed/aborted */
    const char *error_message; /* NULL unless failed/aborted */
    const char *request_id;    /* launch: the HTTP request's id, or NULL */
    const char *answer;        /* settle: the answer as sent (text), or NULL */
    const struct devio_key_record *key; /* launch: the Idempotency-Key row written in the same
                                           transaction (both or neither), or NULL */
} devio_ticket_record;

/* Queue an insert (launch, with its key's row when r->key) or an update
 * (settle: status, settled_ms, timings, error) of a ticket row. Never blocks on SQLite. Returns a write number
 * to pass to devio_store_wait, or 0 when the queue could not take it (out of
 * memory, store closed, or a malformed record: id 0, unknown status). */
uint64_t devio_store_ticket_launched(devio_store *s, const devio_ticket_record *r);
uint64_t devio_store_ticket_settled(devio_store *s, const devio_ticket_record *r);

/* Mark every "in_flight" ticket of this epoch "aborted" (teardown). */
uint64_t devio_store_abort_in_flight(devio_store *s, const char *reason);

/* Block until write `n` is committed (0 returns at once). DEVIO_E_IO when
 * the write failed; the store logs failures itself, rate-limited (store_health.c). */
devio_status devio_store_wait(devio_store *s, uint64_t n, devio_error *err);
/* Whether write `n` has committed or failed, so that devio_store_wait(n)
 * answers at once; never blocks on SQLite. */
bool devio_store_done(devio_store *s, uint64_t n);

/* ---- health (store_health.c) ---------------------------------------------- */

/* Whether the store can write, as the writer last found it, and how long its
 * transactions took. */
typedef struct devio_store_health {
    bool writable;           /* the last transaction (or heartbeat) committed */
    uint64_t errors;         /* writes and heartbeats that failed since open */
    int64_t last_success_ms; /* unix ms of the last commit, open's included */
    char reason[160];        /* SQLite's message of the last failure; "" when writable */
    /* Group-commit transactions that committed, by duration in seconds
     * (BEGIN to COMMIT returned), in buckets from 25 us to 1 s. */
    devio_hist commit_seconds;
} devio_store_health;

/* Fill *out; never blocks on SQLite. While unwritable the writer retries a
 * tiny heartbeat write about once a second, so the store becomes writable
 * again by itself once the file can take writes.
 * The file is watched: before each batch the writer checks that the path
 * still names the file it opened. Once it does not (unlinked, replaced) the
 * store stays unwritable for good, with the reason, and every later write
 * fails: history written into a file nobody can open again would be lost. */
void devio_store_health_get(devio_store *s, devio_store_health *out);
/* devio_store_health_get(s).writable, cheaper. */
bool devio_store_writable(devio_store *s);

/* ---- history (store_history.c) -------------------------------------------- */

/* Filters of a history page: status (NULL = any), launched_ms in
 * [since_ms, until_ms) (0 = unbounded), ids below before_id (0 = none), at
 * most limit rows (1..1000). */
typedef struct devio_ticket_query {
    const char *status;
    int64_t since_ms, until_ms;
    uint64_t before_id;
    uint32_t limit;
} devio_ticket_query;

/* One ticket row as stored. Strings and seqs are owned by the page. */
typedef struct devio_ticket_row {
    uint64_t id, epoch;
    const char *status;   /* static: "in_flight", "ok", "failed", "aborted" */
    int64_t launched_ms;
    bool has_settled_ms;  /* false while in flight, and for tickets aborted at start */
    int64_t settled_ms;
    uint32_t rows, tokens;
    uint64_t *seqs;       /* the launch's sequences; empty when the row has none */
    uint32_t n_seqs;
    bool has_queued_us, has_compute_us;
    uint64_t queued_us, compute_us;
    char *error_code;     /* NULL when the ticket did not fail */
    char *error_message;  /* "" when failed without a message; NULL when not failed */
    char *request_id;     /* the launch's request id; NULL when it had none */
    char *answer;         /* the settle's answer text; NULL when none was kept */
} devio_ticket_row;

/* A page of history, newest first. Release with devio_ticket_page_free(). */
typedef struct devio_ticket_page {
    devio_ticket_row *rows;
    uint32_t n;
    bool has_next;    /* more rows match: pass next as before_id for the following page */
    uint64_t next;
} devio_ticket_page;

/* Reads committed data only (call devio_store_wait first for read-your-writes).
 * On failure *out is empty (safe to free). */
devio_status devio_store_tickets_query(devio_store *s, const devio_ticket_query *q,
                                       devio_ticket_page *out, devio_error *err);
void devio_ticket_page_free(devio_ticket_page *p);

/* The row of ticket `id` into *out (a page of at most one row: out->n is 0
 * when the history holds none). Release with devio_ticket_page_free(). */
devio_status devio_store_ticket_get(devio_store *s, uint64_t id, devio_ticket_page *out,
                                    devio_error *err);

/* ---- idempotency keys (store_writer.c, store_history.c) --------------------- */

/* How long a key's answer is kept: a day, after which the key may be used again. */
#define DEVIO_KEY_KEEP_MS (24LL * 3600 * 1000)

/* The answer a request with an Idempotency-Key was given. Borrowed for the call. */
typedef struct devio_key_record {
    const char *key;      /* the Idempotency-Key as sent */
    const char *request;  /* "METHOD /path" */
    const char *digest;   /* hex SHA-256 of the request (method, path, canonical body) */
    uint32_t code;        /* the answer's HTTP status */
    const char *answer;   /* the answer's body, as sent */
    int64_t created_ms;   /* unix ms; 0: now */
} devio_key_record;

/* Queue the key's row (the first one written wins; rows older than
 * DEVIO_KEY_KEEP_MS are deleted as new ones come). A write number for
 * devio_store_done, or 0 when the queue could not take it. */
uint64_t devio_store_key_put(devio_store *s, const devio_key_record *r);

/* The committed row of `key`: *found false when none. On success with
 * *found, the strings of *out are malloc'd (devio_key_record_free). */
devio_status devio_store_key_get(devio_store *s, const char *key, devio_key_record *out,
                                 bool *found, devio_error *err);
void devio_key_record_free(devio_key_record *r);

/* ---- adapter records (store_adapters.c; synchronous, never on the step path) ---- */

/* Insert or replace the row of r->name, in one transaction. rows_served is
 * not stored (it is the device's count). */
devio_status devio_store_adapter_put(devio_store *s, const devio_adapter_record *r,
                                     devio_error *err);
/* Delete the row of `name`; DEVIO_E_UNKNOWN_ADAPTER when absent. */
devio_status devio_store_adapter_delete(devio_store *s, const char *name, devio_error *err);
/* The row of `name` into *out; *found false (and *out zeroed) when there is none. */
devio_status devio_store_adapter_get(devio_store *s, const char *name, devio_adapter_record *out,
                                     bool *found, devio_error *err);
/* Every row, by name. On success *out is a malloc'd array of *n records
 * (caller frees with free(); never NULL on success, even for none). */
devio_status devio_store_adapters_list(devio_store *s, devio_adapter_record **out, size_t *n,
                                       devio_error *err);

/* ---- metadata (store_meta.c) ----------------------------------------------- */

/* Metadata key/value (text). */
devio_status devio_store_meta_get(devio_store *s, const char *key, char *buf, size_t len,
                                  bool *found, devio_error *err);
devio_status devio_store_meta_set(devio_store *s, const char *key, const char *value,
                                  devio_error *err);

#endif
