/* window_core_test.c - the device core with a sliding window: KV blocks wholly below the window go back to the pool after the step that leaves them behind.
 * long because every case drives the same windowed device through the fixture and the step,
 * fact and truncate helpers at the top, at two block sizes.
 * Drives the real core over the reference backend with the tiny Llama model and the same weights as a Mistral model (sliding_window 8),
 * at block sizes 4 and 16: facts and sequence state, numbers bit for bit against one prefill, fork, truncate, free, a failed step, the batch check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/backend/backend.h"
#include "device/core/kv_pool.h"
#include "device/status.h"
#include "ref/ref_backend.h"
#include "tests/testutil.h"

#define W 8u /* the Mistral model's sliding_window */

typedef struct ctx {
    devio_fixture fx;     /* the tiny Llama model (no window) */
    devio_model *mistral; /* the same weights, MistralForCausalLM, sliding_window W */
    uint32_t vocab;
} ctx;

/* Replace the first `old` in the NUL-terminated text *t with `new`. */
static int text_sub(char **t, const char *old, const char *new)
{
    char *at = strstr(*t, old);
    if (!at)
        return -1;
    size_t pre = (size_t)(at - *t), lo = strlen(old), ln = strlen(new), n = strlen(*t);
    char *out = malloc(n - lo + ln + 1);
    if (!out)
        return -1;
    memcpy(out, *t, pre);
    memcpy(out + pre, new, ln);
    memcpy(out + pre + ln, at + lo, n - pre - lo + 1);
    free(*t);
    *t = out;
    return 0;
}

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    if (!c || devio_fixture_preset(&c->fx, "tiny", DEVIO_F32, 11) != 0)
        return -1;
    c->vocab = c->fx.model->cfg.vocab_size;
    /* The loaded Llama model keeps its own copy of the config; the
     * directory becomes the Mistral model with the same weights. */
    char path[320];
    snprintf(path, sizeof path, "%s/config.json", c->fx.dir);
    size_t n;
    char *text = (char *)devio_read_file(path, &n);
    if (!text || text_sub(&text, "\"LlamaForCausalLM\"", "\"MistralForCausalLM\"") != 0 ||
        text_sub(&text, "\"model_type\": \"llama\",",
                 "\"model_type\": \"mistral\",\n  \"sliding_window\": 8,") != 0 ||
        devio_write_file(path, text, strlen(text)) != 0)
        return -1;
    free(text);
    devio_error err = {0};
    if (devio_model_load(c->fx.dir, &c->mistral, &err) != DEVIO_OK) {
        fprintf(stderr, "load: %s\n", err.message);
        return -1;
    }
    if (c->mistral->cfg.sliding_window != W)
        return -1;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    devio_model_free(c->mistral);
    devio_fixture_free(&c->fx);
    free(c);
    return 0;
}

static devio_config cfg_of(uint32_t bs, uint32_t kv_blocks)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = kv_blocks;
    cfg.block_size = bs;
    cfg.max_seq_len = 128;
    cfg.threads = 1;
    return cfg;
}

static devio_device *open_ops(const devio_model *m, const devio_backend_ops *ops,
                              devio_config cfg)
{
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(m, ops, &cfg, &d, &err), DEVIO_OK);
    return d;
}

static devio_device *open_dev(const devio_model *m, uint32_t bs, uint32_t kv_blocks)
{
    return open_ops(m, &devio_ref_backend, cfg_of(bs, kv_blocks));
}

static uint32_t entries(uint32_t len, uint32_t bs) { return (len + bs - 1) / bs; }

/* The first key the token at position len reads. */
static uint32_t first_key(uint32_t len) { return len + 1 > W ? len + 1 - W : 0; }

/* Blocks a sequence grown by steps alone holds at length len. */
static uint32_t held_at(uint32_t len, uint32_t bs) { return entries(len, bs) - first_key(len) / bs; }

/* One plan of n rows (sequence seq[i], tokens tok[i][0..n_tok[i])), every
 * row with "logits": "all" when out is given; awaited. out[i] receives
 * n_tok[i] * vocab floats. Returns the await's status. */
