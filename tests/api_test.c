/* api_test.c - JSON codecs (adapter records included), SHA-256, the in-process target (conform/inproc.c) and the script runner.
 * Uses the real device over the reference backend on a written tiny model. */
#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>

#include "api/adapter_codec.h"
#include "api/codec.h"
#include "api/plan_run.h"
#include "conform/inproc.h"
#include "conform/script.h"
#include "device/sample/sampler.h"
#include "common/sha256.h"
#include "device/status.h"
#include "ref/ref_backend.h"
#include "tests/testutil.h"

static void test_sha256_vectors(void **state)
{
    (void)state;
    const struct {
        const char *in;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < 3; i++) {
        devio_sha256 s;
        uint8_t d[32];
        char hex[65];
        devio_sha256_init(&s);
        devio_sha256_update(&s, v[i].in, strlen(v[i].in));
        devio_sha256_final(&s, d);
        devio_sha256_hex(d, hex);
        assert_string_equal(hex, v[i].hex);
    }
    /* one million 'a', fed in odd-sized pieces */
    devio_sha256 s;
    devio_sha256_init(&s);
    char buf[997];
    memset(buf, 'a', sizeof buf);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof buf ? left : sizeof buf;
        devio_sha256_update(&s, buf, n);
        left -= n;
    }
    uint8_t d[32];
    char hex[65];
    devio_sha256_final(&s, d);
    devio_sha256_hex(d, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_digest_canonicalises_nan(void **state)
{
    (void)state;
    uint32_t a = 0x7fc00001u, b = 0xffc00000u;
    float fa, fb;
    memcpy(&fa, &a, 4);
    memcpy(&fb, &b, 4);
    char ha[65], hb[65];
    devio_logits_digest(&fa, 1, ha);
    devio_logits_digest(&fb, 1, hb);
    assert_string_equal(ha, hb);
    float one = 1.0f;
    devio_logits_digest(&one, 1, hb);
    assert_string_not_equal(ha, hb);
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, JSON_DECODE_ANY, &e);
    assert_non_null(j);
    return j;
}

static void test_plan_decode(void **state)
{
    (void)state;
    devio_plan_buf buf;
    devio_error err = {0};
    json_t *j = parse("{\"rows\":[{\"seq\":7,\"tokens\":[1,2,3],\"logits\":\"last\","
                      "\"adapter\":\"sql\",\"sample\":{\"temperature\":0.5,\"top_k\":40,"
                      "\"seed\":1},\"snapshot\":\"end\"},{\"seq\":8,\"tokens\":[4]}]}");
    assert_int_equal(devio_json_plan_decode(j, 64, 2048, &buf, &err), DEVIO_OK);
    assert_int_equal(buf.plan.n_rows, 2);
    assert_int_equal(buf.rows[0].seq, 7);
    assert_int_equal(buf.rows[0].n_tokens, 3);
    assert_int_equal(buf.rows[0].tokens[2], 3);
    assert_int_equal(buf.rows[0].logits, DEVIO_LOGITS_LAST);
    assert_string_equal(buf.rows[0].adapter, "sql");
    assert_true(buf.rows[0].has_sample);
    assert_true(buf.rows[0].sample.temperature == 0.5f);
    assert_int_equal(buf.rows[0].sample.top_k, 40);
    assert_true(buf.rows[0].sample.top_p == 1.0f);
    assert_int_equal(buf.rows[0].snapshot, DEVIO_SNAP_END);
    assert_int_equal(buf.rows[1].tokens[0], 4);
    assert_int_equal(buf.rows[1].logits, DEVIO_LOGITS_NONE);
    assert_int_equal(buf.rows[1].snapshot, DEVIO_SNAP_NONE);
    devio_plan_buf_free(&buf);
    json_decref(j);

    /* "each": a snapshot after every token (speculative decoding); null is none. */
    j = parse("{\"rows\":[{\"seq\":7,\"tokens\":[1,2],\"snapshot\":\"each\"},"
              "{\"seq\":8,\"tokens\":[4],\"snapshot\":null}]}");
    assert_int_equal(devio_json_plan_decode(j, 64, 2048, &buf, &err), DEVIO_OK);
    assert_int_equal(buf.rows[0].snapshot, DEVIO_SNAP_EACH);
    assert_int_equal(buf.rows[1].snapshot, DEVIO_SNAP_NONE);
    devio_plan_buf_free(&buf);
    json_decref(j);

    const struct {
        const char *body;
        devio_status want;
    } bad[] = {
        {"[]", DEVIO_E_INVALID},
        {"{}", DEVIO_E_INVALID},
        {"{\"rows\":[]}", DEVIO_E_INVALID},
        {"{\"rows\":[1]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"tokens\":[1]}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":-1,\"tokens\":[1]}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[]}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1.5]}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[\"a\"]}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"logits\":\"some\"}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"adapter\":3}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"sample\":{\"temperature\":\"x\"}}]}",
         DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"snapshot\":\"start\"}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"snapshot\":\"END\"}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"snapshot\":1}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"snapshot\":true}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"logit\":\"all\"}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1]}],\"extra\":1}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1],\"sample\":{\"temp\":1}}]}", DEVIO_E_INVALID},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1,2,3,4,5]}]}", DEVIO_E_TOO_LARGE},
        {"{\"rows\":[{\"seq\":1,\"tokens\":[1]},{\"seq\":2,\"tokens\":[1]},"
         "{\"seq\":3,\"tokens\":[1]}]}",
         DEVIO_E_TOO_LARGE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = parse(bad[i].body);
        memset(&err, 0, sizeof err);
        assert_int_equal(devio_json_plan_decode(j, 2, 4, &buf, &err), bad[i].want);
        assert_true(err.message[0] != '\0');
        assert_null(buf.rows);
        json_decref(j);
    }
}

