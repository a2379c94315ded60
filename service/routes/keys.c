/* keys.c - Idempotency-Key: claims of the keys under way, the first answer looked up and replayed, a new answer recorded before it is sent.
 * Only 2xx answers are recorded: a failed request changed nothing, so running its retry again is right. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "device/status.h"
#include "service/routes/keys.h"
#include "service/http/request.h"
#include "service/routes/ticket_replay.h"
#include "service/server.h"

void devio_keys_init(devio_keys *k)
{
    pthread_mutex_init(&k->mu, NULL);
    k->head = NULL;
}

void devio_keys_destroy(devio_keys *k)
{
    while (k->head) {
        devio_key_claim *c = k->head;
        k->head = c->next;
        free(c);
    }
    pthread_mutex_destroy(&k->mu);
}

static bool key_ok(const char *key)
{
    size_t n = strlen(key);
    if (n == 0 || n > DEVIO_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (key[i] < 0x21 || key[i] > 0x7e)
            return false;
    return true;
}

/* The value as decoded, not as spelled: a number with an integral value is
 * an integer (0.0 and 0, 1e2 and 100 are one value), so that a retry that
 * spells a number another way is the same request. New reference; NULL when
 * out of memory. Depth is bounded by the body's (--max-json-depth). */
static json_t *canonical(json_t *v)
{
    size_t i;
    const char *name;
    json_t *item, *out = NULL;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        out = json_object();
        json_object_foreach(v, name, item) {
            if (out && json_object_set_new(out, name, canonical(item)) != 0) {
                json_decref(out);
                out = NULL;
            }
        }
        return out;
    case JSON_ARRAY:
        out = json_array();
        json_array_foreach(v, i, item) {
            if (out && json_array_append_new(out, canonical(item)) != 0) {
                json_decref(out);
                out = NULL;
            }
        }
        return out;
    case JSON_REAL: {
        double d = json_real_value(v);
        /* In range first: casting a double past int64 is undefined. */
        if (d > -9.2e18 && d < 9.2e18 && d == (double)(int64_t)d)
            return json_integer((json_int_t)d);
        return json_incref(v);
    }
    default:
        return json_incref(v);
    }
}

/* The request as a key answers it: method and path, and the decoded body
 * with its keys sorted, no spaces and numbers by value, so that a retry need
 * not send the same bytes; or a streamed body's bytes, by their digest. */
static void digest_of(const devio_request *rq, devio_keyed *k)
{
    const char *q = strchr(rq->url, '?');
    int path_len = q ? (int)(q - rq->url) : (int)strlen(rq->url);
    snprintf(k->request, sizeof k->request, "%s %.*s", rq->method, path_len, rq->url);
    json_t *c = rq->body ? canonical((json_t *)rq->body) : NULL;
    char *body = c ? json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(c);
    devio_sha256 h;
    uint8_t d[32];
    devio_sha256_init(&h);
    devio_sha256_update(&h, k->request, strlen(k->request) + 1);
    if (body)
        devio_sha256_update(&h, body, strlen(body));
    /* A streamed body (a state) counts by its bytes' digest. */
    if (rq->body_digest)
        devio_sha256_update(&h, rq->body_digest, strlen(rq->body_digest));
    devio_sha256_final(&h, d);
    devio_sha256_hex(d, k->digest);
    free(body);
}

/* Whether a claim still stands for its key: its request runs, or its row is
 * not yet written. Orphans whose row is written are dropped (lock held). */
static bool claim_stands(devio_server *s, devio_key_claim **link)
{
    devio_key_claim *c = *link;
    bool written = c->write && devio_store_done(s->store, c->write);
    if (c->orphan && written) {
        *link = c->next;
        free(c);
        return false;
    }
    return !written;
}

/* Claim key: NULL when another request holds it. */
static devio_key_claim *claim(devio_server *s, const char *key)
{
    devio_keys *t = &s->keys;
    pthread_mutex_lock(&t->mu);
    bool held = false;
    for (devio_key_claim **l = &t->head; *l;) {
        devio_key_claim *c = *l;
        bool stands = claim_stands(s, l);
        if (*l != c)
            continue; /* dropped: *l is already the next one */
        held = held || (stands && strcmp(c->key, key) == 0);
        l = &c->next;
    }
    devio_key_claim *c = held ? NULL : calloc(1, sizeof *c);
    if (c) {
        snprintf(c->key, sizeof c->key, "%s", key);
        c->next = t->head;
        t->head = c;
    }
    pthread_mutex_unlock(&t->mu);
    return c;
}