static devio_status step_rows(devio_device *d, uint32_t n, const uint64_t *seq,
                              const int32_t *const *tok, const uint32_t *n_tok, float **out,
                              devio_error *err)
{
    devio_row rows[4];
    assert_true(n <= 4);
    for (uint32_t i = 0; i < n; i++)
        rows[i] = (devio_row){.seq = seq[i], .tokens = tok[i], .n_tokens = n_tok[i],
                              .logits = out ? DEVIO_LOGITS_ALL : DEVIO_LOGITS_NONE};
    devio_plan plan = {.rows = rows, .n_rows = n};
    uint64_t t;
    assert_int_equal(devio_launch(d, &plan, &t, err), DEVIO_OK);
    devio_step_result r;
    devio_status s = devio_await(d, t, -1, &r, err);
    if (s != DEVIO_OK)
        return s;
    for (uint32_t i = 0; i < n; i++) {
        if (!out)
            continue;
        assert_int_equal(devio_logits_read(d, r.rows[i].logits, 0, n_tok[i], out[i], NULL, err),
                         DEVIO_OK);
        devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = r.rows[i].logits};
        devio_outcome o;
        assert_int_equal(devio_apply(d, &rel, &o, err), DEVIO_OK);
    }
    devio_step_result_free(&r);
    return DEVIO_OK;
}

/* One row; its logits at every position into out (n * vocab floats) when given. */
static void step1(devio_device *d, uint64_t seq, const int32_t *tok, uint32_t n, float *out)
{
    devio_error err = {0};
    const int32_t *t[1] = {tok};
    float *o[1] = {out};
    assert_int_equal(step_rows(d, 1, &seq, t, &n, out ? o : NULL, &err), DEVIO_OK);
}

/* The logits of every position of tok[0..n) computed in one prefill on a
 * fresh device whose pool never runs short. Caller frees. */
static float *one_prefill(const devio_model *m, uint32_t bs, const int32_t *tok, uint32_t n,
                          uint32_t vocab)
{
    devio_device *d = open_dev(m, bs, 256);
    float *out = malloc((size_t)n * vocab * sizeof *out);
    assert_non_null(out);
    step1(d, devio_test_seq(d), tok, n, out);
    devio_teardown(d, NULL);
    return out;
}

static void seq_state(devio_device *d, uint64_t seq, uint32_t len, uint32_t blocks)
{
    devio_seq_info info;
    devio_error err = {0};
    assert_int_equal(devio_seq_info_get(d, seq, &info, &err), DEVIO_OK);
    assert_int_equal(info.len, len);
    assert_int_equal(info.blocks, blocks);
}

static void pool_state(devio_device *d, uint32_t free_blocks, uint32_t shared)
{
    devio_facts f = devio_facts_get(d);
    assert_int_equal(f.blocks_free, free_blocks);
    assert_int_equal(f.blocks_shared, shared);
}

static const uint32_t block_sizes[] = {4, 16};
#define FOR_BS(bs) for (uint32_t bi_ = 0, bs; bi_ < 2 && (bs = block_sizes[bi_], 1); bi_++)

/* ---- release after steps ---------------------------------------------- */

static void test_release_after_steps(void **state)
{
    ctx *c = *state;
    static const uint32_t chunks[] = {5, 1, 1, 1, 9, 1, 2, 1, 13, 1, 1, 17, 3, 1};
    int32_t tok[128];
    devio_test_tokens(tok, 128, 1, c->vocab);
    FOR_BS(bs)
    {
        const uint32_t total = 64;
        devio_device *d = open_dev(c->mistral, bs, total);
        devio_device *full = open_dev(c->fx.model, bs, total); /* no window: keeps everything */
        uint64_t a = devio_test_seq(d), b = devio_test_seq(full);
        uint32_t len = 0;
        for (uint32_t k = 0; k < sizeof chunks / sizeof *chunks; k++) {
            uint32_t n = chunks[k];
            devio_row row = {.seq = a, .tokens = tok + len, .n_tokens = n};
            devio_plan plan = {.rows = &row, .n_rows = 1};
            uint64_t t;
            devio_error err = {0};
            assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
            /* In flight: the step holds every block of its own tokens, and
             * nothing is released yet (the length counts the step). */
            uint32_t reserved = held_at(len, bs) + entries(len + n, bs) - entries(len, bs);
            seq_state(d, a, len + n, reserved);
            pool_state(d, total - reserved, 0);
            devio_step_result r;
            assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
            devio_step_result_free(&r);
            len += n;
            /* Awaited: the blocks below the next token's window are back. */
            seq_state(d, a, len, held_at(len, bs));
            pool_state(d, total - held_at(len, bs), 0);
            /* The same steps on the model without a window keep every block. */
            step1(full, b, tok + len - n, n, NULL);
            seq_state(full, b, len, entries(len, bs));
            pool_state(full, total - entries(len, bs), 0);
        }
        assert_int_equal(len, 57);
        assert_true(held_at(len, bs) < entries(len, bs)); /* something was released */
        assert_true(held_at(len, bs) <= entries(W, bs) + 1);
        devio_teardown(d, NULL);
        devio_teardown(full, NULL);
    }
}