/* devio_plan_run's starter: counts its calls and records the plan's shape. */
typedef struct plan_seen {
    int calls;
    uint32_t rows, tokens;
} plan_seen;

static devio_status see_plan(void *ctx, devio_device *d, const devio_plan *plan,
                             devio_error *err)
{
    (void)d;
    plan_seen *p = ctx;
    p->calls++;
    p->rows = plan->n_rows;
    for (uint32_t i = 0; i < plan->n_rows; i++)
        p->tokens += plan->rows[i].n_tokens;
    return p->calls > 1 ? devio_fail(err, DEVIO_E_SEQ_BUSY, "second start") : DEVIO_OK;
}

/* The one way a JSON plan reaches a device: sized by the device's limits,
 * refused before the starter runs, and the starter's status returned. */
static void test_plan_run(void **state)
{
    (void)state;
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", DEVIO_F32, 3), 0);
    devio_device *d = NULL;
    devio_config cfg = devio_config_default();
    cfg.max_rows = 2;
    cfg.max_batch_tokens = 4;
    assert_int_equal(devio_open(fx.model, &devio_ref_backend, &cfg, &d, NULL), DEVIO_OK);
    devio_error err = {0};
    plan_seen seen = {0};
    json_t *j = parse("{\"rows\":[{\"seq\":1,\"tokens\":[1,2,3]},{\"seq\":2,\"tokens\":[4]}]}");
    assert_int_equal(devio_plan_run(d, j, see_plan, &seen, &err), DEVIO_OK);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.rows, 2);
    assert_int_equal(seen.tokens, 4);
    /* The starter's own refusal comes back as it is. */
    assert_int_equal(devio_plan_run(d, j, see_plan, &seen, &err), DEVIO_E_SEQ_BUSY);
    assert_int_equal(seen.calls, 2);
    json_decref(j);
    /* Beyond the device's limits: refused by the decoder, never started. */
    const char *big[] = {
        "{\"rows\":[{\"seq\":1,\"tokens\":[1,2,3,4,5]}]}",
        "{\"rows\":[{\"seq\":1,\"tokens\":[1]},{\"seq\":2,\"tokens\":[1]},"
        "{\"seq\":3,\"tokens\":[1]}]}",
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        j = parse(big[i]);
        assert_int_equal(devio_plan_run(d, j, see_plan, &seen, &err), DEVIO_E_TOO_LARGE);
        json_decref(j);
    }
    j = parse("{\"rows\":[]}");
    assert_int_equal(devio_plan_run(d, j, see_plan, &seen, &err), DEVIO_E_INVALID);
    json_decref(j);
    assert_int_equal(seen.calls, 2);
    devio_teardown(d, NULL);
    devio_fixture_free(&fx);
}