/* Drop claim c; an orphan (its row still being written) stays until written. */
static void unclaim(devio_server *s, devio_key_claim *c, bool orphan)
{
    devio_keys *t = &s->keys;
    pthread_mutex_lock(&t->mu);
    if (orphan && c->write && !devio_store_done(s->store, c->write)) {
        c->orphan = true;
        c = NULL;
    }
    for (devio_key_claim **l = &t->head; c && *l; l = &(*l)->next)
        if (*l == c) {
            *l = c->next;
            free(c);
            break;
        }
    pthread_mutex_unlock(&t->mu);
}

/* The history's answer for the key, when it has one: replayed if it was
 * given to this same request, else key_reused. A key whose answer is a
 * ticket's answers what the ticket's row says, and never runs again, even
 * once retention has trimmed that row. */
static devio_status look_up(devio_server *s, const char *key, devio_keyed *k, devio_reply *r,
                            bool *found, devio_error *err)
{
    devio_key_record rec;
    devio_status st = devio_store_key_get(s->store, key, &rec, found, err);
    if (st != DEVIO_OK || !*found)
        return st;
    if (strcmp(rec.digest, k->digest) != 0) {
        st = devio_fail(err, DEVIO_E_KEY_REUSED,
                        "Idempotency-Key '%s' already answered another request (%s, or the "
                        "same route with another body); use a new key for a new request",
                        key, rec.request);
    } else if (rec.code == DEVIO_KEY_TICKET) {
        json_t *j = json_loads(rec.answer, 0, NULL);
        json_int_t t = json_integer_value(json_object_get(j, "ticket"));
        json_decref(j);
        bool launch = strncmp(k->request, "POST /v1/launch", 15) == 0, row = false;
        st = devio_ticket_replay(s, (uint64_t)t, launch, r, &row, err);
        if (st == DEVIO_OK && !row)
            st = devio_fail_at(err, DEVIO_E_UNKNOWN_TICKET, "ticket", t,
                               "Idempotency-Key '%s' answered ticket %lld, whose row is no longer"
                               " in the history (trimmed by --retention); it is not run again",
                               key, (long long)t);
    } else {
        size_t n = strlen(rec.answer);
        devio_reply_bytes(r, rec.code, "application/json", (char *)rec.answer, n);
        rec.answer = NULL; /* the reply's now */
        r->replayed = true;
    }
    devio_key_record_free(&rec);
    return st;
}

/* Park until k's row is written: true when parked. */
static bool park_until_written(devio_server *s, const devio_request *rq, devio_keyed *k)
{
    if (!rq->wait)
        return false;
    for (;;) {
        devio_waits_enter_write(&s->waits, rq->wait, rq->conn, k->claim->write);
        if (devio_store_done(s->store, k->claim->write)) {
            devio_waits_leave(&s->waits, rq->wait);
            return false;
        }
        devio_wait_park p = devio_waits_park(&s->waits, rq->wait);
        if (p == DEVIO_WAIT_PARKED)
            return true;
        if (p == DEVIO_WAIT_CLOSED)
            return false;
    }
}

static void release(devio_server *s, devio_keyed *k)
{
    unclaim(s, k->claim, true);
    k->claim = NULL;
    k->phase = DEVIO_KEYED_NONE;
    k->undo = NULL;
}

/* k's answer could not be kept under its key (`why`): taken back, what the
 * request made undone where it can be, and 503 store_unavailable instead. */
static devio_status take_back(devio_server *s, devio_keyed *k, const char *why,
                              devio_error *err)
{
    bool undone = k->undo != NULL;
    if (undone)
        k->undo(s, k->undo_arg);
    devio_reply_free(&k->answer);
    release(s, k);
    return devio_fail(err, DEVIO_E_STORE_UNAVAILABLE,
                      "the answer could not be kept under its Idempotency-Key: %s; retry once "
                      "/readyz is ready (%s)",
                      undone ? "what the request made was undone"
                             : "the request was carried out and cannot be undone, and a retry "
                               "runs it again",
                      why);
}

/* k's recorded answer once its row is written (parked until then when the
 * request can park: r->suspended), or, when the row failed, taken back. */
static devio_status give_answer(devio_server *s, const devio_request *rq, devio_keyed *k,
                                devio_reply *r, devio_error *err)
{
    if (park_until_written(s, rq, k)) {
        r->suspended = true;
        return DEVIO_OK;
    }
    devio_error werr = {0};
    if (devio_store_wait(s->store, k->claim->write, &werr) != DEVIO_OK)
        return take_back(s, k, werr.message, err);
    *r = k->answer;
    memset(&k->answer, 0, sizeof k->answer);
    release(s, k);
    return DEVIO_OK;
}