/* ---- numbers ------------------------------------------------------------- */

/* Two sequences decoded in pieces, side by side in every plan, so that the
 * blocks one releases are taken again by the other (or itself) and filled
 * with other keys. Their logits equal one prefill of each, bit for bit. */
static void pieces_equal_prefill(ctx *c, uint32_t bs, uint32_t kv_blocks, uint32_t n,
                                 const int32_t *tp, const int32_t *tq, const float *rp,
                                 const float *rq)
{
    static const uint32_t sizes[] = {1, 3, 1, 1, 7, 2, 1, 5};
    devio_device *d = open_dev(c->mistral, bs, kv_blocks);
    uint64_t seq[2] = {devio_test_seq(d), devio_test_seq(d)};
    float *out[2] = {malloc(7 * c->vocab * sizeof(float)), malloc(7 * c->vocab * sizeof(float))};
    assert_non_null(out[0]);
    assert_non_null(out[1]);
    size_t row = c->vocab * sizeof(float);
    for (uint32_t len = 0, k = 0; len < n; k++) {
        uint32_t m = sizes[k % 8] < n - len ? sizes[k % 8] : n - len;
        const int32_t *tok[2] = {tp + len, tq + len};
        uint32_t nt[2] = {m, m};
        devio_error err = {0};
        assert_int_equal(step_rows(d, 2, seq, tok, nt, out, &err), DEVIO_OK);
        assert_memory_equal(out[0], rp + (size_t)len * c->vocab, m * row);
        assert_memory_equal(out[1], rq + (size_t)len * c->vocab, m * row);
        len += m;
    }
    /* (The counts last: a release of a block still read shows as numbers first.) */
    seq_state(d, seq[0], n, held_at(n, bs));
    seq_state(d, seq[1], n, held_at(n, bs));
    pool_state(d, kv_blocks - 2 * held_at(n, bs), 0);
    free(out[0]);
    free(out[1]);
    devio_teardown(d, NULL);
}

static void test_numbers_pieces_equal_one_prefill(void **state)
{
    ctx *c = *state;
    enum { N = 96 };
    int32_t tp[N], tq[N];
    devio_test_tokens(tp, N, 2, c->vocab);
    devio_test_tokens(tq, N, 5, c->vocab);
    FOR_BS(bs)
    {
        float *rp = one_prefill(c->mistral, bs, tp, N, c->vocab);
        float *rq = one_prefill(c->mistral, bs, tq, N, c->vocab);
        /* The window is in force: below W the Mistral model computes what
         * full attention does, from W on it differs. */
        float *fp = one_prefill(c->fx.model, bs, tp, N, c->vocab);
        size_t row = c->vocab * sizeof(float);
        assert_memory_equal(rp, fp, W * row);
        assert_memory_not_equal(rp + (size_t)W * c->vocab, fp + (size_t)W * c->vocab, row);
        assert_memory_not_equal(rp + (size_t)(N - 1) * c->vocab, fp + (size_t)(N - 1) * c->vocab,
                                row);
        /* A pool too small for the two sequences unless released blocks are
         * taken again (each alone would need N / bs), and a pool so large
         * that they never are. */
        uint32_t tight = bs == 4 ? 12 : 6;
        assert_true(tight < 2 * entries(N, bs));
        pieces_equal_prefill(c, bs, tight, N, tp, tq, rp, rq);
        pieces_equal_prefill(c, bs, 256, N, tp, tq, rp, rq);
        free(rp), free(rq), free(fp);
    }
}

/* ---- a prefill longer than the window in one step ------------------------ */

