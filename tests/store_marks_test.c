/* store_marks_test.c - what the store keeps so that nothing is answered twice or wrong: the
 * sequence and logits id marks moved past every id handed out before a write that may name it
 * commits (and read back, or derived from an older file's rows, at open), and idempotency key
 * rows bounded by count as well as by age. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "service/store/store.h"
#include "tests/store_fixture.h"

static devio_store *open_with(const ctx *c, uint32_t key_retention)
{
    devio_store_options o = devio_store_options_default();
    o.key_retention = key_retention;
    devio_store *s = NULL;
    devio_error err = {0};
    assert_int_equal(devio_store_open(c->path, &o, &s, &err), DEVIO_OK);
    return s;
}

static void test_id_marks(void **state)
{
    ctx *c = *state;
    devio_store *s = open_with(c, 0);
    uint64_t seq, logits;
    devio_store_first_ids(s, &seq, &logits);
    assert_true(seq == 1 && logits == 1);
    /* Ids handed out, then a write: the marks pass them in its transaction. */
    devio_store_ids_used(s, 5, 3);
    devio_store_ids_used(s, 4, 9); /* marks only rise */
    wait_ok(s, launch(s, 1, 100));
    assert_true(sql_int(c->path, "SELECT CAST(value AS INTEGER) FROM meta"
                                 " WHERE key='seq_id_high'") >= 5);
    assert_true(sql_int(c->path, "SELECT CAST(value AS INTEGER) FROM meta"
                                 " WHERE key='logits_id_high'") >= 9);
    devio_store_close(s);
    s = open_with(c, 0);
    devio_store_first_ids(s, &seq, &logits);
    assert_true(seq > 5 && logits > 9);
    /* The marks are the store's own: not for devio_store_meta_set. */
    devio_error err = {0};
    assert_int_equal(devio_store_meta_set(s, "seq_id_high", "1", &err), DEVIO_E_INVALID);
    assert_int_equal(devio_store_meta_set(s, "logits_id_high", "1", &err), DEVIO_E_INVALID);
    /* The first id of this process passes the mark: it moves a range ahead; later ids
     * within that range move nothing. */
    devio_store_ids_used(s, seq, logits);
    wait_ok(s, launch(s, 2, 100));
    int64_t mark = sql_int(c->path, "SELECT CAST(value AS INTEGER) FROM meta"
                                    " WHERE key='seq_id_high'");
    assert_true(mark >= (int64_t)seq);
    devio_store_ids_used(s, seq + 10, logits + 10);
    wait_ok(s, launch(s, 3, 100));
    assert_int_equal(sql_int(c->path, "SELECT CAST(value AS INTEGER) FROM meta"
                                      " WHERE key='seq_id_high'"),
                     mark);
    devio_store_close(s);
}

/* A file written before the marks: the ids its rows name are passed. */
static void test_id_marks_of_an_older_file(void **state)
{
    ctx *c = *state;
    devio_store *s = open_with(c, 0);
    wait_ok(s, launch(s, 1, 100)); /* sequences 7 and 8 */
    devio_ticket_record done = {.id = 1, .status = "ok", .settled_ms = 200,
                                .answer = "{\"ticket\":1,\"rows\":[{\"seq\":7,\"logits\":12}]}"};
    wait_ok(s, devio_store_ticket_settled(s, &done));
    devio_key_record k = {.key = "k", .request = "POST /v1/sequences", .digest = "d",
                          .code = 201, .answer = "{\"seq\":40}"};
    wait_ok(s, devio_store_key_put(s, &k));
    devio_store_close(s);
    sql_exec(c->path, "DELETE FROM meta WHERE key IN ('seq_id_high', 'logits_id_high')");
    s = open_with(c, 0);
    uint64_t seq, logits;
    devio_store_first_ids(s, &seq, &logits);
    assert_int_equal(seq, 41);
    assert_int_equal(logits, 13);
    devio_store_close(s);
}

/* Keys beyond key_retention go, oldest first, in batches of the slack. */
static void test_key_retention(void **state)
{
    ctx *c = *state;
    devio_store *s = open_with(c, 16);
    for (int i = 0; i < 100; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%03d", i);
        devio_key_record r = {.key = key, .request = "POST /v1/sequences", .digest = "d",
                              .code = 201, .answer = "{\"seq\":1}", .created_ms = 0};
        wait_ok(s, devio_store_key_put(s, &r));
    }
    /* A launch with its key counts too. */
    devio_key_record lk = {.key = "launch", .request = "POST /v1/launch", .digest = "d",
                           .code = 0, .answer = "{\"ticket\":1}"};
    devio_ticket_record rec = {.id = 1, .status = "in_flight", .launched_ms = 100, .rows = 1,
                               .tokens = 1, .seqs = seq1, .n_seqs = 1, .key = &lk};
    wait_ok(s, devio_store_ticket_launched(s, &rec));
    int64_t n = sql_int(c->path, "SELECT count(*) FROM idempotency_keys");
    assert_true(n >= 16 && n <= 17); /* the slack of 16 is 1 */
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM idempotency_keys WHERE key='k000'"),
                     0);
    assert_int_equal(sql_int(c->path, "SELECT count(*) FROM idempotency_keys"
                                      " WHERE key='launch'"),
                     1);
    devio_store_close(s);
    /* Counted again at open. */
    s = open_with(c, 8);
    devio_key_record r = {.key = "late", .request = "POST /v1/sequences", .digest = "d",
                          .code = 201, .answer = "{\"seq\":2}"};
    wait_ok(s, devio_store_key_put(s, &r));
    assert_true(sql_int(c->path, "SELECT count(*) FROM idempotency_keys") <= 9);
    devio_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_id_marks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_id_marks_of_an_older_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_retention, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
