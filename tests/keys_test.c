/* keys_test.c - service/keys.c against a real store: a key under way refused, a 2xx answer
 * recorded and replayed byte for byte, another request under the same key refused, an error not
 * recorded, and a launch or step whose client went pointing its key at the ticket, whose
 * history row then answers the retry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "service/keys.h"
#include "service/request.h"
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
    devio_keyed_after(&f->s, &rq, &k, DEVIO_OK, &ans);
    assert_false(ans.suspended);
    assert_string_equal(ans.body, "{\"kind\":\"fork\",\"seq\":8}");
    devio_reply_free(&ans);
    devio_keyed_end(&f->s, &k, &(devio_ticket_op){0});
    /* The retry: the same bytes, marked replayed, whatever the key order of its body. */
    json_t *same = json_pack("{s:I,s:s}", "seq", (json_int_t)7, "kind", "fork");
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
    devio_keyed_after(&f->s, &rq, &k5, DEVIO_E_OUT_OF_SEQS, &bad);
    devio_keyed_end(&f->s, &k5, &(devio_ticket_op){0});
    assert_int_equal(before(f, &k5, "POST", "/v1/sequences", NULL, "k2", &r, &answered, &err),
                     DEVIO_OK);
    assert_false(answered);
    devio_keyed_end(&f->s, &k5, &(devio_ticket_op){0});
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

/* The client of a keyed step goes while the step runs: the key points at the ticket. */
static void test_gone_client_points_at_ticket(void **state)
{
    fx *f = *state;
    devio_keyed k = {0};
    devio_reply r;
    bool answered;
    devio_error err = {0};
    json_t *plan = json_pack("{s:[{s:I,s:[i]}]}", "rows", "seq", (json_int_t)7, "tokens", 1);
    assert_int_equal(before(f, &k, "POST", "/v1/step", plan, "s1", &r, &answered, &err),
                     DEVIO_OK);
    wait_ok(f->s.store, launch(f->s.store, 5, 100));
    devio_ticket_op op = {.phase = DEVIO_OP_AWAITING, .ticket = 5, .owned = true};
    devio_keyed_end(&f->s, &k, &op);
    /* Until the ticket's row settles the retry is told to come back. */
    devio_keyed k2 = {0};
    devio_status st;
    for (int i = 0; i < 100000; i++) {
        st = before(f, &k2, "POST", "/v1/step", plan, "s1", &r, &answered, &err);
        if (st != DEVIO_E_KEY_IN_USE || err.detail_key[0])
            break; /* key_in_use without details: the pointer's row is still being written */
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
    devio_ticket_op lop = {.phase = DEVIO_OP_LAUNCHING, .ticket = 5, .owned = true};
    devio_keyed_end(&f->s, &k3, &lop);
    devio_keyed k4 = {0};
    for (int i = 0; i < 100000; i++)
        if ((st = before(f, &k4, "POST", "/v1/launch", plan, "l1", &r, &answered, &err)) !=
            DEVIO_E_KEY_IN_USE)
            break;
    assert_int_equal(st, DEVIO_OK);
    assert_true(answered && r.replayed && r.code == 202);
    assert_memory_equal(r.body, "{\"ticket\":5}", r.len);
    devio_reply_free(&r);
    /* A pointer at a ticket the history never held (its launch row failed): the retry runs. */
    devio_keyed k5 = {0};
    assert_int_equal(before(f, &k5, "POST", "/v1/launch", NULL, "l2", &r, &answered, &err),
                     DEVIO_OK);
    devio_ticket_op gone = {.phase = DEVIO_OP_LAUNCHING, .ticket = 77, .owned = true};
    devio_keyed_end(&f->s, &k5, &gone);
    for (int i = 0; i < 100000; i++)
        if ((st = before(f, &k5, "POST", "/v1/launch", NULL, "l2", &r, &answered, &err)) !=
            DEVIO_E_KEY_IN_USE)
            break;
    assert_int_equal(st, DEVIO_OK);
    assert_false(answered);
    devio_keyed_end(&f->s, &k5, &(devio_ticket_op){0});
    json_decref(plan);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_and_replay, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_gone_client_points_at_ticket, fx_setup,
                                        fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
