/* keys.h - Idempotency-Key on the routes that change state: a retry with the same key gets the first answer, read from the history, and nothing runs twice.
 * The server calls it around a route's handler; it never decodes a request body nor calls the device. */
#ifndef DEVIO_KEYS_H
#define DEVIO_KEYS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "service/http/route_match.h"
#include "service/store/store.h"

/* Longest key taken (visible ASCII, 1 to this many bytes). */
#define DEVIO_KEY_MAX 128

/* The keys of requests under way, so that a retry sent while the first try
 * still runs is told so (409 key_in_use) instead of running beside it. */
typedef struct devio_key_claim {
    struct devio_key_claim *next;
    uint64_t write;   /* > 0: the answer's row is queued as this write */
    bool orphan;      /* its request ended before the row was written */
    char key[DEVIO_KEY_MAX + 1];
} devio_key_claim;

typedef struct devio_keys {
    pthread_mutex_t mu;
    devio_key_claim *head;
} devio_keys;

void devio_keys_init(devio_keys *k);
void devio_keys_destroy(devio_keys *k);

typedef enum devio_keyed_phase {
    DEVIO_KEYED_NONE = 0,  /* no key, or its answer is given */
    DEVIO_KEYED_RUNNING,   /* claimed, found in no history: the handler runs */
    DEVIO_KEYED_RECORDING, /* answered 2xx: its row is being written, then `answer` is sent */
} devio_keyed_phase;

/* What undoes a request whose answer could not be recorded under its key
 * (the route's: a created or forked sequence freed). */
typedef void devio_keyed_undo(devio_server *s, uint64_t arg);

/* One request's key, kept across its handler's calls (zeroed before the first). */
typedef struct devio_keyed {
    devio_keyed_phase phase;
    devio_key_claim *claim;  /* RUNNING, RECORDING: owned by the table */
    char request[192];       /* "METHOD /path" */
    char digest[65];         /* hex SHA-256 of request and canonical body */
    devio_reply answer;      /* RECORDING: the answer, sent once its row is written */
    devio_keyed_undo *undo;  /* set by the handler (devio_keyed_undo_with), or NULL */
    uint64_t undo_arg;
} devio_keyed;

/* Before the handler, on every call of a keyed route. `key` is the
 * Idempotency-Key header or NULL. *answered false: run the handler (then
 * devio_keyed_after). *answered true: *r is the answer (the first one,
 * replayed; or this request's own, its row written) or r->suspended. A
 * status is an error answer: a malformed key (400), key_in_use (409),
 * key_reused (422), store_unavailable (503: the history cannot be written,
 * so nothing is run; or this request's row failed and what it did was
 * undone where it can be). */
devio_status devio_keyed_before(devio_server *s, const devio_request *rq, const char *key,
                                devio_keyed *k, devio_reply *r, bool *answered, devio_error *err);

/* After the handler answered *st, *r. A launch or step wrote its key's row
 * with its ticket's (devio_keyed_launch_key): nothing more is written. Any
 * other 2xx answer is recorded under the key and sent once its row is
 * written (parked meanwhile: r->suspended; a request that cannot park waits
 * here); when the row fails the answer becomes 503 store_unavailable in *st,
 * *r and *err, and the handler's undo runs. Any other answer unclaims the
 * key, so that a retry runs again (a failure changed nothing). */
void devio_keyed_after(devio_server *s, const devio_request *rq, devio_keyed *k, devio_status *st,
                       devio_reply *r, devio_error *err);

/* The handler made something that a retry would make again if the answer
 * naming it went unrecorded: `undo(s, arg)` takes it back then. No effect
 * without a key under way (k may be NULL). */
void devio_keyed_undo_with(devio_keyed *k, devio_keyed_undo *undo, uint64_t arg);

/* A launch's key row, written in the transaction of its ticket's launch row
 * (tickets.h) so that a launch is never recorded without its key, nor its
 * key without it: true and *rec filled (its answer is filled by the launch)
 * when k holds a key under way. */
bool devio_keyed_launch_key(const devio_keyed *k, devio_key_record *rec);
/* The launch's row (with the key's) is history write `write`: the key stays
 * claimed until it is written, even if the request ends first. */
void devio_keyed_launched(devio_server *s, devio_keyed *k, uint64_t write);

/* The request ended (answered, or its client went): drop what k holds. A
 * claim whose row is still being written stands until it is. */
void devio_keyed_end(devio_server *s, devio_keyed *k);

/* The code a key's row has when its answer is "the answer of ticket N"
 * (its text {"ticket":N}), read from the ticket's history row. */
#define DEVIO_KEY_TICKET 0

#endif
