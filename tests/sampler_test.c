/* sampler_test.c - checks the sampler against sampler.h's definition: Philox
 * known answers, masks, distributions, logprobs. libm here is only a double oracle.
 * long because it checks one module against its whole definition, every part through the same double oracle. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/devio.h"
#include "device/numerics/numerics.h"
#include "device/sample/sampler.h"

/* ------------------------------------------------------------------ */
/* Test fixtures                                                       */

/* splitmix64: the tests' own source of logits and seeds. */
static uint64_t mix_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi), quantised to steps of `q` when q > 0 (to force ties). */
static float mix_float(uint64_t *state, float lo, float hi, float q)
{
    double u = (double)(mix_next(state) >> 11) * 0x1p-53;
    double v = lo + (hi - lo) * u;
    if (q > 0.0f)
        v = floor(v / q) * q;
    return (float)v;
}

static devio_sample_params params(float t, int32_t k, float top_p, float min_p, uint64_t seed)
{
    devio_sample_params p = {.temperature = t, .top_k = k, .top_p = top_p,
                             .min_p = min_p, .seed = seed};
    return p;
}

static devio_sampler *make_sampler(uint32_t vocab)
{
    devio_sampler *s = NULL;
    assert_int_equal(devio_sampler_create(vocab, &s), DEVIO_OK);
    assert_non_null(s);
    return s;
}

static int32_t draw(devio_sampler *s, const float *logits, devio_sample_params p,
                    uint64_t pos, float *lp_out)
{
    int32_t tok = -1;
    float lp = 1.0f;
    assert_int_equal(devio_sampler_run(s, logits, &p, pos, &tok, &lp), DEVIO_OK);
    if (lp_out)
        *lp_out = lp;
    return tok;
}

/* Double-precision softmax of logits / t over the ids with mask[i] (NULL: all). */
static void softmax_d(const float *l, uint32_t v, double t, const bool *mask, double *out)
{
    double m = -INFINITY;
    for (uint32_t i = 0; i < v; i++)
        if ((!mask || mask[i]) && l[i] / t > m)
            m = l[i] / t;
    double z = 0.0;
    for (uint32_t i = 0; i < v; i++) {
        out[i] = (!mask || mask[i]) ? exp(l[i] / t - m) : 0.0;
        z += out[i];
    }
    for (uint32_t i = 0; i < v; i++)
        out[i] /= z;
}

/* ------------------------------------------------------------------ */
/* A plain transcription of the definition in sampler.h: full sorts, one
 * Philox call per token, no skipping. The sampler must agree with it bit for
 * bit; the two share only numerics.h and the (known-answer checked) Philox. */

typedef struct keyed {
    float key;
    uint32_t id;
} keyed;

static int keyed_cmp(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->key > y->key)
        return -1;
    if (x->key < y->key)
        return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static float ref_clean(float x)
{
    if (isnan(x))
        return -INFINITY;
    if (x == INFINITY)
        return FLT_MAX;
    return x;
}