static void test_long_prefill_one_step(void **state)
{
    ctx *c = *state;
    enum { N = 40 };
    int32_t tok[N];
    devio_test_tokens(tok, N, 3, c->vocab);
    size_t row = c->vocab * sizeof(float);
    FOR_BS(bs)
    {
        uint32_t need = entries(N, bs);
        /* One block short: the step needs a block for every one of its
         * tokens' positions, window or not. */
        devio_device *d = open_dev(c->mistral, bs, need - 1);
        uint64_t a = devio_test_seq(d);
        devio_row r0 = {.seq = a, .tokens = tok, .n_tokens = N, .logits = DEVIO_LOGITS_ALL};
        devio_plan plan = {.rows = &r0, .n_rows = 1};
        uint64_t t;
        devio_error err = {0};
        assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_E_OUT_OF_KV_BLOCKS);
        assert_int_equal(err.detail_val, need);
        pool_state(d, need - 1, 0);
        devio_teardown(d, NULL);

        d = open_dev(c->mistral, bs, need);
        a = devio_test_seq(d);
        r0.seq = a;
        assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
        pool_state(d, 0, 0);
        devio_step_result r;
        assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
        seq_state(d, a, N, held_at(N, bs));
        pool_state(d, need - held_at(N, bs), 0);
        float *one = malloc((size_t)N * row);
        assert_non_null(one);
        assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, N, one, NULL, &err), DEVIO_OK);
        devio_step_result_free(&r);
        devio_effect fr = {.kind = DEVIO_EFFECT_FREE, .seq = a};
        devio_outcome o;
        assert_int_equal(devio_apply(d, &fr, &o, &err), DEVIO_OK);
        assert_int_equal(o.freed_blocks, held_at(N, bs));
        pool_state(d, need, 0);
        /* Decoded one token at a time in the same pool: the same numbers. */
        uint64_t b = devio_test_seq(d);
        float *lg = malloc(row);
        assert_non_null(lg);
        for (uint32_t i = 0; i < N; i++) {
            step1(d, b, tok + i, 1, lg);
            assert_memory_equal(lg, one + (size_t)i * c->vocab, row);
        }
        free(lg), free(one);
        devio_teardown(d, NULL);
    }
}

/* ---- fork --------------------------------------------------------------- */

static void apply_ok(devio_device *d, devio_effect e, devio_outcome *o)
{
    devio_error err = {0};
    assert_int_equal(devio_apply(d, &e, o, &err), DEVIO_OK);
}

static void test_fork_shares_live_blocks_and_both_release(void **state)
{
    ctx *c = *state;
    int32_t tok[64], ta[16], tb[16];
    devio_test_tokens(tok, 64, 4, c->vocab);
    devio_test_tokens(ta, 16, 6, c->vocab);
    devio_test_tokens(tb, 16, 7, c->vocab);
    size_t row = c->vocab * sizeof(float);
    const uint32_t T = 64;
    devio_outcome o;
    float *la = malloc(16 * row), *lb = malloc(16 * row);
    assert_non_null(la);
    assert_non_null(lb);

    /* Block size 4: the parent at 14 holds blocks 1..3 (0 is released). */
    {
        devio_device *d = open_dev(c->mistral, 4, T);
        uint64_t a = devio_test_seq(d);
        step1(d, a, tok, 14, NULL);
        seq_state(d, a, 14, 3);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o);
        uint64_t b = o.seq;
        assert_int_equal(o.shared_blocks, 3); /* the held ones, not the released one */
        seq_state(d, b, 14, 3);
        pool_state(d, T - 3, 3);
        /* a writes into the shared partial block 3: a copy, and block 4;
         * then releases block 1, which b still holds. */
        step1(d, a, ta, 4, la);
        seq_state(d, a, 18, 3);
        pool_state(d, T - 5, 1);
        /* b's block 3 is its own now: no copy, block 4; block 1 freed. */
        step1(d, b, tb, 4, lb);
        seq_state(d, b, 18, 3);
        pool_state(d, T - 5, 1);
        /* Both pass block 2 (positions 8..11): a lets go, then b frees it. */
        step1(d, a, ta + 4, 2, la + 4 * c->vocab);
        seq_state(d, a, 20, 2);
        pool_state(d, T - 5, 0);
        step1(d, b, tb + 4, 2, lb + 4 * c->vocab);
        seq_state(d, b, 20, 2);
        pool_state(d, T - 4, 0);
        /* A fork of a fork inherits the released entries too. */
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = b}, &o);
        uint64_t e = o.seq;
        assert_int_equal(o.shared_blocks, 2);
        seq_state(d, e, 20, 2);
        pool_state(d, T - 4, 2);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = a}, &o);
        assert_int_equal(o.freed_blocks, 2);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = b}, &o);
        assert_int_equal(o.freed_blocks, 0); /* e still holds them */
        pool_state(d, T - 2, 0);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = e}, &o);
        assert_int_equal(o.freed_blocks, 2);
        pool_state(d, T, 0);
        devio_teardown(d, NULL);
    }
    /* The continuations are those of fresh sequences. */
    {
        int32_t pa[20], pb[20];
        memcpy(pa, tok, 14 * sizeof *tok);
        memcpy(pb, tok, 14 * sizeof *tok);
        memcpy(pa + 14, ta, 6 * sizeof *ta);
        memcpy(pb + 14, tb, 6 * sizeof *tb);
        float *ra = one_prefill(c->mistral, 4, pa, 20, c->vocab);
        float *rb = one_prefill(c->mistral, 4, pb, 20, c->vocab);
        assert_memory_equal(la, ra + 14 * c->vocab, 6 * row);
        assert_memory_equal(lb, rb + 14 * c->vocab, 6 * row);
        free(ra), free(rb);
    }

    /* Block size 16: the parent at 20 shares block 0 (full) and block 1
     * (partial); each side passes block 0 after 8 more tokens. */
    {
        devio_device *d = open_dev(c->mistral, 16, T);
        uint64_t a = devio_test_seq(d);
        step1(d, a, tok, 20, NULL);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o);
        uint64_t b = o.seq;
        assert_int_equal(o.shared_blocks, 2);
        pool_state(d, T - 2, 2);
        step1(d, a, ta, 8, la); /* copy of block 1; block 0 let go */
        seq_state(d, a, 28, 1);
        pool_state(d, T - 3, 0);
        step1(d, b, tb, 8, lb); /* block 0 freed */
        seq_state(d, b, 28, 1);
        pool_state(d, T - 2, 0);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = a}, &o);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = b}, &o);
        pool_state(d, T, 0);
        devio_teardown(d, NULL);
        int32_t pa[28], pb[28];
        memcpy(pa, tok, 20 * sizeof *tok);
        memcpy(pb, tok, 20 * sizeof *tok);
        memcpy(pa + 20, ta, 8 * sizeof *ta);
        memcpy(pb + 20, tb, 8 * sizeof *tb);
        float *ra = one_prefill(c->mistral, 16, pa, 28, c->vocab);
        float *rb = one_prefill(c->mistral, 16, pb, 28, c->vocab);
        assert_memory_equal(la, ra + 20 * c->vocab, 8 * row);
        assert_memory_equal(lb, rb + 20 * c->vocab, 8 * row);
        free(ra), free(rb);
    }
    free(la), free(lb);
}

