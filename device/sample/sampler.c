/* sampler.c - the token sampler defined in sampler.h: logit processing (bias,
 * masks, penalties), top logprobs, greedy, top-k, top-p, min-p and Philox-keyed
 * Gumbel-max. Never allocates after create, never uses libm. */
#include <float.h>
#include <math.h> /* INFINITY only: no libm function is called */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/devio.h"
#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "device/numerics/sample_rule.h"
#include "device/sample/sampler.h"
#include "device/status.h"

struct devio_sampler {
    uint32_t vocab;
    /* Every array has vocab entries. */
    float *z;           /* step 3: tempered logits */
    float *e;           /* step 1 exp terms, then step 5 exp terms, then p */
    uint32_t *idx;      /* the candidate set K as a list of ids */
    uint32_t *key;      /* step 6: sort keys parallel to idx */
    uint32_t *tmp_idx;  /* step 6: radix scatter space */
    uint32_t *tmp_key;
    uint8_t *mark;      /* step 4: membership, to list K in id order */
    float *w;           /* step 0b: the processed logits l'' */
    uint32_t *count;    /* step 0b: penalties' counts, all zero between calls */
    float cap1[256];    /* step 8: bounds on g, see gumbel_caps_init */
    float cap2[256];
    float cap_max;
};

/* Ranges this short are insertion sorted rather than radix scattered. */
#define SMALL_RANGE 32u

#define NEG_INF (-INFINITY)

static void gumbel_caps_init(devio_sampler *s);

/* ------------------------------------------------------------------ */
/* Philox4x32-10                                                       */

void devio_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    devio_philox_block(ctr, key, out);
}

/* ------------------------------------------------------------------ */
/* Lifecycle and checks                                                */

devio_status devio_sampler_create(uint32_t vocab, devio_sampler **out)
{
    if (!out)
        return DEVIO_E_INVALID;
    *out = NULL;
    /* Token ids are int32 in the interface. */
    if (vocab == 0 || vocab > (uint32_t)INT32_MAX)
        return DEVIO_E_INVALID;
    devio_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return DEVIO_E_NOMEM;
    s->vocab = vocab;
    const size_t n = vocab;
    s->z = malloc(n * sizeof *s->z);
    s->e = malloc(n * sizeof *s->e);
    s->idx = malloc(n * sizeof *s->idx);
    s->key = malloc(n * sizeof *s->key);
    s->tmp_idx = malloc(n * sizeof *s->tmp_idx);
    s->tmp_key = malloc(n * sizeof *s->tmp_key);
    s->mark = malloc(n * sizeof *s->mark);
    s->w = malloc(n * sizeof *s->w);
    s->count = calloc(n, sizeof *s->count);
    if (!s->z || !s->e || !s->idx || !s->key || !s->tmp_idx || !s->tmp_key || !s->mark ||
        !s->w || !s->count)
        goto out_free;
    gumbel_caps_init(s);
    *out = s;
    return DEVIO_OK;
out_free:
    devio_sampler_free(s);
    return DEVIO_E_NOMEM;
}

void devio_sampler_free(devio_sampler *s)
{
    if (!s)
        return;
    free(s->z);
    free(s->e);
    free(s->idx);
    free(s->key);
    free(s->tmp_idx);
    free(s->tmp_key);
    free(s->mark);
    free(s->w);
    free(s->count);
    free(s);
}

uint32_t devio_sampler_vocab(const devio_sampler *s)
{
    return s ? s->vocab : 0;
}