devio_status devio_keyed_before(devio_server *s, const devio_request *rq, const char *key,
                                devio_keyed *k, devio_reply *r, bool *answered, devio_error *err)
{
    *answered = false;
    if (k->phase == DEVIO_KEYED_RUNNING)
        return DEVIO_OK; /* the handler runs again after parking */
    if (k->phase == DEVIO_KEYED_RECORDING) {
        *answered = true;
        return give_answer(s, rq, k, r, err);
    }
    if (!key)
        return DEVIO_OK;
    if (!key_ok(key))
        return devio_fail(err, DEVIO_E_INVALID,
                          "Idempotency-Key must be 1 to %d visible ASCII characters",
                          DEVIO_KEY_MAX);
    digest_of(rq, k);
    k->claim = claim(s, key);
    if (!k->claim) {
        r->retry_after_s = 1;
        return devio_fail(err, DEVIO_E_KEY_IN_USE,
                          "a request with Idempotency-Key '%s' is under way; ask again when it"
                          " has answered",
                          key);
    }
    bool found = false;
    devio_status st = look_up(s, key, k, r, &found, err);
    if (st == DEVIO_OK && !found && !devio_store_writable(s->store))
        st = devio_fail(err, DEVIO_E_STORE_UNAVAILABLE,
                        "the history cannot be written, so an answer could not be kept under "
                        "Idempotency-Key '%s': nothing was run; retry once /readyz is ready",
                        key);
    if (st != DEVIO_OK || found) {
        unclaim(s, k->claim, false);
        k->claim = NULL;
        *answered = st == DEVIO_OK;
        return st;
    }
    k->phase = DEVIO_KEYED_RUNNING;
    return DEVIO_OK;
}

void devio_keyed_after(devio_server *s, const devio_request *rq, devio_keyed *k, devio_status *st,
                       devio_reply *r, devio_error *err)
{
    if (k->phase != DEVIO_KEYED_RUNNING || r->suspended)
        return;
    /* A launch or step: its key's row went with its ticket's launch row,
     * committed before the answer (or failed with it, launching nothing). */
    if (rq->op && rq->op->owned) {
        release(s, k);
        return;
    }
    if (*st != DEVIO_OK || r->code < 200 || r->code >= 300 || !r->body) {
        release(s, k); /* not recorded: a retry runs again */
        return;
    }
    k->answer = *r;
    memset(r, 0, sizeof *r);
    /* The body is text: every keyed route answers JSON. */
    uint64_t write = 0;
    char *text = malloc(k->answer.len + 1);
    if (text) {
        memcpy(text, k->answer.body, k->answer.len);
        text[k->answer.len] = '\0';
        devio_key_record rec = {.key = k->claim->key, .request = k->request, .digest = k->digest,
                                .code = k->answer.code, .answer = text};
        write = devio_store_key_put(s->store, &rec);
        free(text);
    }
    if (write == 0) {
        *st = take_back(s, k, "its row could not be queued: out of memory, or stopping", err);
        return;
    }
    pthread_mutex_lock(&s->keys.mu);
    k->claim->write = write;
    pthread_mutex_unlock(&s->keys.mu);
    k->phase = DEVIO_KEYED_RECORDING;
    *st = give_answer(s, rq, k, r, err);
}

void devio_keyed_undo_with(devio_keyed *k, devio_keyed_undo *undo, uint64_t arg)
{
    if (!k || k->phase != DEVIO_KEYED_RUNNING)
        return;
    k->undo = undo;
    k->undo_arg = arg;
}

bool devio_keyed_launch_key(const devio_keyed *k, devio_key_record *rec)
{
    if (!k || k->phase != DEVIO_KEYED_RUNNING)
        return false;
    *rec = (devio_key_record){.key = k->claim->key, .request = k->request, .digest = k->digest,
                              .code = DEVIO_KEY_TICKET};
    return true;
}

void devio_keyed_launched(devio_server *s, devio_keyed *k, uint64_t write)
{
    if (!k || !k->claim)
        return;
    pthread_mutex_lock(&s->keys.mu);
    k->claim->write = write;
    pthread_mutex_unlock(&s->keys.mu);
}

void devio_keyed_end(devio_server *s, devio_keyed *k)
{
    if (k->claim)
        unclaim(s, k->claim, true);
    k->claim = NULL;
    devio_reply_free(&k->answer);
    k->phase = DEVIO_KEYED_NONE;
    k->undo = NULL;
}