static int32_t ref_sample(const float *logits, uint32_t v, const devio_sample_params *p,
                          uint64_t pos, float *logprob)
{
    float *l = malloc(v * sizeof *l), *a = malloc(v * sizeof *a);
    float *z = malloc(v * sizeof *z), *e = malloc(v * sizeof *e);
    bool *in = malloc(v * sizeof *in);
    keyed *kk = malloc(v * sizeof *kk);
    assert_true(l && a && z && e && in && kk);

    float m = -INFINITY;
    for (uint32_t i = 0; i < v; i++) {
        l[i] = ref_clean(logits[i]);
        if (l[i] > m)
            m = l[i];
    }
    for (uint32_t i = 0; i < v; i++)
        a[i] = devio_expf(l[i] - m);
    float sum_a = devio_lane_sum(a, v);

    int32_t tok = -1;
    if (p->temperature == 0.0f) {
        for (uint32_t i = 0; i < v; i++)
            if (tok < 0 || l[i] > l[tok])
                tok = (int32_t)i;
        goto done;
    }
    for (uint32_t i = 0; i < v; i++) {
        if (l[i] == -INFINITY) {
            z[i] = -INFINITY;
            continue;
        }
        float q = l[i] / p->temperature;
        z[i] = q == INFINITY ? FLT_MAX : q == -INFINITY ? -FLT_MAX : q;
    }
    for (uint32_t i = 0; i < v; i++)
        in[i] = true;
    if (p->top_k > 0 && (uint32_t)p->top_k < v) {
        for (uint32_t i = 0; i < v; i++)
            kk[i] = (keyed){z[i], i};
        qsort(kk, v, sizeof *kk, keyed_cmp);
        for (uint32_t j = 0; j < v; j++)
            in[kk[j].id] = j < (uint32_t)p->top_k;
    }
    if (p->top_p < 1.0f || p->min_p > 0.0f) {
        float zm = -INFINITY;
        for (uint32_t i = 0; i < v; i++)
            if (in[i] && z[i] > zm)
                zm = z[i];
        for (uint32_t i = 0; i < v; i++)
            e[i] = in[i] ? devio_expf(z[i] - zm) : 0.0f;
        float zs = devio_lane_sum(e, v);
        for (uint32_t i = 0; i < v; i++)
            e[i] = e[i] / zs;
        if (p->top_p < 1.0f) {
            uint32_t n = 0;
            for (uint32_t i = 0; i < v; i++)
                if (in[i])
                    kk[n++] = (keyed){e[i], i};
            qsort(kk, n, sizeof *kk, keyed_cmp);
            float c = 0.0f;
            uint32_t cut = n;
            for (uint32_t j = 0; j < n; j++) {
                c = c + kk[j].key;
                if (c >= p->top_p) {
                    cut = j + 1;
                    break;
                }
            }
            for (uint32_t j = cut; j < n; j++)
                in[kk[j].id] = false;
        }
        if (p->min_p > 0.0f) {
            float pm = 0.0f;
            for (uint32_t i = 0; i < v; i++)
                if (in[i] && e[i] > pm)
                    pm = e[i];
            float thr = p->min_p * pm;
            for (uint32_t i = 0; i < v; i++)
                if (in[i] && e[i] < thr)
                    in[i] = false;
        }
    }
    uint32_t key[2] = {(uint32_t)p->seed, (uint32_t)(p->seed >> 32)};
    float best = 0.0f;
    for (uint32_t i = 0; i < v; i++) {
        if (!in[i])
            continue;
        uint32_t ctr[4] = {i / 4, 0, (uint32_t)pos, (uint32_t)(pos >> 32)}, out[4];
        devio_philox4x32_10(ctr, key, out);
        float u = ((float)(out[i % 4] >> 9) + 0.5f) * 0x1p-23f;
        float g = -devio_logf(-devio_logf(u));
        float val = z[i] + g;
        if (tok < 0 || val > best) {
            best = val;
            tok = (int32_t)i;
        }
    }
done:
    assert_true(tok >= 0 && (uint32_t)tok < v);
    *logprob = (l[tok] - m) - devio_logf(sum_a);
    free(l);
    free(a);
    free(z);
    free(e);
    free(in);
    free(kk);
    return tok;
}

/* ------------------------------------------------------------------ */
/* Philox                                                              */

static void test_philox_known_answers(void **state)
{
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        uint32_t out[4] = {0};
        devio_philox4x32_10(kat[k].ctr, kat[k].key, out);
        for (int w = 0; w < 4; w++)
            assert_int_equal(out[w], kat[k].out[w]);
    }
}

/* Every u the definition can produce (2^23 of them) gives a finite g, and
 * never more than the cap the sampler uses to skip tokens for the random
 * words that map to it; the caps are also tight (within 2^-9 of the largest
 * g they cover), or the skipping would be wasted. */
static void test_gumbel_caps_exhaustive(void **state)
{
    (void)state;
    devio_sampler *s = make_sampler(1);
    static float range_max[512];
    for (int b = 0; b < 512; b++)
        range_max[b] = -INFINITY;
    float gmax = -INFINITY, gmin = INFINITY;
    for (uint32_t k = 0; k < (1u << 23); k++) {
        uint32_t r = k << 9; /* the low 9 bits of r do not reach u */
        float u = (float)(2u * k + 1u) * 0x1p-24f;
        float nl = -devio_logf(u);
        assert_true(nl > 0.0f);
        float g = -devio_logf(nl);
        assert_true(isfinite(g));
        float cap = devio_sampler_gumbel_cap(s, r);
        if (!(g <= cap))
            fail_msg("r=0x%08x: g=%.9g above its cap %.9g", r, (double)g, (double)cap);
        /* The same range as the sampler's table: top byte, then the next. */
        int b = (r >> 24) != 0xFFu ? (int)(r >> 24) : 256 + (int)((r >> 16) & 0xFFu);
        if (g > range_max[b])
            range_max[b] = g;
        gmax = g > gmax ? g : gmax;
        gmin = g < gmin ? g : gmin;
    }
    for (int b = 0; b < 512; b++) {
        uint32_t r = b < 256 ? (uint32_t)b << 24 : 0xFF000000u | ((uint32_t)(b - 256) << 16);
        if (b == 255)
            continue; /* split into the second table */
        assert_true(devio_sampler_gumbel_cap(s, r) - range_max[b] < 0x1p-9f);
    }
    assert_true(devio_sampler_gumbel_cap(s, UINT32_MAX) >= gmax);
    /* The extremes are those of the exact function: -log(-log(1-2^-24)) and
     * -log(-log(2^-24)). */
    assert_true(fabs(gmax - 16.6355) < 1e-3);
    assert_true(fabs(gmin - -2.8115) < 1e-3);
    devio_sampler_free(s);
}