devio_status devio_sampler_check(const devio_sample_params *p, devio_error *err)
{
    if (!p)
        return devio_fail(err, DEVIO_E_INVALID, "sample params missing");
    /* Written as !(ok) so that NaN fails every test. */
    if (!(p->temperature >= 0.0f && p->temperature <= FLT_MAX))
        return devio_fail(err, DEVIO_E_INVALID,
                          "temperature must be finite and >= 0 (got %g)",
                          (double)p->temperature);
    if (p->top_k < 0)
        return devio_fail(err, DEVIO_E_INVALID, "top_k must be >= 0 (got %d)",
                          (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return devio_fail(err, DEVIO_E_INVALID, "top_p must be in (0, 1] (got %g)",
                          (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return devio_fail(err, DEVIO_E_INVALID, "min_p must be in [0, 1] (got %g)",
                          (double)p->min_p);
    return DEVIO_OK;
}

/* ------------------------------------------------------------------ */
/* Step 4: top-k by a bounded heap                                     */

/* The order of step 4: z descending, equal z lower id first. Ids are
 * distinct, so this is a strict total order. */
static inline bool comes_before(uint32_t a, uint32_t b, const float *z)
{
    float za = z[a], zb = z[b];
    return za > zb || (za == zb && a < b);
}

/* Heap whose root is the member that comes last, i.e. the first to be
 * displaced by a better candidate. */
static void sift_down(uint32_t *h, uint32_t root, uint32_t n, const float *z)
{
    for (;;) {
        uint32_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && comes_before(h[child], h[child + 1], z))
            child++;
        if (!comes_before(h[root], h[child], z))
            return;
        uint32_t t = h[root];
        h[root] = h[child];
        h[child] = t;
        root = child;
    }
}

/* heap[0..k) = the k ids first in order, in no particular arrangement.
 * 0 < k < v. One predictable comparison per id for most inputs, so this is
 * O(v) in practice and O(v log k) at worst. */
static void top_k_select(const float *z, uint32_t v, uint32_t k, uint32_t *heap)
{
    for (uint32_t i = 0; i < k; i++)
        heap[i] = i;
    for (uint32_t i = k / 2; i-- > 0;)
        sift_down(heap, i, k, z);
    for (uint32_t i = k; i < v; i++) {
        if (comes_before(i, heap[0], z)) {
            heap[0] = i;
            sift_down(heap, 0, k, z);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Step 6: the nucleus by a lazy most-significant-digit radix sort     */

typedef struct nucleus_walk {
    uint32_t *ids, *keys;         /* K in increasing id order on entry */
    uint32_t *tmp_ids, *tmp_keys; /* scatter space, same length */
    const float *p;
    float c, top_p;
    uint32_t cut; /* set when the walk stops */
} nucleus_walk;

/* Order ids[lo, lo+n) by key with a stable radix pass on the digit at
 * `shift` and walk it in order, ordering each bucket only when the walk
 * reaches it, so ids past the cut are never sorted. Stability keeps equal
 * keys in increasing id order, which is the tie rule. Returns true once
 * c >= top_p. */
static bool nucleus_walk_range(nucleus_walk *w, uint32_t lo, uint32_t n, int shift)
{
    uint32_t *ids = w->ids + lo, *keys = w->keys + lo;
    if (n <= SMALL_RANGE || shift < 0) {
        /* Stable insertion sort by key; when shift < 0 keys are all equal. */
        for (uint32_t i = 1; shift >= 0 && i < n; i++) {
            uint32_t id = ids[i], key = keys[i], j = i;
            while (j > 0 && keys[j - 1] > key) {
                ids[j] = ids[j - 1];
                keys[j] = keys[j - 1];
                j--;
            }
            ids[j] = id;
            keys[j] = key;
        }
        for (uint32_t j = 0; j < n; j++) {
            w->c = w->c + w->p[ids[j]];
            if (w->c >= w->top_p) {
                w->cut = lo + j + 1;
                return true;
            }
        }
        return false;
    }
    uint32_t count[256] = {0};
    for (uint32_t j = 0; j < n; j++)
        count[(keys[j] >> shift) & 0xFFu]++;
    if (count[(keys[0] >> shift) & 0xFFu] == n)
        return nucleus_walk_range(w, lo, n, shift - 8);
    uint32_t start[256];
    uint32_t off = 0;
    for (int b = 0; b < 256; b++) {
        start[b] = off;
        off += count[b];
    }
    uint32_t *tids = w->tmp_ids + lo, *tkeys = w->tmp_keys + lo;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t pos = start[(keys[j] >> shift) & 0xFFu]++;
        tids[pos] = ids[j];
        tkeys[pos] = keys[j];
    }
    memcpy(ids, tids, (size_t)n * sizeof *ids);
    memcpy(keys, tkeys, (size_t)n * sizeof *keys);
    off = 0;
    for (int b = 0; b < 256; b++) {
        if (count[b] && nucleus_walk_range(w, lo + off, count[b], shift - 8))
            return true;
        off += count[b];
    }
    return false;
}

/* Step 6 on K = ids[0..n), given in increasing id order: reorders the
 * prefix and returns the nucleus size. */
static uint32_t top_p_cut(devio_sampler *s, uint32_t n, const float *p, float top_p)
{
    for (uint32_t j = 0; j < n; j++)
        s->key[j] = devio_nucleus_key(p[s->idx[j]]);
    nucleus_walk w = {
        .ids = s->idx, .keys = s->key, .tmp_ids = s->tmp_idx, .tmp_keys = s->tmp_key,
        .p = p, .c = 0.0f, .top_p = top_p, .cut = n,
    };
    nucleus_walk_range(&w, 0, n, 24);
    return w.cut;
}

/* ------------------------------------------------------------------ */
/* Sampling                                                            */

/* Upper bounds on g, so that most ids are ruled out without the two logs.
 * g rises with u, so the bound for a range of r is g at the range's top
 * plus a margin that absorbs any rounding wobble in the logs. Ranges: the
 * top 8 bits of r; when those are all ones (u within 2^-8 of 1, where g
 * climbs steeply) the next 8 bits. sampler_test checks every r. */
#define CAP_MARGIN 0x1p-10f

static void gumbel_caps_init(devio_sampler *s)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t top1 = (b << 24) | 0x00FFFFFFu;
        uint32_t top2 = 0xFF000000u | (b << 16) | 0x0000FFFFu;
        s->cap1[b] = devio_gumbel_of_bits(top1) + CAP_MARGIN;
        s->cap2[b] = devio_gumbel_of_bits(top2) + CAP_MARGIN;
    }
    s->cap_max = s->cap2[255];
}

static inline float gumbel_cap(const devio_sampler *s, uint32_t r)
{
    return (r >> 24) != 0xFFu ? s->cap1[r >> 24] : s->cap2[(r >> 16) & 0xFFu];
}

float devio_sampler_gumbel_cap(const devio_sampler *s, uint32_t r)
{
    return gumbel_cap(s, r);
}

/* Argmax over K of z_i + g_i, ties to the lowest id. ids == NULL means
 * K = [0, n). `start` is a member of K with a large z: drawing for it first
 * sets a high bar. An id whose z plus the largest possible g cannot reach
 * the bar is skipped before its Philox call; one whose z plus the cap for
 * its bits cannot reach it is skipped before the logs. Skipping only ever
 * drops ids that cannot win, so the start never changes the result. */
static uint32_t gumbel_pick(const devio_sampler *s, const uint32_t *ids, uint32_t n,
                            uint32_t start, uint64_t seed, uint64_t position)
{
    const float *z = s->z;
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t pos_lo = (uint32_t)position, pos_hi = (uint32_t)(position >> 32);
    /* One Philox call serves four consecutive ids; keep the last block. */
    uint64_t cached = UINT64_MAX;
    uint32_t bits[4];

    uint32_t ctr[4] = {start >> 2, 0u, pos_lo, pos_hi};
    devio_philox4x32_10(ctr, key, bits);
    cached = start >> 2;
    float best = z[start] + devio_gumbel_of_bits(bits[start & 3u]);
    uint32_t best_id = start;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t id = ids ? ids[j] : j;
        float zi = z[id];
        if (zi + s->cap_max < best)
            continue;
        if (cached != id >> 2) {
            ctr[0] = id >> 2;
            devio_philox4x32_10(ctr, key, bits);
            cached = id >> 2;
        }
        uint32_t r = bits[id & 3u];
        if (zi + gumbel_cap(s, r) < best)
            continue;
        float v = zi + devio_gumbel_of_bits(r);
        if (v > best || (v == best && id < best_id)) {
            best = v;
            best_id = id;
        }
    }
    return best_id;
}

bool devio_sample_penalised(const devio_sample_params *p)
{
    return (p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f) ||
           p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

bool devio_sample_processes(const devio_sample_params *p, uint32_t n_history)
{
    return p->n_bias || p->allowed || p->n_banned || (n_history && devio_sample_penalised(p));
}

/* Step 0b into s->w from the cleaned logits, every result read by
 * devio_clean_logit (NaN -> -inf, +inf -> FLT_MAX); false when it leaves every
 * value -inf. *argmax: the first largest of l''. */
static bool process(devio_sampler *s, const float *logits, const devio_sample_params *q,
                    const int32_t *history, uint32_t n_history, uint32_t *argmax)
{
    const uint32_t V = s->vocab;
    float *w = s->w;
    for (uint32_t i = 0; i < V; i++)
        w[i] = devio_clean_logit(logits[i]);
    for (uint32_t k = 0; k < q->n_bias; k++)
        w[q->bias_ids[k]] = devio_clean_logit(w[q->bias_ids[k]] + q->bias[k]);
    if (q->allowed)
        for (uint32_t i = 0; i < V; i++)
            if (!((q->allowed[i >> 5] >> (i & 31u)) & 1u))
                w[i] = NEG_INF;
    for (uint32_t k = 0; k < q->n_banned; k++)
        w[q->banned[k]] = NEG_INF;
    /* A repetition penalty of 0 is unset: off, as 1 is. */
    const float rp = q->repetition_penalty == 0.0f ? 1.0f : q->repetition_penalty,
                pp = q->presence_penalty, fp = q->frequency_penalty;
    if (rp != 1.0f || pp != 0.0f || fp != 0.0f) {
        for (uint32_t k = 0; k < n_history; k++)
            s->count[history[k]]++;
        /* Each distinct id once: the first time it is met, its count then zeroed. */
        for (uint32_t k = 0; k < n_history; k++) {
            uint32_t i = (uint32_t)history[k], c = s->count[i];
            if (c == 0)
                continue;
            s->count[i] = 0;
            float x = w[i];
            if (x == NEG_INF)
                continue;
            if (rp != 1.0f)
                x = devio_clean_logit(x > 0.0f ? x / rp : x * rp);
            if (fp != 0.0f && x != NEG_INF)
                x = devio_clean_logit(x - fp * (float)c);
            if (pp != 0.0f && x != NEG_INF)
                x = devio_clean_logit(x - pp);
            w[i] = x;
        }
    }
    float m = NEG_INF;
    for (uint32_t i = 0; i < V; i++)
        if (w[i] > m) {
            m = w[i];
            *argmax = i;
        }
    return m != NEG_INF;
}

/* The top n (id, logprob) of step 1's log-softmax, largest first, equal
 * values lower id first, from the cleaned raw logits in s->z (which step 3
 * overwrites next). */
static void top_logprobs(devio_sampler *s, uint32_t n, float m, float log_z, int32_t *ids,
                         float *lps)
{
    const float *x = s->z;
    top_k_select(x, s->vocab, n, s->idx);
    for (uint32_t a = 1; a < n; a++) {
        uint32_t id = s->idx[a], b = a;
        while (b > 0 && (x[s->idx[b - 1]] < x[id] ||
                         (x[s->idx[b - 1]] == x[id] && s->idx[b - 1] > id))) {
            s->idx[b] = s->idx[b - 1];
            b--;
        }
        s->idx[b] = id;
    }
    for (uint32_t a = 0; a < n; a++) {
        ids[a] = (int32_t)s->idx[a];
        lps[a] = (x[s->idx[a]] - m) - log_z;
    }
}

/* Steps 4 to 8 with at least one of top_k, top_p and min_p on, given z. */
static uint32_t filtered_draw(devio_sampler *s, const devio_sample_params *p,
                              uint64_t position)
{
    const uint32_t V = s->vocab;
    const bool use_k = p->top_k > 0 && (uint32_t)p->top_k < V;
    const bool use_p = p->top_p < 1.0f;
    const bool use_min = p->min_p > 0.0f;
    /* K as a list s->idx[0..n). Step 6 needs it in increasing id order (its
     * stable sort turns that into the tie rule); the others take any order. */
    uint32_t n = V;
    if (use_k) {
        n = (uint32_t)p->top_k;
        top_k_select(s->z, V, n, s->idx);
        if (use_p) {
            memset(s->mark, 0, V);
            for (uint32_t j = 0; j < n; j++)
                s->mark[s->idx[j]] = 1;
            uint32_t j = 0;
            for (uint32_t i = 0; i < V; i++)
                if (s->mark[i])
                    s->idx[j++] = i;
        }
    } else {
        for (uint32_t i = 0; i < V; i++)
            s->idx[i] = i;
    }

    if (use_p || use_min) {
        /* Step 5: e over the full vocab, removed ids exactly +0. */
        float *e = s->e;
        float zmax = NEG_INF;
        for (uint32_t j = 0; j < n; j++)
            if (s->z[s->idx[j]] > zmax)
                zmax = s->z[s->idx[j]];
        if (n < V)
            memset(e, 0, (size_t)V * sizeof *e);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t id = s->idx[j];
            e[id] = devio_expf(s->z[id] - zmax);
        }
        const float zsum = devio_lane_sum(e, V);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t id = s->idx[j];
            e[id] = e[id] / zsum;
        }

        /* Step 6. */
        if (use_p)
            n = top_p_cut(s, n, e, p->top_p);

        /* Step 7. */
        if (use_min) {
            float pmax = 0.0f;
            for (uint32_t j = 0; j < n; j++)
                if (e[s->idx[j]] > pmax)
                    pmax = e[s->idx[j]];
            const float thr = p->min_p * pmax;
            uint32_t kept = 0;
            for (uint32_t j = 0; j < n; j++)
                if (!(e[s->idx[j]] < thr))
                    s->idx[kept++] = s->idx[j];
            n = kept;
        }
    }

    /* Step 8, starting from the member of K with the largest z. */
    uint32_t start = s->idx[0];
    for (uint32_t j = 1; j < n; j++)
        if (s->z[s->idx[j]] > s->z[start])
            start = s->idx[j];
    return gumbel_pick(s, s->idx, n, start, p->seed, position);
}

devio_status devio_sampler_run(devio_sampler *s, const float *logits,
                               const devio_sample_params *p, uint64_t position,
                               int32_t *token, float *logprob)
{
    return devio_sampler_run_ex(s, logits, p, NULL, 0, position, token, logprob, NULL);
}

devio_status devio_sampler_logprob(devio_sampler *s, const float *logits, int32_t token,
                                   float *out)
{
    if (!s || !logits || !out || token < 0 || (uint32_t)token >= s->vocab)
        return DEVIO_E_INVALID;
    const uint32_t V = s->vocab;
    float m = NEG_INF;
    for (uint32_t i = 0; i < V; i++) {
        s->e[i] = devio_clean_logit(logits[i]);
        if (s->e[i] > m)
            m = s->e[i];
    }
    if (m == NEG_INF)
        return DEVIO_E_INVALID;
    devio_expf_sub_n(s->e, s->e, m, V);
    *out = (devio_clean_logit(logits[token]) - m) - devio_logf(devio_lane_sum(s->e, V));
    return DEVIO_OK;
}

devio_status devio_sampler_run_ex(devio_sampler *s, const float *logits,
                                  const devio_sample_params *p, const int32_t *history,
                                  uint32_t n_history, uint64_t position, int32_t *token,
                                  float *logprob, devio_top_logprobs *top)
{
    if (!s || !logits || !p || !token || !logprob)
        return DEVIO_E_INVALID;
    if (devio_sampler_check(p, NULL) != DEVIO_OK ||
        devio_sample_check_tokens(p, s->vocab, history, n_history, NULL) != DEVIO_OK ||
        (top && top->n &&
         (!top->ids || !top->logprobs || top->n > DEVIO_TOP_LOGPROBS_MAX || top->n > s->vocab)))
        return DEVIO_E_INVALID;
    const uint32_t V = s->vocab;

    /* Steps 0 and 2: the raw max, first occurrence, is also the greedy pick. */
    float m = NEG_INF;
    uint32_t argmax = 0;
    for (uint32_t i = 0; i < V; i++) {
        float x = devio_clean_logit(logits[i]);
        if (x > m) {
            m = x;
            argmax = i;
        }
    }
    if (m == NEG_INF)
        return DEVIO_E_INVALID;

    /* Step 1 on the raw logits, and step 3 in the same pass when sampling
     * them as they are. */
    /* Below DEVIO_GREEDY_BELOW a temperature is greedy (sampler.h). */
    const float t = p->temperature < DEVIO_GREEDY_BELOW ? 0.0f : p->temperature;
    const bool processed = devio_sample_processes(p, n_history);
    const bool keep_raw = top && top->n;
    for (uint32_t i = 0; i < V; i++) {
        float x = devio_clean_logit(logits[i]);
        s->e[i] = x;
        if (keep_raw)
            s->z[i] = x;
        else if (t != 0.0f && !processed)
            s->z[i] = devio_temper(x, t);
    }
    devio_expf_sub_n(s->e, s->e, m, V); /* devio_expf(x - m), eight at a time */
    const float log_z = devio_logf(devio_lane_sum(s->e, V));
    if (keep_raw)
        top_logprobs(s, top->n, m, log_z, top->ids, top->logprobs);

    /* Step 0b: steps 2 to 8 read l'' in place of l'. */
    if (processed && !process(s, logits, p, history, n_history, &argmax))
        return DEVIO_E_INVALID;
    if (t != 0.0f && (processed || keep_raw))
        for (uint32_t i = 0; i < V; i++)
            s->z[i] = devio_temper(processed ? s->w[i] : devio_clean_logit(logits[i]), t);

    /* Tempering is monotone, so the argmax has the largest z (ties aside):
     * a good start for the draw. */
    const bool filtered = (p->top_k > 0 && (uint32_t)p->top_k < V) || p->top_p < 1.0f ||
                          p->min_p > 0.0f;
    uint32_t tok = t == 0.0f ? argmax
                   : filtered ? filtered_draw(s, p, position)
                              : gumbel_pick(s, NULL, V, argmax, p->seed, position);
    *token = (int32_t)tok;
    *logprob = (devio_clean_logit(logits[tok]) - m) - log_z;
    return DEVIO_OK;
}