static void test_effect_decode(void **state)
{
    (void)state;
    devio_effect e;
    devio_sample_buf pb;
    devio_error err = {0};
    json_t *j = parse("{\"kind\":\"sample\",\"logits\":31,\"row\":0,\"params\":{\"temperature\":0}}");
    assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_OK);
    assert_int_equal(e.kind, DEVIO_EFFECT_SAMPLE);
    assert_int_equal(e.logits, 31);
    assert_true(e.has_row);
    assert_true(e.params.temperature == 0.0f);
    assert_int_equal(e.params.n_bias, 0);
    devio_sample_buf_free(&pb);
    json_decref(j);
    /* One record: the processing and the top logprobs land beside temperature. */
    j = parse("{\"kind\":\"sample\",\"logits\":31,\"params\":{\"temperature\":0.5,"
              "\"logit_bias\":{\"5\":1.5},\"banned_tokens\":[2],\"presence_penalty\":0.25,"
              "\"penalty_from\":3,\"logprobs\":4}}");
    assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_OK);
    const devio_sample_params *sp = &e.params;
    assert_true(sp->temperature == 0.5f && sp->presence_penalty == 0.25f);
    assert_true(sp->n_bias == 1 && sp->bias_ids[0] == 5 && sp->bias[0] == 1.5f);
    assert_true(sp->n_banned == 1 && sp->banned[0] == 2);
    assert_true(sp->penalty_from == 3 && sp->logprobs == 4);
    assert_true(sp->bias_ids == pb.ids && sp->banned == pb.banned);
    devio_sample_buf_free(&pb);
    json_decref(j);
    j = parse("{\"kind\":\"truncate\",\"seq\":7,\"len\":2}");
    assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_OK);
    assert_int_equal(e.seq, 7);
    assert_int_equal(e.len, 2);
    json_decref(j);
    /* release: a logits handle, or every snapshot of a sequence. */
    j = parse("{\"kind\":\"release\",\"logits\":31}");
    assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_OK);
    assert_int_equal(e.kind, DEVIO_EFFECT_RELEASE);
    assert_int_equal(e.logits, 31);
    assert_int_equal(e.seq, 0);
    json_decref(j);
    j = parse("{\"kind\":\"release\",\"seq\":7}");
    assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_OK);
    assert_int_equal(e.kind, DEVIO_EFFECT_RELEASE);
    assert_int_equal(e.seq, 7);
    assert_int_equal(e.logits, 0);
    json_decref(j);
    const char *bad[] = {"{\"kind\":\"explode\"}", "{\"kind\":\"fork\"}",
                         "{\"kind\":\"truncate\",\"seq\":1}", "{\"kind\":\"release\"}",
                         "{\"kind\":\"sample\",\"logits\":1,\"params\":[]}", "3",
                         "{\"kind\":\"fork\",\"seq\":1,\"sq\":2}",
                         "{\"kind\":\"release\",\"logits\":31,\"seq\":7}",
                         "{\"kind\":\"release\",\"seq\":-1}",
                         "{\"kind\":\"release\",\"seq\":\"7\"}",
                         "{\"kind\":\"release\",\"seq\":null}",
                         "{\"kind\":\"release\",\"logits\":null,\"seq\":7}",
                         "{\"kind\":\"release\",\"snapshots\":7}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = parse(bad[i]);
        memset(&err, 0, sizeof err);
        assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_E_INVALID);
        assert_true(err.message[0] != '\0');
        json_decref(j);
    }
    /* Both or neither of logits and seq: the message says what release takes. */
    j = parse("{\"kind\":\"release\",\"logits\":31,\"seq\":7}");
    assert_int_equal(devio_json_effect_decode(j, &e, &pb, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "exactly one of 'logits'"));
    json_decref(j);
}

/* The outcome of `effect` as compact JSON text (caller frees). */
static char *outcome_text(const char *effect, const devio_outcome *o)
{
    devio_effect e;
    devio_sample_buf pb;
    devio_error err = {0};
    json_t *je = parse(effect);
    assert_int_equal(devio_json_effect_decode(je, &e, &pb, &err), DEVIO_OK);
    json_decref(je);
    devio_sample_buf_free(&pb);
    json_t *j = devio_json_outcome(&e, o);
    assert_non_null(j);
    char *t = json_dumps(j, DEVIO_JSON_FLAGS);
    json_decref(j);
    assert_non_null(t);
    return t;
}