/* ------------------------------------------------------------------ */
/* Lifecycle and parameter checks                                      */

static void test_create_and_args(void **state)
{
    (void)state;
    devio_sampler *s = (devio_sampler *)&s;
    assert_int_equal(devio_sampler_create(0, &s), DEVIO_E_INVALID);
    assert_null(s);
    assert_int_equal(devio_sampler_create(8, NULL), DEVIO_E_INVALID);
    devio_sampler_free(NULL);

    s = make_sampler(4);
    assert_int_equal(devio_sampler_vocab(s), 4);
    float l[4] = {0, 1, 2, 3};
    devio_sample_params p = params(1, 0, 1, 0, 1);
    int32_t tok = 77;
    float lp = 5.0f;
    assert_int_equal(devio_sampler_run(s, NULL, &p, 0, &tok, &lp), DEVIO_E_INVALID);
    assert_int_equal(devio_sampler_run(s, l, NULL, 0, &tok, &lp), DEVIO_E_INVALID);
    assert_int_equal(devio_sampler_run(s, l, &p, 0, NULL, &lp), DEVIO_E_INVALID);
    assert_int_equal(devio_sampler_run(s, l, &p, 0, &tok, NULL), DEVIO_E_INVALID);
    assert_int_equal(devio_sampler_run(NULL, l, &p, 0, &tok, &lp), DEVIO_E_INVALID);
    assert_int_equal(tok, 77);
    assert_true(lp == 5.0f);
    devio_sampler_free(s);
}

static void expect_invalid(devio_sample_params p, const char *field)
{
    devio_error err;
    memset(&err, 0, sizeof err);
    assert_int_equal(devio_sampler_check(&p, &err), DEVIO_E_INVALID);
    assert_int_equal(err.status, DEVIO_E_INVALID);
    if (!strstr(err.message, field))
        fail_msg("message '%s' does not name '%s'", err.message, field);
    assert_int_equal(devio_sampler_check(&p, NULL), DEVIO_E_INVALID);

    devio_sampler *s = make_sampler(4);
    float l[4] = {0, 1, 2, 3};
    int32_t tok = -5;
    float lp = 0.0f;
    assert_int_equal(devio_sampler_run(s, l, &p, 0, &tok, &lp), DEVIO_E_INVALID);
    assert_int_equal(tok, -5);
    devio_sampler_free(s);
}

