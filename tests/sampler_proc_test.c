/* sampler_proc_test.c - step 0b (logit bias, allowed and banned tokens,
 * penalties) and step 1b (top logprobs) of device/sample/sampler.h: against a
 * plain re-statement of the definition on random cases, and at the edges
 * (a mask that leaves one token, one that leaves none, biases of +-inf). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device/devio.h"
#include "device/numerics/numerics.h"
#include "device/sample/sampler.h"

#define V_MAX 300u

/* splitmix64: the cases' source of randomness. */
static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rnd_float(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rnd(s) >> 11) * 0x1p-53);
}

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Step 0's reading of a value. */
static float settle(float x)
{
    return x != x ? -INFINITY : x > FLT_MAX ? FLT_MAX : x;
}

/* Step 0b as sampler.h words it, one rule after another, with no shortcut:
 * counts by a scan of the history per id. Returns false when nothing is left.
 * A repetition penalty of 0 (unset) is off, as 1 is (device/devio.h). */
static bool ref_process(const float *l, uint32_t v, const devio_sample_params *q,
                        const int32_t *history, uint32_t n_history, float *out)
{
    for (uint32_t i = 0; i < v; i++)
        out[i] = settle(l[i]);
    for (uint32_t k = 0; k < q->n_bias; k++)
        out[q->bias_ids[k]] = settle(out[q->bias_ids[k]] + q->bias[k]);
    for (uint32_t i = 0; i < v; i++)
        if (q->allowed && !((q->allowed[i / 32] >> (i % 32)) & 1u))
            out[i] = -INFINITY;
    for (uint32_t k = 0; k < q->n_banned; k++)
        out[q->banned[k]] = -INFINITY;
    bool any = false;
    for (uint32_t i = 0; i < v; i++) {
        uint32_t c = 0;
        for (uint32_t k = 0; k < n_history; k++)
            c += (uint32_t)history[k] == i;
        if (c > 0 && out[i] != -INFINITY) {
            if (q->repetition_penalty != 1.0f && q->repetition_penalty != 0.0f)
                out[i] = settle(out[i] > 0.0f ? out[i] / q->repetition_penalty
                                              : out[i] * q->repetition_penalty);
            if (q->frequency_penalty != 0.0f && out[i] != -INFINITY)
                out[i] = settle(out[i] - q->frequency_penalty * (float)c);
            if (q->presence_penalty != 0.0f && out[i] != -INFINITY)
                out[i] = settle(out[i] - q->presence_penalty);
        }
        any = any || out[i] != -INFINITY;
    }
    return any;
}

/* Step 1's logprob of token t of the raw logits. */
static float ref_logprob(const float *l, uint32_t v, uint32_t t)
{
    static float e[V_MAX];
    float m = -INFINITY;
    for (uint32_t i = 0; i < v; i++)
        m = settle(l[i]) > m ? settle(l[i]) : m;
    for (uint32_t i = 0; i < v; i++)
        e[i] = devio_expf(settle(l[i]) - m);
    return (settle(l[t]) - m) - devio_logf(devio_lane_sum(e, v));
}

/* p's draw (temperature, top_k, top_p, min_p, seed) and no processing. */
static devio_sample_params draw_of(const devio_sample_params *p)
{
    return (devio_sample_params){.temperature = p->temperature, .top_k = p->top_k,
                                 .top_p = p->top_p, .min_p = p->min_p, .seed = p->seed};
}

/* proc's processing with draw's draw. */
static devio_sample_params with_draw(devio_sample_params proc, const devio_sample_params *draw)
{
    proc.temperature = draw->temperature;
    proc.top_k = draw->top_k;
    proc.top_p = draw->top_p;
    proc.min_p = draw->min_p;
    proc.seed = draw->seed;
    return proc;
}

typedef struct proc_case {
    float logits[V_MAX];
    int32_t bias_ids[8], banned[8], history[40];
    float bias[8];
    uint32_t mask[(V_MAX + 31) / 32];
    devio_sample_params p; /* the draw and the processing */
    uint32_t n_history;    /* of history */
} proc_case;

/* A random case over v tokens: some raw -inf and NaN, biases (now and then
 * +-inf), a mask of any density (sometimes one bit, sometimes none), bans,
 * and penalties over a history with repeats. */