static void test_outcome_encode(void **state)
{
    (void)state;
    const struct {
        const char *effect;
        devio_outcome o;
        const char *want;
    } cases[] = {
        {"{\"kind\":\"truncate\",\"seq\":7,\"len\":2}",
         {.kind = DEVIO_EFFECT_TRUNCATE, .len = 2, .freed_blocks = 1, .freed_snapshots = 3},
         "{\"kind\":\"truncate\",\"len\":2,\"freed_blocks\":1,\"freed_snapshots\":3}"},
        {"{\"kind\":\"free\",\"seq\":7}",
         {.kind = DEVIO_EFFECT_FREE, .freed_blocks = 2, .freed_snapshots = 0, .freed_logits = 3},
         "{\"kind\":\"free\",\"freed_blocks\":2,\"freed_snapshots\":0,\"freed_logits\":3}"},
        {"{\"kind\":\"park\",\"seq\":7}", {.kind = DEVIO_EFFECT_PARK, .parked_bytes = 41},
         "{\"kind\":\"park\",\"freed_blocks\":0,\"freed_snapshots\":0,\"parked_bytes\":41}"},
        {"{\"kind\":\"release\",\"seq\":7}",
         {.kind = DEVIO_EFFECT_RELEASE, .freed_snapshots = 4},
         "{\"kind\":\"release\",\"freed_snapshots\":4}"},
        {"{\"kind\":\"release\",\"seq\":7}", {.kind = DEVIO_EFFECT_RELEASE},
         "{\"kind\":\"release\",\"freed_snapshots\":0}"},
        {"{\"kind\":\"release\",\"logits\":31}", {.kind = DEVIO_EFFECT_RELEASE},
         "{\"kind\":\"release\"}"},
        {"{\"kind\":\"snapshot\",\"seq\":7}", {.kind = DEVIO_EFFECT_SNAPSHOT, .len = 5},
         "{\"kind\":\"snapshot\",\"len\":5}"},
        {"{\"kind\":\"fork\",\"seq\":7}",
         {.kind = DEVIO_EFFECT_FORK, .seq = 8, .shared_blocks = 1},
         "{\"kind\":\"fork\",\"seq\":8,\"shared_blocks\":1}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *t = outcome_text(cases[i].effect, &cases[i].o);
        assert_string_equal(t, cases[i].want);
        free(t);
    }
}

static void test_seq_info_encode(void **state)
{
    (void)state;
    devio_seq_info s = {.seq = 7, .len = 3, .parked = true};
    json_t *j = devio_json_seq_info(&s);
    char *t = json_dumps(j, DEVIO_JSON_FLAGS);
    assert_string_equal(t, "{\"seq\":7,\"len\":3,\"blocks\":0,\"busy\":null,\"ssm_slot\":false,"
                           "\"snapshots_held\":0,\"snapshots\":[],\"parked\":true}");
    free(t);
    json_decref(j);
    /* A hybrid sequence: its slot, its snapshots counted exactly and listed
     * up to DEVIO_SEQ_SNAPSHOTS_LISTED. */
    s = (devio_seq_info){.seq = 7, .len = 90, .blocks = 6, .busy_ticket = 12, .ssm_slot = true,
                         .n_snapshots = 70};
    for (uint32_t i = 0; i < DEVIO_SEQ_SNAPSHOTS_LISTED; i++)
        s.snapshots[i] = i + 1;
    j = devio_json_seq_info(&s);
    assert_int_equal(json_integer_value(json_object_get(j, "snapshots_held")), 70);
    assert_int_equal(json_array_size(json_object_get(j, "snapshots")), 64);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "snapshots"), 63)), 64);
    s.n_snapshots = 2;
    json_decref(j);
    j = devio_json_seq_info(&s);
    t = json_dumps(j, DEVIO_JSON_FLAGS);
    assert_string_equal(t, "{\"seq\":7,\"len\":90,\"blocks\":6,\"busy\":12,\"ssm_slot\":true,"
                           "\"snapshots_held\":2,\"snapshots\":[1,2],\"parked\":false}");
    free(t);
    json_decref(j);
}