static void test_check_params(void **state)
{
    (void)state;
    const float nan = NAN, inf = INFINITY;
    devio_error err;
    /* Accepted edges. */
    devio_sample_params ok[] = {
        params(0, 0, 1, 0, 0),          params(-0.0f, 0, 1, 0, 0),
        params(FLT_MAX, 0, 1, 0, 0),    params(1e-30f, INT32_MAX, 1e-7f, 1, UINT64_MAX),
        params(0.7f, 40, 0.9f, 0.05f, 42),
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(devio_sampler_check(&ok[i], &err), DEVIO_OK);

    expect_invalid(params(-1e-9f, 0, 1, 0, 0), "temperature");
    expect_invalid(params(nan, 0, 1, 0, 0), "temperature");
    expect_invalid(params(inf, 0, 1, 0, 0), "temperature");
    expect_invalid(params(1, -1, 1, 0, 0), "top_k");
    expect_invalid(params(1, INT32_MIN, 1, 0, 0), "top_k");
    expect_invalid(params(1, 0, 0, 0, 0), "top_p");
    expect_invalid(params(1, 0, -0.5f, 0, 0), "top_p");
    expect_invalid(params(1, 0, 1.0000001f, 0, 0), "top_p");
    expect_invalid(params(1, 0, nan, 0, 0), "top_p");
    expect_invalid(params(1, 0, 1, -1e-9f, 0), "min_p");
    expect_invalid(params(1, 0, 1, 1.0000001f, 0), "min_p");
    expect_invalid(params(1, 0, 1, nan, 0), "min_p");
    /* Greedy does not excuse bad filters. */
    expect_invalid(params(0, 0, 2, 0, 0), "top_p");
    assert_int_equal(devio_sampler_check(NULL, &err), DEVIO_E_INVALID);
}

/* ------------------------------------------------------------------ */
/* Greedy and determinism                                              */

static void test_greedy_argmax_ties(void **state)
{
    (void)state;
    enum { V = 64 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = (float)(i % 7);
    l[5] = 9.5f; /* ties at 5, 17, 40: lowest id wins */
    l[17] = 9.5f;
    l[40] = 9.5f;
    l[3] = NAN;  /* NaN is -inf, never the max */
    devio_sampler *s = make_sampler(V);
    for (uint64_t seed = 0; seed < 20; seed++) {
        /* Filters and seeds are ignored at temperature 0. */
        assert_int_equal(draw(s, l, params(0, 3, 0.5f, 0.5f, seed), seed * 7, NULL), 5);
        assert_int_equal(draw(s, l, params(-0.0f, 0, 1, 0, seed), seed, NULL), 5);
    }
    /* Random rows with many ties. */
    uint64_t rs = 11;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++)
            l[i] = mix_float(&rs, -3, 3, 0.5f);
        int best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[best])
                best = i;
        assert_int_equal(draw(s, l, params(0, 0, 1, 0, 0), 0, NULL), best);
    }
    devio_sampler_free(s);
}

static void test_determinism(void **state)
{
    (void)state;
    enum { V = 1000 };
    float l[V];
    uint64_t rs = 3;
    for (int i = 0; i < V; i++)
        l[i] = mix_float(&rs, -2, 2, 0);
    devio_sampler *s = make_sampler(V);
    devio_sampler *other = make_sampler(V);
    devio_sample_params p = params(1.0f, 0, 1, 0, 1234);
    float lp0;
    int32_t first = draw(s, l, p, 99, &lp0);
    for (int k = 0; k < 100; k++) {
        /* Interleave unrelated calls: the result depends on nothing else. */
        draw(s, l, params(0.8f, 50, 0.9f, 0.01f, (uint64_t)k), (uint64_t)k, NULL);
        float lp;
        assert_int_equal(draw(s, l, p, 99, &lp), first);
        assert_true(lp == lp0);
        assert_int_equal(draw(other, l, p, 99, NULL), first);
    }
    devio_sampler_free(s);
    devio_sampler_free(other);
}