static void make_case(uint64_t *r, uint32_t v, proc_case *c)
{
    memset(c, 0, sizeof *c);
    for (uint32_t i = 0; i < v; i++) {
        uint64_t k = rnd(r) % 40;
        c->logits[i] = k == 0 ? -INFINITY : k == 1 ? NAN : rnd_float(r, -8.0f, 8.0f);
    }
    devio_sample_params *q = &c->p; /* the processing; the draw comes last */
    q->repetition_penalty = 1.0f;
    q->n_bias = (uint32_t)(rnd(r) % 9);
    for (uint32_t k = 0; k < q->n_bias; k++) {
        uint64_t kind = rnd(r) % 10;
        c->bias_ids[k] = (int32_t)(rnd(r) % v);
        c->bias[k] = kind == 0 ? INFINITY : kind == 1 ? -INFINITY : rnd_float(r, -20.0f, 20.0f);
    }
    q->bias_ids = c->bias_ids;
    q->bias = c->bias;
    uint64_t mask_kind = rnd(r) % 6;
    if (mask_kind >= 3) {
        for (uint32_t w = 0; w < (v + 31) / 32; w++)
            c->mask[w] = mask_kind == 5 ? 0u : (uint32_t)rnd(r) & (uint32_t)rnd(r);
        if (mask_kind == 5 && rnd(r) % 2) { /* exactly one token allowed */
            uint32_t t = (uint32_t)(rnd(r) % v);
            c->mask[t / 32] = 1u << (t % 32);
        }
        q->allowed = c->mask;
        q->allowed_words = (v + 31) / 32;
    }
    q->n_banned = (uint32_t)(rnd(r) % 5);
    for (uint32_t k = 0; k < q->n_banned; k++)
        c->banned[k] = (int32_t)(rnd(r) % v);
    q->banned = c->banned;
    c->n_history = (uint32_t)(rnd(r) % 41);
    for (uint32_t k = 0; k < c->n_history; k++)
        c->history[k] = (int32_t)(rnd(r) % (v < 24 ? v : 24)); /* repeats */
    if (rnd(r) % 2)
        q->repetition_penalty = rnd_float(r, 0.5f, 2.0f);
    if (rnd(r) % 2)
        q->presence_penalty = rnd_float(r, -2.0f, 2.0f);
    if (rnd(r) % 2)
        q->frequency_penalty = rnd_float(r, -1.0f, 1.0f);
    uint64_t kind = rnd(r) % 4;
    devio_sample_params draw = {.temperature = kind == 0 ? 0.0f : rnd_float(r, 0.2f, 2.0f),
                                .top_k = kind == 2 ? (int32_t)(rnd(r) % 20) : 0,
                                .top_p = kind == 3 ? rnd_float(r, 0.3f, 1.0f) : 1.0f,
                                .min_p = kind == 3 ? rnd_float(r, 0.0f, 0.3f) : 0.0f,
                                .seed = rnd(r)};
    c->p = with_draw(c->p, &draw);
}

/* Sampling with step 0b picks what sampling l'' itself picks, and reports
 * the raw logprob of that token; with no token left, DEVIO_E_INVALID. */
static void test_processing_is_the_definition(void **state)
{
    (void)state;
    uint64_t r = 2024;
    static proc_case c;
    static float want[V_MAX];
    uint32_t refused = 0, one_left = 0;
    for (int n = 0; n < 3000; n++) {
        uint32_t v = 1 + (uint32_t)(rnd(&r) % V_MAX);
        make_case(&r, v, &c);
        devio_sampler *s = NULL;
        assert_int_equal(devio_sampler_create(v, &s), DEVIO_OK);
        bool raw_ok = false;
        for (uint32_t i = 0; i < v; i++)
            raw_ok = raw_ok || settle(c.logits[i]) != -INFINITY;
        bool left = ref_process(c.logits, v, &c.p, c.history, c.n_history, want);
        int32_t tok = -1, tok2 = -1;
        float lp = 0.0f, lp2 = 0.0f;
        uint64_t pos = rnd(&r) % 1000;
        devio_status st =
            devio_sampler_run_ex(s, c.logits, &c.p, c.history, c.n_history, pos, &tok, &lp, NULL);
        if (!raw_ok || !left) {
            assert_int_equal(st, DEVIO_E_INVALID);
            refused++;
        } else {
            assert_int_equal(st, DEVIO_OK);
            devio_sample_params draw = draw_of(&c.p); /* l'' with no processing again */
            assert_int_equal(devio_sampler_run(s, want, &draw, pos, &tok2, &lp2), DEVIO_OK);
            if (tok != tok2)
                fail_msg("case %d: token %d, sampling l'' gives %d", n, tok, tok2);
            assert_int_equal(bits(lp), bits(ref_logprob(c.logits, v, (uint32_t)tok)));
            uint32_t kept = 0;
            for (uint32_t i = 0; i < v; i++)
                kept += want[i] != -INFINITY;
            one_left += kept == 1;
        }
        devio_sampler_free(s);
    }
    /* The cases reach both edges. */
    assert_true(refused > 50);
    assert_true(one_left > 20);
}