/* ---- truncate ------------------------------------------------------------- */

static void test_truncate_into_released_region_refused(void **state)
{
    ctx *c = *state;
    int32_t tok[64], more[8];
    devio_test_tokens(tok, 64, 8, c->vocab);
    devio_test_tokens(more, 8, 9, c->vocab);
    size_t row = c->vocab * sizeof(float);
    const uint32_t T = 64;
    FOR_BS(bs)
    {
        uint32_t L = bs == 4 ? 22 : 44;
        uint32_t released = first_key(L) / bs * bs; /* positions [0, released) */
        uint32_t earliest = released + W - 1;
        assert_true(released > 0 && earliest < L);
        devio_device *d = open_dev(c->mistral, bs, T);
        uint64_t a = devio_test_seq(d);
        step1(d, a, tok, L, NULL);
        devio_facts f0 = devio_facts_get(d);
        devio_outcome o;
        devio_error err = {0};
        uint32_t refused[] = {earliest - 1, released, 1, W - 1};
        for (uint32_t i = 0; i < sizeof refused / sizeof *refused; i++) {
            devio_effect tr = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = refused[i]};
            memset(&err, 0, sizeof err);
            assert_int_equal(devio_apply(d, &tr, &o, &err), DEVIO_E_INVALID);
            assert_string_equal(err.detail_key, "len");
            assert_int_equal(err.detail_val, earliest);
            assert_non_null(strstr(err.message, "released"));
            /* Nothing changed. */
            seq_state(d, a, L, held_at(L, bs));
            devio_facts f = devio_facts_get(d);
            assert_int_equal(f.blocks_free, f0.blocks_free);
            assert_int_equal(f.blocks_shared, f0.blocks_shared);
        }
        /* Within the window: to the current length, then to the earliest. */
        devio_effect tr = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = L};
        apply_ok(d, tr, &o);
        assert_int_equal(o.freed_blocks, 0);
        tr.len = earliest;
        apply_ok(d, tr, &o);
        assert_int_equal(o.len, earliest);
        assert_int_equal(o.freed_blocks, entries(L, bs) - entries(earliest, bs));
        seq_state(d, a, earliest, entries(earliest, bs) - released / bs);
        pool_state(d, T - (entries(earliest, bs) - released / bs), 0);
        /* The next tokens compute what a fresh sequence of the same tokens does. */
        int32_t all[64];
        memcpy(all, tok, earliest * sizeof *tok);
        memcpy(all + earliest, more, 8 * sizeof *more);
        float *lg = malloc(8 * row);
        assert_non_null(lg);
        step1(d, a, more, 8, lg);
        float *ref = one_prefill(c->mistral, bs, all, earliest + 8, c->vocab);
        assert_memory_equal(lg, ref + (size_t)earliest * c->vocab, 8 * row);
        seq_state(d, a, earliest + 8, held_at(earliest + 8, bs));
        /* Truncate to 0 reads no key: allowed, it gives back every block
         * and the table starts over (no released entry left behind). */
        tr.len = 0;
        apply_ok(d, tr, &o);
        assert_int_equal(o.freed_blocks, held_at(earliest + 8, bs));
        seq_state(d, a, 0, 0);
        pool_state(d, T, 0);
        float *again = malloc((size_t)(earliest + 8) * row);
        assert_non_null(again);
        step1(d, a, all, earliest + 8, again);
        assert_memory_equal(again, ref, (size_t)(earliest + 8) * row);
        free(again), free(ref), free(lg);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = a}, &o);
        pool_state(d, T, 0);
        devio_teardown(d, NULL);
    }
}