static devio_adapter_record sample_record(void)
{
    devio_adapter_record r = {.rank = 8, .alpha = 16.0f, .scale = 2.0f, .size = 15368,
                              .state = DEVIO_ADAPTER_UNLOADED, .pinned = true,
                              .rows_served = 3, .loaded_ms = 1700000000001,
                              .last_used_ms = 1700000000002};
    devio_adapter_record_set(r.name, sizeof r.name, "sql");
    devio_adapter_record_set(r.path, sizeof r.path, "sql-r8");
    devio_adapter_record_set(r.targets, sizeof r.targets, "q_proj,v_proj");
    devio_adapter_record_set(r.sha256, sizeof r.sha256, "ab12");
    devio_adapter_record_set(r.reason, sizeof r.reason, "evicted");
    return r;
}

static void test_adapter_record_round_trip(void **state)
{
    (void)state;
    devio_adapter_record r = sample_record(), back;
    devio_error err = {0};
    /* The HTTP view carries every field and decodes to the same record. */
    json_t *j = devio_json_adapter_record(&r, DEVIO_ADAPTER_VIEW_RECORD);
    assert_non_null(j);
    assert_int_equal(json_object_size(j), 14);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "unloaded");
    assert_int_equal(json_array_size(json_object_get(j, "targets")), 2);
    assert_int_equal(devio_json_adapter_record_decode(j, &back, &err), DEVIO_OK);
    assert_memory_equal(&r, &back, sizeof r);
    json_decref(j);
    /* The device view leaves the store's fields out; they decode as zero. */
    j = devio_json_adapter_record(&r, DEVIO_ADAPTER_VIEW_DEVICE);
    assert_int_equal(json_object_size(j), 11);
    assert_null(json_object_get(j, "reason"));
    assert_int_equal(devio_json_adapter_record_decode(j, &back, &err), DEVIO_OK);
    assert_int_equal(back.loaded_ms, 0);
    assert_string_equal(back.reason, "");
    assert_string_equal(back.targets, "q_proj,v_proj");
    json_decref(j);
    /* Unknown values are null on the wire and come back as such. */
    r.sha256[0] = '\0';
    r.reason[0] = '\0';
    r.alpha = NAN;
    j = devio_json_adapter_record(&r, DEVIO_ADAPTER_VIEW_RECORD);
    assert_true(json_is_null(json_object_get(j, "sha256")));
    assert_true(json_is_null(json_object_get(j, "reason")));
    assert_true(json_is_null(json_object_get(j, "alpha")));
    assert_int_equal(devio_json_adapter_record_decode(j, &back, &err), DEVIO_OK);
    assert_string_equal(back.sha256, "");
    assert_true(isnan(back.alpha));
    json_decref(j);
    /* Records that are not one. */
    const char *bad[] = {"[]", "{\"name\":\"a\",\"path\":\"p\",\"state\":\"gone\"}",
                         "{\"name\":\"a\",\"state\":\"loaded\"}",
                         "{\"name\":\"a\",\"path\":\"p\",\"state\":\"loaded\",\"rank\":1,"
                         "\"alpha\":1,\"scale\":1,\"targets\":\"q_proj\",\"size\":1,"
                         "\"pinned\":false,\"rows_served\":0}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = parse(bad[i]);
        assert_int_equal(devio_json_adapter_record_decode(j, &back, &err), DEVIO_E_INVALID);
        json_decref(j);
    }
}