static void test_positions_and_seeds_differ(void **state)
{
    (void)state;
    enum { V = 256, N = 200 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = 0.0f; /* uniform: every draw is pure randomness */
    devio_sampler *s = make_sampler(V);
    int seen_pos[V] = {0}, seen_seed[V] = {0}, seen_pos_hi[V] = {0}, seen_seed_hi[V] = {0};
    int distinct_pos = 0, distinct_seed = 0, distinct_pos_hi = 0, distinct_seed_hi = 0;
    int same = 0;
    for (uint64_t k = 0; k < N; k++) {
        int32_t a = draw(s, l, params(1, 0, 1, 0, 7), k, NULL);
        int32_t b = draw(s, l, params(1, 0, 1, 0, k), 7, NULL);
        /* The high halves of position and seed are keyed too. */
        int32_t c = draw(s, l, params(1, 0, 1, 0, 7), 7 + (k << 32), NULL);
        int32_t d = draw(s, l, params(1, 0, 1, 0, 7 + (k << 32)), 7, NULL);
        distinct_pos += !seen_pos[a]++;
        distinct_seed += !seen_seed[b]++;
        distinct_pos_hi += !seen_pos_hi[c]++;
        distinct_seed_hi += !seen_seed_hi[d]++;
        same += a == draw(s, l, params(1, 0, 1, 0, 8), k, NULL);
    }
    /* 200 uniform draws from 256 ids hit about 140 distinct ids. */
    assert_true(distinct_pos > 100);
    assert_true(distinct_seed > 100);
    assert_true(distinct_pos_hi > 100);
    assert_true(distinct_seed_hi > 100);
    /* Seeds 7 and 8 agree only by chance (about 1 in 256 per position). */
    assert_true(same < 10);
    devio_sampler_free(s);
}

/* ------------------------------------------------------------------ */
/* Filters                                                             */

static void test_top_k_one_is_greedy(void **state)
{
    (void)state;
    enum { V = 500 };
    float l[V];
    uint64_t rs = 5;
    devio_sampler *s = make_sampler(V);
    for (uint64_t trial = 0; trial < 100; trial++) {
        for (int i = 0; i < V; i++)
            l[i] = mix_float(&rs, -4, 4, 0.25f); /* ties at the top are common */
        int32_t g = draw(s, l, params(0, 0, 1, 0, 0), 0, NULL);
        assert_int_equal(draw(s, l, params(1.0f, 1, 1, 0, trial), trial, NULL), g);
        assert_int_equal(draw(s, l, params(0.5f, 1, 0.3f, 0.2f, ~trial), trial, NULL), g);
    }
    devio_sampler_free(s);
}

static void test_top_k_mask(void **state)
{
    (void)state;
    enum { V = 300, K = 6 };
    float l[V];
    uint64_t rs = 17;
    for (int i = 0; i < V; i++)
        l[i] = mix_float(&rs, 0, 2, 0);
    /* The top six by construction; ids 40 and 200 tie for sixth place and
     * the lower id takes it. */
    static const struct {
        int id;
        float v;
    } top[] = {{250, 4.0f}, {3, 3.5f}, {77, 3.2f}, {150, 3.0f}, {299, 2.5f}, {40, 2.2f}};
    bool in_top[V] = {false};
    for (int j = 0; j < K; j++) {
        l[top[j].id] = top[j].v;
        in_top[top[j].id] = true;
    }
    l[200] = 2.2f;
    devio_sampler *s = make_sampler(V);
    int hits[V] = {0};
    for (uint64_t seed = 0; seed < 3000; seed++)
        hits[draw(s, l, params(1.0f, K, 1, 0, seed), seed * 31, NULL)]++;
    for (int i = 0; i < V; i++) {
        if (in_top[i])
            assert_true(hits[i] > 0);
        else if (hits[i] != 0)
            fail_msg("id %d outside the top %d was chosen %d times", i, K, hits[i]);
    }
    /* top_k >= vocab is the same as no top_k. */
    for (uint64_t seed = 0; seed < 50; seed++) {
        int32_t a = draw(s, l, params(1.0f, 0, 1, 0, seed), seed, NULL);
        assert_int_equal(draw(s, l, params(1.0f, V, 1, 0, seed), seed, NULL), a);
        assert_int_equal(draw(s, l, params(1.0f, V + 9, 1, 0, seed), seed, NULL), a);
    }
    devio_sampler_free(s);
}

/* Logits log(q_i) for designed probabilities, plus a long flat tail, so the
 * nucleus and the min_p set sit far from any rounding edge. The head lands on
 * ids 0, 7, 14, 21, 28, 35 with q = 0.30, 0.22, 0.16, 0.11, 0.07, 0.04. */
enum { DV = 300 };
static void designed_logits(float *l)
{
    static const double head[] = {0.30, 0.22, 0.16, 0.11, 0.07, 0.04};
    double used = 0.0;
    for (int i = 0; i < 6; i++)
        used += head[i];
    for (int i = 0; i < DV; i++) {
        double q = i < 6 ? head[i] : (1.0 - used) / (DV - 6);
        l[(i * 7) % DV] = (float)log(q); /* 7 is prime to DV: a permutation */
    }
}

/* Steps 4-7 in double for logits with no near ties: the allowed set and the
 * probabilities renormalised over it. Returns the size of the set. */
static int expected_set(const float *l, int k, double top_p, double min_p, bool *allowed,
                        double *want)
{
    keyed order[DV];
    for (int i = 0; i < DV; i++)
        order[i] = (keyed){l[i], (uint32_t)i};
    qsort(order, DV, sizeof order[0], keyed_cmp);
    int n = (k > 0 && k < DV) ? k : DV;
    bool in[DV] = {false};
    for (int j = 0; j < n; j++)
        in[order[j].id] = true;
    double prob[DV];
    softmax_d(l, DV, 1.0, in, prob);
    if (top_p < 1.0) {
        double c = 0.0;
        int cut = 0;
        while (cut < n && c < top_p)
            c += prob[order[cut++].id];
        n = cut;
    }
    double thr = min_p * prob[order[0].id];
    int kept = 0;
    for (int i = 0; i < DV; i++)
        allowed[i] = false;
    for (int j = 0; j < n; j++)
        if (prob[order[j].id] >= thr) {
            allowed[order[j].id] = true;
            kept++;
        }
    softmax_d(l, DV, 1.0, allowed, want);
    return kept;
}

/* 20000 draws over seeds and positions: nothing outside the expected set is
 * ever chosen, and frequencies inside it follow the renormalised softmax. */
static void check_mask(int k, float top_p, float min_p, int expect_n)
{
    float l[DV];
    designed_logits(l);
    bool allowed[DV];
    double want[DV];
    assert_int_equal(expected_set(l, k, top_p, min_p, allowed, want), expect_n);
    devio_sampler *s = make_sampler(DV);
    enum { N = 20000 };
    int hits[DV] = {0};
    devio_sample_params p = params(1.0f, k, top_p, min_p, 0);
    for (uint64_t j = 0; j < N; j++) {
        p.seed = j * 0x9E3779B97F4A7C15ull;
        hits[draw(s, l, p, j, NULL)]++;
    }
    for (int i = 0; i < DV; i++) {
        if (!allowed[i] && hits[i] != 0)
            fail_msg("id %d outside the allowed set was chosen %d times", i, hits[i]);
        if (fabs(hits[i] / (double)N - want[i]) > 0.015)
            fail_msg("id %d: frequency %.4f, expected %.4f", i, hits[i] / (double)N, want[i]);
    }
    devio_sampler_free(s);
}

static void test_top_p_mask(void **state)
{
    (void)state;
    check_mask(0, 0.75f, 0, 4);   /* 0.30 + 0.22 + 0.16 < 0.75 <= + 0.11 */
    check_mask(5, 0.75f, 0, 3);   /* renormalised over the top 5 first */
    check_mask(0, 1e-6f, 0, 1);   /* always at least the most likely */
    check_mask(0, 0.96f, 0, 183); /* 6 head + 177 tied tail ids, lower ids first */
}

static void test_min_p_mask(void **state)
{
    (void)state;
    check_mask(0, 1, 0.3f, 4);    /* keeps p >= 0.09 */
    check_mask(0, 1, 1.0f, 1);    /* only the maximum */
    check_mask(2, 1, 0.3f, 2);    /* intersected with top_k = 2 */
    check_mask(0, 0.75f, 0.6f, 2); /* nucleus of 4, then p >= 0.18 */
}

/* The edges of the comparisons, where every p is exact: top_p stops at the
 * first c >= top_p, and min_p keeps p == min_p * p_max. */
static void test_filter_edges_exact(void **state)
{
    (void)state;
    const float four[4] = {2.0f, 2.0f, 2.0f, 2.0f}; /* p = 0.25 each, exactly */
    const float tied[4] = {1.0f, 3.0f, 3.0f, 0.0f};
    devio_sampler *s = make_sampler(4);
    int hits_p[4] = {0}, hits_m[4] = {0};
    for (uint64_t k = 0; k < 400; k++) {
        hits_p[draw(s, four, params(1.0f, 0, 0.5f, 0, k), k, NULL)]++;
        hits_m[draw(s, tied, params(1.0f, 0, 1, 1.0f, k), k, NULL)]++;
    }
    /* c = 0.25, 0.5 >= 0.5: the nucleus is ids 0 and 1, the lower ids. */
    assert_true(hits_p[0] > 0 && hits_p[1] > 0);
    assert_int_equal(hits_p[2] + hits_p[3], 0);
    /* Both maxima have p == p_max: both stay. */
    assert_true(hits_m[1] > 0 && hits_m[2] > 0);
    assert_int_equal(hits_m[0] + hits_m[3], 0);
    devio_sampler_free(s);
}

/* ------------------------------------------------------------------ */
/* Distributions and logprobs                                          */

static void check_distribution(const float *l, uint32_t v, devio_sample_params p,
                               const bool *mask)
{
    enum { N = 20000 };
    double want[64];
    int hits[64] = {0};
    assert_true(v <= 64);
    softmax_d(l, v, p.temperature, mask, want);
    devio_sampler *s = make_sampler(v);
    for (uint64_t pos = 0; pos < N; pos++)
        hits[draw(s, l, p, pos, NULL)]++;
    for (uint32_t i = 0; i < v; i++) {
        double f = hits[i] / (double)N;
        /* 5 sigma of a binomial at p = 0.5 over 20000 draws is 0.018. */
        if (fabs(f - want[i]) > 0.015)
            fail_msg("id %u: frequency %.4f, softmax %.4f", i, f, want[i]);
    }
    devio_sampler_free(s);
}

static void test_distribution_matches_softmax(void **state)
{
    (void)state;
    const float l[8] = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.5f, 1.2f, 0.7f};
    check_distribution(l, 8, params(1.0f, 0, 1, 0, 2024), NULL);
    check_distribution(l, 8, params(0.6f, 0, 1, 0, 99), NULL);
    check_distribution(l, 8, params(2.5f, 0, 1, 0, 7), NULL);
    /* top_k = 3 renormalises over ids 3, 6, 0. */
    bool top3[8] = {true, false, false, true, false, false, true, false};
    check_distribution(l, 8, params(1.0f, 3, 1, 0, 5), top3);
}