static void test_truncate_within_window(void **state)
{
    ctx *c = *state;
    int32_t tok[64];
    devio_test_tokens(tok, 64, 10, c->vocab);
    size_t row = c->vocab * sizeof(float);
    FOR_BS(bs)
    {
        devio_device *d = open_dev(c->mistral, bs, 64);
        /* Shorter than the window: nothing released, any length. */
        uint64_t a = devio_test_seq(d);
        step1(d, a, tok, W, NULL);
        seq_state(d, a, W, entries(W, bs));
        devio_outcome o;
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = a, .len = 1}, &o);
        seq_state(d, a, 1, 1);
        /* Longer: every length whose next token reads only held keys. */
        uint64_t b = devio_test_seq(d);
        uint32_t L = 45;
        step1(d, b, tok, L, NULL);
        uint32_t earliest = first_key(L) / bs * bs + W - 1;
        for (uint32_t len = L; len >= earliest && len > 0; len--) {
            apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = b, .len = len}, &o);
            seq_state(d, b, len, entries(len, bs) - first_key(L) / bs);
        }
        float *lg = malloc(row);
        assert_non_null(lg);
        step1(d, b, tok + earliest, 1, lg);
        float *ref = one_prefill(c->mistral, bs, tok, earliest + 1, c->vocab);
        assert_memory_equal(lg, ref + (size_t)earliest * c->vocab, row);
        free(lg), free(ref);
        devio_teardown(d, NULL);
    }
}

/* ---- depth 2 and free ------------------------------------------------------ */

static void test_depth2_release_at_await_and_free_all(void **state)
{
    ctx *c = *state;
    int32_t tok[64];
    devio_test_tokens(tok, 64, 12, c->vocab);
    FOR_BS(bs)
    {
        const uint32_t T = 64;
        devio_device *d = open_dev(c->mistral, bs, T);
        uint64_t a = devio_test_seq(d), b = devio_test_seq(d);
        devio_row ra = {.seq = a, .tokens = tok, .n_tokens = 30};
        devio_row rb = {.seq = b, .tokens = tok + 1, .n_tokens = 33};
        devio_plan pa = {.rows = &ra, .n_rows = 1}, pb = {.rows = &rb, .n_rows = 1};
        uint64_t ta, tb;
        devio_error err = {0};
        assert_int_equal(devio_launch(d, &pa, &ta, &err), DEVIO_OK);
        assert_int_equal(devio_launch(d, &pb, &tb, &err), DEVIO_OK);
        pool_state(d, T - entries(30, bs) - entries(33, bs), 0);
        devio_step_result r;
        /* Awaited out of order: each ticket gives back its own row's blocks. */
        assert_int_equal(devio_await(d, tb, -1, &r, &err), DEVIO_OK);
        devio_step_result_free(&r);
        pool_state(d, T - entries(30, bs) - held_at(33, bs), 0);
        seq_state(d, a, 30, entries(30, bs));
        assert_int_equal(devio_await(d, ta, -1, &r, &err), DEVIO_OK);
        devio_step_result_free(&r);
        pool_state(d, T - held_at(30, bs) - held_at(33, bs), 0);
        /* Forks, more steps, a truncate: free returns every block. */
        devio_outcome o;
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o);
        uint64_t f = o.seq;
        step1(d, f, tok + 2, 5, NULL);
        step1(d, a, tok + 3, 9, NULL);
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_TRUNCATE, .seq = b, .len = 32}, &o);
        uint64_t ids[] = {a, b, f};
        for (uint32_t i = 0; i < 3; i++)
            apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FREE, .seq = ids[i]}, &o);
        pool_state(d, T, 0);
        devio_teardown(d, NULL);
    }
}

