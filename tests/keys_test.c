/* keys_test.c - service/routes/keys.c against a real store: a key under way refused, a 2xx answer
 * recorded and replayed byte for byte, another request under the same key refused (a number
 * spelled another way is the same request), an error not recorded, a key row that fails taking
 * the answer back (503, what the request made undone), and a launch's key written with its
 * ticket's row, whose history row then answers the retry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "service/routes/keys.h"
#include "service/http/request.h"
#include "service/server.h"
#include "tests/store_fixture.h"

typedef struct fx {
    ctx c;
    devio_server s;
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    void *inner = &f->c;
    if (!f || setup(&inner) != 0)
        return -1;
    f->c = *(ctx *)inner;
    free(inner);
    f->s.cfg.http_threads = 2;
    f->s.store = open_store(&f->c, 0);
    devio_keys_init(&f->s.keys);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx *f = *state;
    devio_keys_destroy(&f->s.keys);
    devio_store_close(f->s.store);
    ctx *c = malloc(sizeof *c);
    *c = f->c;
    void *inner = c;
    free(f);
    return teardown(&inner);
}

/* devio_keyed_before for method url body under key; *answered says whether r is the answer. */
static devio_status before(fx *f, devio_keyed *k, const char *method, const char *url,
                           json_t *body, const char *key, devio_reply *r, bool *answered,
                           devio_error *err)
{
    devio_request rq = {.method = method, .url = url, .body = body, .request_id = "t"};
    memset(r, 0, sizeof *r);
    return devio_keyed_before(&f->s, &rq, key, k, r, answered, err);
}