static void test_logprob_is_raw_log_softmax(void **state)
{
    (void)state;
    enum { V = 32000 };
    float *l = malloc(V * sizeof *l);
    assert_non_null(l);
    uint64_t rs = 23;
    for (int i = 0; i < V; i++)
        l[i] = mix_float(&rs, -12, 12, 0);
    l[100] = -INFINITY;
    l[200] = NAN;
    devio_sampler *s = make_sampler(V);
    const devio_sample_params ps[] = {
        params(0, 0, 1, 0, 0),         params(1.0f, 0, 1, 0, 1),
        params(0.3f, 40, 0.9f, 0, 2),  params(3.0f, 0, 0.95f, 0.01f, 3),
    };
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        for (uint64_t pos = 0; pos < 20; pos++) {
            float lp;
            int32_t tok = draw(s, l, ps[k], pos, &lp);
            assert_true(tok >= 0 && tok < V && tok != 100 && tok != 200);
            double m = -INFINITY, z = 0.0;
            for (int i = 0; i < V; i++)
                if (!isnan(l[i]) && l[i] > m)
                    m = l[i];
            for (int i = 0; i < V; i++)
                if (!isnan(l[i]))
                    z += exp(l[i] - m);
            double want = (l[tok] - m) - log(z);
            if (fabs(lp - want) > 1e-5)
                fail_msg("token %d: logprob %.8f, log-softmax %.8f", tok, lp, want);
        }
    }
    free(l);
    devio_sampler_free(s);
}