static void test_adapter_ack_and_bodies(void **state)
{
    (void)state;
    /* The device's acknowledgement carries the one adapter record. */
    devio_adapter_record rec = {.name = "sql", .path = "sql-r8", .rank = 8, .alpha = 16.0f,
                                .scale = 2.0f, .targets = "q_proj,v_proj", .sha256 = "ab12",
                                .size = 15368, .state = DEVIO_ADAPTER_LOADED, .rows_served = 0};
    devio_adapter_ack ack = {.kind = DEVIO_ADAPTER_CMD_LOAD, .n_adapters = 1, .adapters = &rec,
                             .evicted = "old"};
    json_t *a = devio_json_adapter_ack(ack.adapters, ack.n_adapters, ack.evicted);
    char *ta = json_dumps(a, DEVIO_JSON_FLAGS | JSON_SORT_KEYS);
    assert_string_equal(ta, "{\"adapters\":[{\"alpha\":16.0,\"name\":\"sql\",\"path\":\"sql-r8\","
                            "\"pinned\":false,\"rank\":8,\"rows_served\":0,\"scale\":2.0,"
                            "\"sha256\":\"ab12\",\"size\":15368,\"state\":\"loaded\","
                            "\"targets\":[\"q_proj\",\"v_proj\"]}],\"evicted\":\"old\"}");
    free(ta);
    json_decref(a);
    rec.state = DEVIO_ADAPTER_UNLOADED; /* as the device says it in an unload's ack */
    a = devio_json_adapter_ack(&rec, 1, NULL);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(a, "adapters"), 0), "state")),
                        "unloaded");
    assert_null(json_object_get(a, "evicted"));
    json_decref(a);

    /* The load body, for PUT and for a script's load command alike. */
    devio_adapter_load_body load;
    devio_adapter_cmd cmd;
    devio_error err = {0};
    json_t *j = parse("{\"path\":\"sql-r8\",\"pin\":true}");
    assert_int_equal(devio_json_adapter_load_decode(j, &load, &err), DEVIO_OK);
    assert_string_equal(load.path, "sql-r8");
    assert_true(load.pin);
    json_decref(j);
    j = parse("{\"kind\":\"load\",\"name\":\"sql\",\"path\":\"sql-r8\",\"pin\":true}");
    assert_int_equal(devio_json_adapter_cmd_decode(j, &cmd, &err), DEVIO_OK);
    assert_int_equal(cmd.kind, DEVIO_ADAPTER_CMD_LOAD);
    assert_string_equal(cmd.path, "sql-r8");
    assert_true(cmd.pin);
    json_decref(j);
    const char *bad_put[] = {"{}", "{\"pin\":true}", "{\"path\":5}", "{\"path\":\"\"}",
                             "{\"path\":\"x\",\"pin\":\"yes\"}", "{\"path\":\"x\",\"name\":\"y\"}",
                             "[]", "\"x\""};
    for (size_t i = 0; i < sizeof bad_put / sizeof *bad_put; i++) {
        j = parse(bad_put[i]);
        assert_int_equal(devio_json_adapter_load_decode(j, &load, &err), DEVIO_E_INVALID);
        json_decref(j);
    }
    const char *bad_cmd[] = {"{\"kind\":\"load\",\"name\":\"a\"}", "{\"kind\":\"unload\"}",
                             "{\"kind\":\"merge\",\"name\":\"a\"}",
                             "{\"kind\":\"pin\",\"name\":\"a\",\"pin\":1}"};
    for (size_t i = 0; i < sizeof bad_cmd / sizeof *bad_cmd; i++) {
        j = parse(bad_cmd[i]);
        assert_int_equal(devio_json_adapter_cmd_decode(j, &cmd, &err), DEVIO_E_INVALID);
        json_decref(j);
    }
}

static void test_id_and_await_bodies(void **state)
{
    (void)state;
    uint64_t id = 0;
    int64_t timeout = 0;
    devio_error err = {0};
    json_t *j = parse("{\"ticket\":12}");
    assert_int_equal(devio_json_await_decode(j, &id, &timeout, &err), DEVIO_OK);
    assert_int_equal(id, 12);
    assert_int_equal(timeout, -1);
    json_decref(j);
    j = parse("{\"ticket\":12,\"timeout_ms\":0}");
    assert_int_equal(devio_json_await_decode(j, &id, &timeout, &err), DEVIO_OK);
    assert_int_equal(timeout, 0);
    json_decref(j);
    const char *bad[] = {"{}", "{\"ticket\":-1}", "{\"ticket\":\"t\"}",
                         "{\"ticket\":1,\"timeout_ms\":-5}", "[]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = parse(bad[i]);
        assert_int_equal(devio_json_await_decode(j, &id, &timeout, &err), DEVIO_E_INVALID);
        json_decref(j);
    }
    j = parse("{\"seq\":7}");
    assert_int_equal(devio_json_id_decode(j, "seq", &id, &err), DEVIO_OK);
    assert_int_equal(id, 7);
    assert_int_equal(devio_json_id_decode(j, "ticket", &id, &err), DEVIO_E_INVALID);
    json_decref(j);
}