static void test_record_and_replay(void **state)
{
    fx *f = *state;
    devio_keyed k = {0}, k2 = {0};
    devio_reply r;
    bool answered;
    devio_error err = {0};
    json_t *body = json_pack("{s:s,s:I}", "kind", "fork", "seq", (json_int_t)7);
    assert_int_equal(before(f, &k, "POST", "/v1/effects", body, "k1", &r, &answered, &err),
                     DEVIO_OK);
    assert_false(answered);
    assert_int_equal(k.phase, DEVIO_KEYED_RUNNING);
    /* The same key while the first runs. */
    assert_int_equal(before(f, &k2, "POST", "/v1/effects", body, "k1", &r, &answered, &err),
                     DEVIO_E_KEY_IN_USE);
    assert_int_equal(r.retry_after_s, 1);
    /* The handler answered 200: recorded, then given (this request cannot park). */
    devio_request rq = {.method = "POST", .url = "/v1/effects", .body = body};
    devio_reply ans = {.code = 200, .body = strdup("{\"kind\":\"fork\",\"seq\":8}"),
                       .ctype = "application/json"};
    ans.len = strlen(ans.body);
    devio_status ast = DEVIO_OK;
    devio_keyed_after(&f->s, &rq, &k, &ast, &ans, &err);
    assert_int_equal(ast, DEVIO_OK);
    assert_false(ans.suspended);
    assert_string_equal(ans.body, "{\"kind\":\"fork\",\"seq\":8}");
    devio_reply_free(&ans);
    devio_keyed_end(&f->s, &k);
    /* The retry: the same bytes, marked replayed, whatever the key order of its body and
     * however its numbers are spelled (7.0 is 7). */
    json_t *same = json_pack("{s:f,s:s}", "seq", 7.0, "kind", "fork");
    devio_keyed k3 = {0};
    devio_status st;
    for (int i = 0; i < 100000; i++) /* in use until its row is written */
        if ((st = before(f, &k3, "POST", "/v1/effects", same, "k1", &r, &answered, &err)) !=
            DEVIO_E_KEY_IN_USE)
            break;
    assert_int_equal(st, DEVIO_OK);
    assert_true(answered && r.replayed && r.code == 200);
    assert_memory_equal(r.body, "{\"kind\":\"fork\",\"seq\":8}", r.len);
    devio_reply_free(&r);
    /* Another body, another path under the same key. */
    json_t *other = json_pack("{s:s,s:I}", "kind", "fork", "seq", (json_int_t)9);
    devio_keyed k4 = {0};
    assert_int_equal(before(f, &k4, "POST", "/v1/effects", other, "k1", &r, &answered, &err),
                     DEVIO_E_KEY_REUSED);
    assert_int_equal(before(f, &k4, "DELETE", "/v1/sequences/7", NULL, "k1", &r, &answered,
                            &err),
                     DEVIO_E_KEY_REUSED);
    /* An error answer is not recorded: the key runs again. */
    devio_keyed k5 = {0};
    assert_int_equal(before(f, &k5, "POST", "/v1/sequences", NULL, "k2", &r, &answered, &err),
                     DEVIO_OK);
    devio_reply bad = {.code = 500};
    devio_status bst = DEVIO_E_OUT_OF_SEQS;
    devio_keyed_after(&f->s, &rq, &k5, &bst, &bad, &err);
    devio_keyed_end(&f->s, &k5);
    assert_int_equal(before(f, &k5, "POST", "/v1/sequences", NULL, "k2", &r, &answered, &err),
                     DEVIO_OK);
    assert_false(answered);
    devio_keyed_end(&f->s, &k5);
    /* Malformed keys. */
    const char *bad_keys[] = {"", "two words", "\x7f"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(before(f, &k5, "POST", "/v1/sequences", NULL, bad_keys[i], &r,
                                &answered, &err),
                         DEVIO_E_INVALID);
    json_decref(body);
    json_decref(same);
    json_decref(other);
}

static uint64_t undone;

static void undo_seq(devio_server *s, uint64_t seq)
{
    (void)s;
    undone = seq;
}

/* The key's row fails (a trigger refuses it): the 2xx answer is taken back as 503
 * store_unavailable, what the request made is undone, and a retry runs again. */
static void test_unrecorded_answer_is_taken_back(void **state)
{
    fx *f = *state;
    sql_exec(f->c.path, "CREATE TRIGGER no_keys BEFORE INSERT ON idempotency_keys"
                        " BEGIN SELECT RAISE(ABORT, 'injected'); END");
    devio_keyed k = {0};
    devio_reply r;
    bool answered;
    devio_error err = {0};
    assert_int_equal(before(f, &k, "POST", "/v1/sequences", NULL, "c1", &r, &answered, &err),
                     DEVIO_OK);
    devio_keyed_undo_with(&k, undo_seq, 41);
    devio_request rq = {.method = "POST", .url = "/v1/sequences"};
    devio_reply ans = {.code = 201, .body = strdup("{\"seq\":41}"), .ctype = "application/json"};
    ans.len = strlen(ans.body);
    devio_status st = DEVIO_OK;
    undone = 0;
    devio_keyed_after(&f->s, &rq, &k, &st, &ans, &err);
    assert_int_equal(st, DEVIO_E_STORE_UNAVAILABLE);
    assert_null(ans.body);
    assert_int_equal(undone, 41);
    assert_non_null(strstr(err.message, "undone"));
    devio_keyed_end(&f->s, &k);
    /* Nothing was recorded: the retry runs. */
    sql_exec(f->c.path, "DROP TRIGGER no_keys");
    assert_int_equal(before(f, &k, "POST", "/v1/sequences", NULL, "c1", &r, &answered, &err),
                     DEVIO_OK);
    assert_false(answered);
    devio_keyed_end(&f->s, &k);
}

/* A keyed launch writes its key's row with its ticket's: while that row is in flight the
 * retry is told to come back, once it settled the retry gets its answer, a launch's retry
 * gets its ticket, and a key whose ticket row is gone answers unknown_ticket, never running
 * again. A launch row whose key cannot be written is not written either. */
static void test_launch_key_goes_with_its_ticket(void **state)
{
    fx *f = *state;
    devio_keyed k = {0};
    devio_reply r;
    bool answered;
    devio_error err = {0};
    json_t *plan = json_pack("{s:[{s:I,s:[i]}]}", "rows", "seq", (json_int_t)7, "tokens", 1);
    assert_int_equal(before(f, &k, "POST", "/v1/step", plan, "s1", &r, &answered, &err),
                     DEVIO_OK);
    devio_key_record key;
    assert_true(devio_keyed_launch_key(&k, &key));
    key.answer = "{\"ticket\":5}";
    devio_ticket_record rec = {.id = 5, .status = "in_flight", .launched_ms = 100, .rows = 1,
                               .tokens = 1, .seqs = seq1, .n_seqs = 1, .key = &key};
    uint64_t w = devio_store_ticket_launched(f->s.store, &rec);
    devio_keyed_launched(&f->s, &k, w);
    devio_keyed_end(&f->s, &k); /* the client went: the claim stands until the row is written */
    devio_keyed k2 = {0};
    devio_status st;
    for (int i = 0; i < 100000; i++) {
        st = before(f, &k2, "POST", "/v1/step", plan, "s1", &r, &answered, &err);
        if (st != DEVIO_E_KEY_IN_USE || err.detail_key[0])
            break; /* key_in_use without details: the row is still being written */
    }
    assert_int_equal(st, DEVIO_E_KEY_IN_USE);
    assert_string_equal(err.detail_key, "ticket");
    assert_int_equal(err.detail_val, 5);
    devio_ticket_record done = {.id = 5, .status = "ok", .settled_ms = 200,
                                .answer = "{\"ticket\":5,\"rows\":[]}"};
    wait_ok(f->s.store, devio_store_ticket_settled(f->s.store, &done));
    assert_int_equal(before(f, &k2, "POST", "/v1/step", plan, "s1", &r, &answered, &err),
                     DEVIO_OK);
    assert_true(answered && r.replayed && r.code == 200);
    assert_memory_equal(r.body, "{\"ticket\":5,\"rows\":[]}", r.len);
    devio_reply_free(&r);
    /* A launch's key answers its ticket. */
    devio_keyed k3 = {0};
    assert_int_equal(before(f, &k3, "POST", "/v1/launch", plan, "l1", &r, &answered, &err),
                     DEVIO_OK);
    assert_true(devio_keyed_launch_key(&k3, &key));
    key.answer = "{\"ticket\":6}";
    rec.id = 6;
    wait_ok(f->s.store, devio_store_ticket_launched(f->s.store, &rec));
    devio_keyed_end(&f->s, &k3);
    assert_int_equal(before(f, &k3, "POST", "/v1/launch", plan, "l1", &r, &answered, &err),
                     DEVIO_OK);
    assert_true(answered && r.replayed && r.code == 202);
    assert_memory_equal(r.body, "{\"ticket\":6}", r.len);
    devio_reply_free(&r);
    /* Its ticket's row trimmed: the key answers so and runs nothing. */
    sql_exec(f->c.path, "DELETE FROM tickets WHERE id = 6");
    assert_int_equal(before(f, &k3, "POST", "/v1/launch", plan, "l1", &r, &answered, &err),
                     DEVIO_E_UNKNOWN_TICKET);
    assert_int_equal(err.detail_val, 6);
    /* The key's row refused: the launch row goes with it. */
    sql_exec(f->c.path, "CREATE TRIGGER no_keys BEFORE INSERT ON idempotency_keys"
                        " BEGIN SELECT RAISE(ABORT, 'injected'); END");
    devio_keyed k4 = {0};
    assert_int_equal(before(f, &k4, "POST", "/v1/launch", plan, "l2", &r, &answered, &err),
                     DEVIO_OK);
    assert_true(devio_keyed_launch_key(&k4, &key));
    key.answer = "{\"ticket\":7}";
    rec.id = 7;
    assert_int_equal(devio_store_wait(f->s.store, devio_store_ticket_launched(f->s.store, &rec),
                                      &err),
                     DEVIO_E_IO);
    assert_int_equal(sql_int(f->c.path, "SELECT count(*) FROM tickets WHERE id = 7"), 0);
    devio_keyed_end(&f->s, &k4);
    json_decref(plan);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_and_replay, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unrecorded_answer_is_taken_back, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_launch_key_goes_with_its_ticket, fx_setup,
                                        fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