/* ---- a failed step ------------------------------------------------------- */

static bool fail_next;

static devio_status failing_wait(void *st, const devio_batch *b, devio_error *err)
{
    devio_status s = devio_ref_backend.wait(st, b, err);
    if (s == DEVIO_OK && fail_next) {
        fail_next = false;
        return devio_fail(err, DEVIO_E_DEVICE, "injected failure");
    }
    return s;
}

static void test_failed_step_undone_exactly(void **state)
{
    ctx *c = *state;
    int32_t tok[64];
    devio_test_tokens(tok, 64, 13, c->vocab);
    devio_backend_ops ops = devio_ref_backend;
    ops.wait = failing_wait;
    size_t row = c->vocab * sizeof(float);
    FOR_BS(bs)
    {
        const uint32_t T = 32;
        devio_device *d = open_ops(c->mistral, &ops, cfg_of(bs, T));
        uint64_t a = devio_test_seq(d);
        step1(d, a, tok, 22, NULL);
        devio_outcome o;
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o);
        uint64_t b = o.seq;
        devio_facts f0 = devio_facts_get(d);
        /* A step that would release blocks (and copy the shared partial
         * one) fails: it is undone exactly, nothing is released. */
        fail_next = true;
        devio_error err = {0};
        const int32_t *tk[1] = {tok + 22};
        uint32_t n = 9;
        assert_int_equal(step_rows(d, 1, &a, tk, &n, NULL, &err), DEVIO_E_DEVICE);
        seq_state(d, a, 22, held_at(22, bs));
        seq_state(d, b, 22, held_at(22, bs));
        devio_facts f = devio_facts_get(d);
        assert_int_equal(f.blocks_free, f0.blocks_free);
        assert_int_equal(f.blocks_shared, f0.blocks_shared);
        /* Run again it succeeds and releases. */
        float *lg = malloc(9 * row);
        assert_non_null(lg);
        step1(d, a, tok + 22, 9, lg);
        seq_state(d, a, 31, held_at(31, bs));
        float *ref = one_prefill(c->mistral, bs, tok, 31, c->vocab);
        assert_memory_equal(lg, ref + 22 * c->vocab, 9 * row);
        free(lg), free(ref);
        devio_teardown(d, NULL);
    }
}

/* A failed step undoes its copy-on-write only while the shared block is the
 * one it left: here the other holder releases that block below its window
 * and a third sequence takes it before the failure is awaited. */