static void test_nan_and_inf(void **state)
{
    (void)state;
    enum { V = 40 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = (i % 3 == 0) ? NAN : (float)(i % 5) * 0.1f;
    devio_sampler *s = make_sampler(V);
    for (uint64_t k = 0; k < 2000; k++) {
        int32_t tok = draw(s, l, params(1.0f + (float)(k % 3), (int32_t)(k % 7),
                                         k % 2 ? 1.0f : 0.9f, 0, k),
                           k, NULL);
        if (tok % 3 == 0)
            fail_msg("NaN logit at id %d chosen", tok);
    }
    /* Every logit NaN or -inf: nothing to sample. */
    for (int i = 0; i < V; i++)
        l[i] = i % 2 ? NAN : -INFINITY;
    int32_t tok = 3;
    float lp = 0.0f;
    devio_sample_params p = params(1, 0, 1, 0, 0);
    assert_int_equal(devio_sampler_run(s, l, &p, 0, &tok, &lp), DEVIO_E_INVALID);
    p.temperature = 0;
    assert_int_equal(devio_sampler_run(s, l, &p, 0, &tok, &lp), DEVIO_E_INVALID);
    assert_int_equal(tok, 3);
    /* One real logit among NaNs is always the answer, with logprob 0. */
    l[21] = -50.0f;
    for (uint64_t k = 0; k < 50; k++) {
        float lpk;
        assert_int_equal(draw(s, l, params(0.5f, 0, 0.5f, 0.5f, k), k, &lpk), 21);
        assert_true(lpk == 0.0f);
    }
    /* +inf reads as FLT_MAX: it wins every draw, and two +inf split the mass. */
    for (int i = 0; i < V; i++)
        l[i] = (float)i;
    l[9] = INFINITY;
    for (uint64_t k = 0; k < 50; k++) {
        float lpk;
        assert_int_equal(draw(s, l, params(0.1f, 0, 1, 0, k), k, &lpk), 9);
        assert_true(lpk == 0.0f);
    }
    l[30] = INFINITY;
    float lp2;
    assert_int_equal(draw(s, l, params(0, 0, 1, 0, 0), 0, &lp2), 9);
    assert_true(fabs(lp2 - -log(2.0)) < 1e-6);
    devio_sampler_free(s);
}

static void test_extreme_temperatures(void **state)
{
    (void)state;
    enum { V = 50 };
    float l[V];
    uint64_t rs = 41;
    for (int i = 0; i < V; i++)
        l[i] = mix_float(&rs, -3e38f, 3e38f, 0);
    l[12] = -FLT_MAX;
    devio_sampler *s = make_sampler(V);
    for (uint64_t k = 0; k < 100; k++) {
        /* Quotients overflow and saturate; results stay defined and match
         * the plain transcription. */
        devio_sample_params ps[] = {params(1e-30f, 0, 1, 0, k), params(1e-30f, 0, 0.5f, 0.1f, k),
                                    params(FLT_MAX, 0, 1, 0, k), params(1e-45f, 5, 1, 0, k)};
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
            float lp, lp_ref;
            int32_t tok = draw(s, l, ps[j], k, &lp);
            assert_int_equal(tok, ref_sample(l, V, &ps[j], k, &lp_ref));
            assert_true(lp == lp_ref);
            assert_true(isfinite(lp) || lp == -INFINITY);
        }
    }
    devio_sampler_free(s);
}