/* The top n of the raw log-softmax, ties to the lower id, each value
 * step 1's formula; the sampled token and its logprob as without them. */
static void test_top_logprobs(void **state)
{
    (void)state;
    uint64_t r = 77;
    static float l[V_MAX];
    for (int n = 0; n < 500; n++) {
        uint32_t v = 1 + (uint32_t)(rnd(&r) % V_MAX);
        for (uint32_t i = 0; i < v; i++) /* coarse values: many ties */
            l[i] = rnd(&r) % 25 == 0 ? -INFINITY : (float)(int)(rnd(&r) % 9) - 4.0f;
        l[rnd(&r) % v] = 1.0f;
        uint32_t k = 1 + (uint32_t)(rnd(&r) % DEVIO_TOP_LOGPROBS_MAX);
        if (k > v)
            k = v;
        int32_t ids[DEVIO_TOP_LOGPROBS_MAX];
        float lps[DEVIO_TOP_LOGPROBS_MAX];
        devio_top_logprobs top = {.n = k, .ids = ids, .logprobs = lps};
        devio_sampler *s = NULL;
        assert_int_equal(devio_sampler_create(v, &s), DEVIO_OK);
        devio_sample_params p = {.temperature = 1.0f, .top_p = 1.0f, .seed = (uint64_t)n};
        int32_t tok, tok2;
        float lp, lp2;
        assert_int_equal(devio_sampler_run_ex(s, l, &p, NULL, 0, 9, &tok, &lp, &top), DEVIO_OK);
        assert_int_equal(devio_sampler_run(s, l, &p, 9, &tok2, &lp2), DEVIO_OK);
        assert_int_equal(tok, tok2);
        assert_int_equal(bits(lp), bits(lp2));
        /* Brute force: id i ranks by how many come before it. */
        for (uint32_t a = 0; a < k; a++) {
            uint32_t id = (uint32_t)ids[a], before = 0;
            for (uint32_t j = 0; j < v; j++)
                before += settle(l[j]) > settle(l[id]) || (settle(l[j]) == settle(l[id]) && j < id);
            assert_int_equal(before, a);
            assert_int_equal(bits(lps[a]), bits(ref_logprob(l, v, id)));
        }
        devio_sampler_free(s);
    }
}

/* The edges, by hand: one allowed token always wins; +inf bias wins greedy
 * and -inf never wins; a ban of every token refuses. */
static void test_edges(void **state)
{
    (void)state;
    float l[40];
    for (int i = 0; i < 40; i++)
        l[i] = (float)(i % 7);
    devio_sampler *s = NULL;
    assert_int_equal(devio_sampler_create(40, &s), DEVIO_OK);
    uint32_t mask[2] = {0, 1u << (33 - 32)};
    devio_sample_params q = {.allowed = mask, .allowed_words = 2, .repetition_penalty = 1.0f};
    int32_t tok;
    float lp;
    for (uint64_t seed = 0; seed < 50; seed++) {
        devio_sample_params d = {.temperature = 2.0f, .top_p = 1.0f, .seed = seed};
        devio_sample_params p = with_draw(q, &d);
        assert_int_equal(devio_sampler_run_ex(s, l, &p, NULL, 0, seed, &tok, &lp, NULL),
                         DEVIO_OK);
        assert_int_equal(tok, 33);
    }
    devio_sample_params greedy = {.temperature = 0.0f, .top_p = 1.0f};
    int32_t ids[2] = {3, 13};
    float big[2] = {INFINITY, -INFINITY};
    devio_sample_params bias = {.bias_ids = ids, .bias = big, .n_bias = 2,
                                .repetition_penalty = 1.0f};
    devio_sample_params b = with_draw(bias, &greedy);
    assert_int_equal(devio_sampler_run_ex(s, l, &b, NULL, 0, 0, &tok, &lp, NULL), DEVIO_OK);
    assert_int_equal(tok, 3);
    assert_int_equal(bits(lp), bits(ref_logprob(l, 40, 3))); /* the raw logprob */
    ids[0] = ids[1] = 6; /* l[6] = 6, the first of the largest, banned: then 13 */
    big[0] = 0.0f;
    assert_int_equal(devio_sampler_run_ex(s, l, &b, NULL, 0, 0, &tok, &lp, NULL), DEVIO_OK);
    assert_int_equal(tok, 13);
    uint32_t none[2] = {0, 0};
    q.allowed = none;
    devio_sample_params g = with_draw(q, &greedy);
    assert_int_equal(devio_sampler_run_ex(s, l, &g, NULL, 0, 0, &tok, &lp, NULL),
                     DEVIO_E_INVALID);
    devio_sampler_free(s);
}