static void test_failed_cow_after_shared_block_released(void **state)
{
    ctx *c = *state;
    int32_t tok[64], tb[64], tc[4];
    devio_test_tokens(tok, 64, 14, c->vocab);
    devio_test_tokens(tb, 64, 15, c->vocab);
    devio_test_tokens(tc, 4, 16, c->vocab);
    devio_backend_ops ops = devio_ref_backend;
    ops.wait = failing_wait;
    size_t row = c->vocab * sizeof(float);
    FOR_BS(bs)
    {
        const uint32_t T = 64;
        uint32_t L0 = bs == 4 ? 14 : 20;      /* the last block is partial */
        uint32_t grow = entries(L0, bs) * bs + W - 1 - L0; /* b passes that block */
        devio_device *d = open_ops(c->mistral, &ops, cfg_of(bs, T));
        uint64_t a = devio_test_seq(d);
        step1(d, a, tok, L0, NULL);
        devio_outcome o;
        apply_ok(d, (devio_effect){.kind = DEVIO_EFFECT_FORK, .seq = a}, &o);
        uint64_t b = o.seq;
        devio_row ra = {.seq = a, .tokens = tok + L0, .n_tokens = 1};
        devio_row rb = {.seq = b, .tokens = tb, .n_tokens = grow};
        devio_plan pa = {.rows = &ra, .n_rows = 1}, pb = {.rows = &rb, .n_rows = 1};
        uint64_t ta, tkb;
        devio_error err = {0};
        fail_next = true; /* the first step to run: a's, which copied the shared block */
        assert_int_equal(devio_launch(d, &pa, &ta, &err), DEVIO_OK);
        assert_int_equal(devio_launch(d, &pb, &tkb, &err), DEVIO_OK);
        devio_step_result r;
        assert_int_equal(devio_await(d, tkb, -1, &r, &err), DEVIO_OK);
        devio_step_result_free(&r);
        /* b let go of the block a's step copied; c takes it and writes it. */
        uint64_t cs = devio_test_seq(d);
        float *lc = malloc(3 * row);
        assert_non_null(lc);
        step1(d, cs, tc, 3, lc);
        assert_int_equal(devio_await(d, ta, -1, &r, &err), DEVIO_E_DEVICE);
        /* a keeps its copy: it shares nothing with c. */
        seq_state(d, a, L0, held_at(L0, bs));
        pool_state(d, T - held_at(L0, bs) - held_at(L0 + grow, bs) - 1, 0);
        float *la = malloc(row);
        assert_non_null(la);
        step1(d, a, tok + L0, 1, la);
        float *ra_ = one_prefill(c->mistral, bs, tok, L0 + 1, c->vocab);
        assert_memory_equal(la, ra_ + (size_t)L0 * c->vocab, row);
        float *rc = one_prefill(c->mistral, bs, tc, 3, c->vocab);
        assert_memory_equal(lc, rc, 3 * row);
        free(la), free(lc), free(ra_), free(rc);
        devio_teardown(d, NULL);
    }
}

/* ---- the batch check ------------------------------------------------------- */

static void test_batch_check_accepts_released_only_below_window(void **state)
{
    (void)state;
    devio_model_shape shape = {.vocab = 256, .window = W};
    devio_backend_config cfg = {.kv_blocks = 16, .block_size = 4, .max_batch_tokens = 8,
                                .max_rows = 2, .max_seq_len = 64, .logits_rows = 4,
                                .shape = &shape};
    uint32_t blocks[6] = {DEVIO_KV_BLOCK_RELEASED, DEVIO_KV_BLOCK_RELEASED,
                          DEVIO_KV_BLOCK_RELEASED, 3, 4, 5};
    int32_t tokens[1] = {7};
    uint32_t pos[1] = {20}, trow[1] = {0};
    devio_batch_row br = {.pos0 = 20, .n_tokens = 1, .tok_start = 0, .blocks = blocks,
                          .adapter = -1, .ssm_slot = -1};
    devio_batch b = {.n_rows = 1, .rows = &br, .n_tokens = 1, .tokens = tokens, .tok_pos = pos,
                     .tok_row = trow};
    devio_error err = {0};
    /* The token at 20 reads keys 13..20: blocks 0..2 (positions 0..11) may be released. */
    assert_int_equal(devio_batch_check(&cfg, &b, &err), DEVIO_OK);
    /* Block 3 (12..15) holds key 13: not released. */
    blocks[3] = DEVIO_KV_BLOCK_RELEASED;
    assert_int_equal(devio_batch_check(&cfg, &b, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "released"));
    blocks[3] = 3;
    /* At 19 the first key is 12 (block 3 ends at 15): still fine; at 18, key 11 is in block 2. */
    pos[0] = br.pos0 = 19;
    assert_int_equal(devio_batch_check(&cfg, &b, &err), DEVIO_OK);
    pos[0] = br.pos0 = 18;
    assert_int_equal(devio_batch_check(&cfg, &b, &err), DEVIO_E_INVALID);
    /* Without a window every key is read: no entry may be released. */
    pos[0] = br.pos0 = 20;
    shape.window = 0;
    assert_int_equal(devio_batch_check(&cfg, &b, &err), DEVIO_E_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_after_steps),
        cmocka_unit_test(test_numbers_pieces_equal_one_prefill),
        cmocka_unit_test(test_long_prefill_one_step),
        cmocka_unit_test(test_fork_shares_live_blocks_and_both_release),
        cmocka_unit_test(test_truncate_into_released_region_refused),
        cmocka_unit_test(test_truncate_within_window),
        cmocka_unit_test(test_depth2_release_at_await_and_free_all),
        cmocka_unit_test(test_failed_step_undone_exactly),
        cmocka_unit_test(test_failed_cow_after_shared_block_released),
        cmocka_unit_test(test_batch_check_accepts_released_only_below_window),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