/* ------------------------------------------------------------------ */
/* The optimised paths (selection, chunked top-p, skipping, Philox reuse)
 * against the plain transcription, bit for bit. */

static void test_matches_plain_definition(void **state)
{
    (void)state;
    static const uint32_t vocabs[] = {1, 2, 3, 5, 17, 33, 64, 100, 1000, 5000, 32000};
    uint64_t rs = 1234567;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const uint32_t v = vocabs[vi];
        float *l = malloc(v * sizeof *l);
        assert_non_null(l);
        devio_sampler *s = make_sampler(v);
        const int trials = v >= 5000 ? 30 : 200;
        for (int t = 0; t < trials; t++) {
            /* Logit shapes: wide, narrow with ties, flat, with holes. */
            int shape = t % 4;
            for (uint32_t i = 0; i < v; i++) {
                if (shape == 0)
                    l[i] = mix_float(&rs, -15, 15, 0);
                else if (shape == 1)
                    l[i] = mix_float(&rs, -2, 2, 0.5f);
                else if (shape == 2)
                    l[i] = mix_float(&rs, -0.01f, 0.01f, 0);
                else
                    l[i] = (mix_next(&rs) % 5 == 0) ? -INFINITY : mix_float(&rs, -5, 5, 0.125f);
            }
            l[mix_next(&rs) % v] = 3.0f; /* at least one finite logit */
            static const float temps[] = {0.0f, 0.05f, 0.7f, 1.0f, 1.5f};
            static const float tps[] = {1.0f, 0.999f, 0.9f, 0.5f, 0.1f};
            static const float mps[] = {0.0f, 0.0f, 0.01f, 0.2f, 1.0f};
            devio_sample_params p = params(
                temps[mix_next(&rs) % 5],
                (int32_t)(mix_next(&rs) % 3 == 0 ? 0 : 1 + mix_next(&rs) % (v + 2)),
                tps[mix_next(&rs) % 5], mps[mix_next(&rs) % 5], mix_next(&rs));
            uint64_t pos = mix_next(&rs) >> (mix_next(&rs) % 64);
            float lp, lp_ref;
            int32_t tok = draw(s, l, p, pos, &lp);
            int32_t want = ref_sample(l, v, &p, pos, &lp_ref);
            if (tok != want || !(lp == lp_ref))
                fail_msg("v=%u T=%g k=%d top_p=%g min_p=%g: token %d (ref %d), "
                         "logprob %g (ref %g)",
                         v, (double)p.temperature, p.top_k, (double)p.top_p,
                         (double)p.min_p, tok, want, (double)lp, (double)lp_ref);
        }
        free(l);
        devio_sampler_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_gumbel_caps_exhaustive),
        cmocka_unit_test(test_create_and_args),
        cmocka_unit_test(test_check_params),
        cmocka_unit_test(test_greedy_argmax_ties),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_positions_and_seeds_differ),
        cmocka_unit_test(test_top_k_one_is_greedy),
        cmocka_unit_test(test_top_k_mask),
        cmocka_unit_test(test_top_p_mask),
        cmocka_unit_test(test_min_p_mask),
        cmocka_unit_test(test_filter_edges_exact),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_logprob_is_raw_log_softmax),
        cmocka_unit_test(test_nan_and_inf),
        cmocka_unit_test(test_extreme_temperatures),
        cmocka_unit_test(test_matches_plain_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