/* Inputs the definition does not take are refused, naming the field. */
static void test_checks(void **state)
{
    (void)state;
    devio_error err;
    int32_t bad_id[1] = {40};
    float one[1] = {1.0f}, nan[1] = {NAN};
    int32_t ok_id[1] = {3};
    uint32_t mask[1] = {~0u};
    struct {
        devio_sample_params p;
        const int32_t *history;
        uint32_t n_history;
    } cases[] = {
        {{.bias_ids = bad_id, .bias = one, .n_bias = 1, .repetition_penalty = 1.0f}, NULL, 0},
        {{.bias_ids = ok_id, .bias = nan, .n_bias = 1, .repetition_penalty = 1.0f}, NULL, 0},
        {{.allowed = mask, .allowed_words = 1, .repetition_penalty = 1.0f}, NULL, 0},
        {{.banned = bad_id, .n_banned = 1, .repetition_penalty = 1.0f}, NULL, 0},
        {{.repetition_penalty = 1.0f}, bad_id, 1},
        {{.repetition_penalty = -1.0f}, NULL, 0}, /* 0 is off now: a negative one is refused */
        {{.repetition_penalty = INFINITY}, NULL, 0},
        {{.repetition_penalty = 1.0f, .presence_penalty = NAN}, NULL, 0},
        {{.repetition_penalty = 1.0f, .frequency_penalty = -INFINITY}, NULL, 0},
        {{.n_bias = 2, .repetition_penalty = 1.0f}, NULL, 0},
    };
    const char *words[] = {"logit_bias", "logit_bias", "allowed_tokens", "banned_tokens",
                           "history", "repetition_penalty", "repetition_penalty",
                           "presence_penalty", "frequency_penalty", "no array"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(devio_sample_check_tokens(&cases[i].p, 40, cases[i].history,
                                                   cases[i].n_history, &err),
                         DEVIO_E_INVALID);
        if (!strstr(err.message, words[i]))
            fail_msg("case %zu: '%s' does not name %s", i, err.message, words[i]);
    }
    devio_sample_params off = {.repetition_penalty = 1.0f};
    assert_int_equal(devio_sample_check_tokens(&off, 40, NULL, 0, &err), DEVIO_OK);
    devio_sample_params nothing = {.temperature = 0.0f, .top_p = 1.0f}; /* no processing */
    assert_int_equal(devio_sample_check_tokens(&nothing, 40, NULL, 0, &err), DEVIO_OK);
    /* A repetition penalty of 0 is accepted, as off, even with a history to count. */
    devio_sample_params zero = {.repetition_penalty = 0.0f};
    assert_true(devio_sample_check_tokens(&zero, 40, ok_id, 1, &err) == DEVIO_OK &&
                !devio_sample_penalised(&zero));
    /* Too many top logprobs. */
    devio_sampler *s = NULL;
    assert_int_equal(devio_sampler_create(40, &s), DEVIO_OK);
    float l[40] = {0};
    int32_t ids[DEVIO_TOP_LOGPROBS_MAX + 1], tok;
    float lps[DEVIO_TOP_LOGPROBS_MAX + 1], lp;
    devio_top_logprobs top = {.n = DEVIO_TOP_LOGPROBS_MAX + 1, .ids = ids, .logprobs = lps};
    devio_sample_params p = {.temperature = 0.0f, .top_p = 1.0f};
    assert_int_equal(devio_sampler_run_ex(s, l, &p, NULL, 0, 0, &tok, &lp, &top),
                     DEVIO_E_INVALID);
    devio_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_processing_is_the_definition),
        cmocka_unit_test(test_top_logprobs),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