/* Sample numbers are checked as JSON gives them (doubles) before they are
 * narrowed to float: out of range names the field and the range; in range
 * and not 0 stays not 0. */
static void test_sample_ranges(void **state)
{
    (void)state;
    devio_sample_params p;
    devio_sample_buf pb;
    devio_error err = {0};
    json_t *j = parse("{\"temperature\":1e308}");
    assert_int_equal(devio_json_sample_decode(j, &p, &pb, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "'temperature'"));
    assert_non_null(strstr(err.message, "3.40282347e+38"));
    json_decref(j);
    j = parse("{\"top_p\":1e-300,\"min_p\":1e-300,\"temperature\":1e-40}");
    assert_int_equal(devio_json_sample_decode(j, &p, &pb, &err), DEVIO_OK);
    assert_true(p.top_p == FLT_TRUE_MIN && p.min_p == FLT_TRUE_MIN);
    assert_true(p.temperature > 0.0f && p.temperature < DEVIO_GREEDY_BELOW);
    json_decref(j);
    j = parse("{\"top_p\":0}");
    assert_int_equal(devio_json_sample_decode(j, &p, &pb, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "(0, 1]"));
    json_decref(j);
    j = parse("{\"seed\":-1}");
    assert_int_equal(devio_json_sample_decode(j, &p, &pb, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "[0, 9223372036854775807]"));
    json_decref(j);
    /* seq_busy's ticket travels beside its row. */
    devio_error e = {.status = DEVIO_E_SEQ_BUSY, .message = "busy", .detail_key = "row",
                     .detail_val = 0, .ticket = 12};
    j = devio_json_error(&e);
    json_t *d = json_object_get(json_object_get(j, "error"), "details");
    assert_int_equal(json_object_size(d), 2);
    assert_int_equal(json_integer_value(json_object_get(d, "ticket")), 12);
    json_decref(j);
}

static void test_error_shape(void **state)
{
    (void)state;
    devio_error e = {.status = DEVIO_E_OUT_OF_KV_BLOCKS, .message = "plan needs 4",
                     .detail_key = "needed", .detail_val = 4};
    json_t *j = devio_json_error(&e);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "out_of_kv_blocks");
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(json_object_get(j, "error"), "details"), "needed")),
                     4);
    json_decref(j);
}

/* Run a script text through the in-process target; returns the output (caller frees). */
static char *run_script(devio_device *d, const char *script, int *rc)
{
    FILE *in = fmemopen((void *)script, strlen(script), "r");
    char *out_buf = NULL;
    size_t out_len = 0;
    FILE *out = open_memstream(&out_buf, &out_len);
    devio_script_target t;
    devio_inproc_target(d, &t);
    char why[256];
    *rc = devio_script_run(&t, in, out, why, sizeof why);
    fclose(in);
    fclose(out);
    return out_buf;
}

/* "as" names a binding: a "$" reference there is a malformed line (the
 * reference used to be replaced while its name was still in use: a
 * use-after-free found by tests/fuzz/fuzz_script). */
static void test_script_as_reference(void **state)
{
    (void)state;
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", DEVIO_F32, 3), 0);
    devio_device *d = NULL;
    devio_config cfg = devio_config_default();
    assert_int_equal(devio_open(fx.model, &devio_ref_backend, &cfg, &d, NULL), DEVIO_OK);
    int rc;
    char *out = run_script(d, "{\"op\":\"create\",\"as\":\"b\"}\n"
                              "{\"op\":\"seq\",\"seq\":\"$b\",\"as\":\"$b\"}\n"
                              "{\"op\":\"facts\"}\n",
                           &rc);
    assert_int_equal(rc, -1);
    /* The first line ran; nothing after the malformed one did. */
    assert_non_null(strstr(out, "\"op\":\"create\""));
    assert_null(strstr(out, "\"op\":\"facts\""));
    free(out);
    devio_teardown(d, NULL);
    devio_fixture_free(&fx);
}

static void test_script_runner(void **state)
{
    (void)state;
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", DEVIO_F32, 3), 0);
    const char *script =
        "# comment lines are skipped\n"
        "{\"op\":\"create\",\"as\":\"a\"}\n"
        "{\"op\":\"launch\",\"plan\":{\"rows\":[{\"seq\":\"$a\",\"tokens\":[1,2,3],"
        "\"logits\":\"all\"}]},\"as\":\"t1\"}\n"
        "{\"op\":\"await\",\"ticket\":\"$t1\",\"as\":\"r1\"}\n"
        "{\"op\":\"apply\",\"effect\":{\"kind\":\"sample\",\"logits\":\"$r1.rows[0].logits\","
        "\"row\":2,\"params\":{\"temperature\":0}}}\n"
        "{\"op\":\"apply\",\"effect\":{\"kind\":\"fork\",\"seq\":\"$a\"},\"as\":\"b\"}\n"
        "{\"op\":\"facts\"}\n"
        "{\"op\":\"await\",\"ticket\":\"$t1\"}\n"
        "{\"op\":\"seq\",\"seq\":\"$b\"}\n"
        "{\"op\":\"lora\",\"cmd\":{\"kind\":\"list\"}}\n";
    char *outs[2];
    for (int k = 0; k < 2; k++) {
        devio_device *d = NULL;
        devio_config cfg = devio_config_default();
        cfg.use_worker_thread = k == 0;
        assert_int_equal(devio_open(fx.model, &devio_ref_backend, &cfg, &d, NULL), DEVIO_OK);
        int rc;
        outs[k] = run_script(d, script, &rc);
        assert_int_equal(rc, 0);
        devio_teardown(d, NULL);
    }
    assert_string_equal(outs[0], outs[1]);
    /* ids print as binding names, logits as digests, timings are gone */
    assert_non_null(strstr(outs[0], "{\"op\":\"create\",\"ok\":true,\"result\":{\"seq\":\"a\"}}"));
    assert_non_null(strstr(outs[0], "\"ticket\":\"t1\""));
    assert_non_null(strstr(outs[0], "\"id\":\"r1.rows[0].logits\""));
    assert_non_null(strstr(outs[0], "\"shape\":[3,"));
    assert_non_null(strstr(outs[0], "\"sha256\":\""));
    assert_non_null(strstr(outs[0], "\"seq\":\"b\""));
    /* An attention-only sequence holds no SSM slot and no snapshots. */
    assert_non_null(strstr(outs[0], "\"ssm_slot\":false"));
    assert_non_null(strstr(outs[0], "{\"op\":\"await\",\"ok\":false,\"error\":{\"code\":\"ticket_consumed\"}}"));
    assert_null(strstr(outs[0], "timing"));
    assert_null(strstr(outs[0], "epoch"));
    int lines = 0;
    for (char *p = outs[0]; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 9);
    free(outs[0]);
    free(outs[1]);

    /* A malformed script line is reported with its number. */
    devio_device *d = NULL;
    assert_int_equal(devio_open(fx.model, &devio_ref_backend, NULL, &d, NULL), DEVIO_OK);
    int rc;
    char *o = run_script(d, "{\"op\":\"create\"}\n{\"op\":\"await\",\"ticket\":\"$nope\"}\n", &rc);
    assert_int_equal(rc, -1);
    free(o);
    o = run_script(d, "{\"op\":\"fly\"}\n", &rc);
    assert_int_equal(rc, -1);
    free(o);
    o = run_script(d, "not json\n", &rc);
    assert_int_equal(rc, -1);
    free(o);
    devio_teardown(d, NULL);
    devio_fixture_free(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),     cmocka_unit_test(test_digest_canonicalises_nan),
        cmocka_unit_test(test_plan_decode),        cmocka_unit_test(test_effect_decode),
        cmocka_unit_test(test_plan_run),
        cmocka_unit_test(test_error_shape),        cmocka_unit_test(test_sample_ranges),
        cmocka_unit_test(test_script_runner),      cmocka_unit_test(test_script_as_reference),
        cmocka_unit_test(test_adapter_record_round_trip),
        cmocka_unit_test(test_adapter_ack_and_bodies),
        cmocka_unit_test(test_id_and_await_bodies),
        cmocka_unit_test(test_outcome_encode),     cmocka_unit_test(test_seq_info_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
