/* sampler.h - picks one token from a row of logits: greedy, or seeded
 * Gumbel-max after top-k/top-p/min-p. Bit-exact contract; never allocates per call.
 *
 * THE DEFINITION (every backend must reproduce it bit for bit)
 *
 * Inputs: logits l[0..V) (binary32), params (temperature T, top_k, top_p,
 * min_p, seed), and `position`, the sequence position the sampled token will
 * occupy. All arithmetic is binary32 with every operation rounded (no
 * contraction); exp and log are devio_expf / devio_logf from
 * device/numerics/numerics.h; every sum of many terms is devio_lane_sum (the 32-lane
 * rule of device/numerics/numspec.h) over a length-V array indexed by token id.
 *
 * 0. Sanitise: a NaN logit is read as -inf, a +inf logit as FLT_MAX. Call the
 *    result l'. If every l' is -inf the call fails with DEVIO_E_INVALID
 *    (there is nothing to sample).
 *
 * 0b. Logit processing (devio_sample_params' processing fields; skipped when it asks for
 *    nothing), on l' giving l''; every operation's result read as in step 0
 *    (NaN -> -inf, +inf -> FLT_MAX):
 *    a. logit_bias: for each entry (i, b) in order, l''_i = l''_i + b
 *       (b may be +-inf: -inf bans i, +inf makes it FLT_MAX);
 *    b. allowed_tokens: with a mask, every i whose bit (word i / 32, bit
 *       i % 32, least significant first) is clear becomes -inf;
 *    c. banned_tokens: each listed i becomes -inf;
 *    d. penalties, for each distinct id i of the history with count c_i,
 *       unless l''_i is -inf: repetition r != 1: l''_i = l''_i / r when
 *       l''_i > 0, else l''_i * r; then frequency f != 0:
 *       l''_i = l''_i - f * (float)c_i (product rounded, then the
 *       difference); then presence q != 0: l''_i = l''_i - q. (The order
 *       of HF's and vLLM's: repetition, then frequency, then presence.)
 *    If every l''_i is -inf the call fails with DEVIO_E_INVALID (no token
 *    is allowed). Steps 2 to 8 then read l'' wherever they say l'.
 *
 * 1. logprob (always, whatever the params): m = max_i l'_i;
 *    a_i = devio_expf(l'_i - m); Z = devio_lane_sum(a, V);
 *    logprob = (l'_tok - m) - devio_logf(Z).
 *    This is the log-softmax of the RAW logits (temperature 1, no filters)
 *    at the chosen token, which is what vLLM returns by default as the
 *    sampled token's logprob.
 *
 * 1b. top logprobs (when asked for n of them, n <= DEVIO_TOP_LOGPROBS_MAX):
 *    the n ids first in the order "l'_i descending, equal l' lower id
 *    first", each with (l'_i - m) - devio_logf(Z) of step 1: the raw
 *    log-softmax, like the sampled token's.
 *
 * 2. T < DEVIO_GREEDY_BELOW (0 included): greedy. tok = argmax_i l'_i, ties
 *    to the lowest id. No random numbers, no filters (top_k, top_p, min_p,
 *    seed are ignored). Dividing by a temperature that small can take
 *    quotients past FLT_MAX, where they clamp and tie (1e-40 would sample
 *    the lowest of the tied ids, not the largest logit).
 *
 * 3. T > 0: z_i = -inf when l'_i = -inf; otherwise z_i = l'_i / T (one
 *    rounded division), a quotient that overflowed to +inf or -inf being
 *    read as FLT_MAX or -FLT_MAX. So z_i = -inf exactly when l'_i = -inf,
 *    and max z is finite. The candidate set K starts as every id.
 *
 * 4. top_k: when 0 < top_k < V, K = the top_k ids first in the order
 *    "z descending, equal z (compared as floats, -0 == +0) lower id first".
 *
 * 5. Probabilities, computed only when top_p < 1 or min_p > 0:
 *    m = max over K of z_i; e_i = devio_expf(z_i - m) for i in K and
 *    e_i = +0.0f for i not in K; Z = devio_lane_sum(e, V) (full vocab, in
 *    id order, removed ids contributing exactly +0.0f); p_i = e_i / Z.
 *
 * 6. top_p < 1: order K by "p descending, equal p lower id first"; walk that
 *    order with c = +0.0f; c = c + p_i (rounded at each step); stop after
 *    the first token at which c >= top_p. K = the tokens walked (always at
 *    least one). If c never reaches top_p, K is unchanged.
 *
 * 7. min_p > 0: p_max = max over K of p_i (the p of step 5; top_p does not
 *    renormalise); thr = min_p * p_max (one rounded multiply); remove from K
 *    every i with p_i < thr. (p_max itself always stays.)
 *
 * 8. Gumbel-max over K. Random bits: for token id i,
 *      ctr = { i / 4, 0, (uint32)position, (uint32)(position >> 32) },
 *      key = { (uint32)seed, (uint32)(seed >> 32) },
 *      r_i = devio_philox4x32_10(ctr, key)[i % 4]
 *    (one Philox call serves four consecutive ids). Then
 *      u_i = (float)(2 * (r_i >> 9) + 1) * 2^-24
 *    the top 23 bits of r_i, centred in their cell: u_i is exact and lies in
 *    [2^-24, 1 - 2^-24], never 0 or 1. (24 bits plus one half would not be
 *    representable near 1.)
 *      g_i = -devio_logf(-devio_logf(u_i))
 *      v_i = z_i + g_i   (z of step 3, not the renormalised p)
 *    tok = argmax over K of v_i, ties to the lowest id.
 *    This draws from softmax(z) renormalised over K (the p of step 5 scaled
 *    to sum to one over K), up to the 23-bit resolution of u.
 *
 * An implementation may organise the work as it likes (partial selection,
 * lazy sorting, skipping tokens that provably cannot win step 8) as long as
 * every result is the one defined above.
 *
 * Parameter ranges (devio_sampler_check): T finite and >= 0 (-0 counts as
 * 0), top_k >= 0 (0 or >= V means off), 0 < top_p <= 1 (1 = off),
 * 0 <= min_p <= 1 (0 = off). seed: any value.
 *
 * Threads: a devio_sampler holds scratch, so one thread uses it at a time;
 * the result depends only on (logits, params, position), never on the
 * sampler's history.
 */
#ifndef DEVIO_SAMPLER_H
#define DEVIO_SAMPLER_H

#include <stdint.h>

#include "device/devio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch sized for one vocab at creation; the sampling path never allocates. */
typedef struct devio_sampler devio_sampler;

/* 1 <= vocab <= INT32_MAX. On success *out is owned by the caller, who frees it with
 * devio_sampler_free(). On failure (DEVIO_E_INVALID, DEVIO_E_NOMEM) *out is NULL. */
devio_status devio_sampler_create(uint32_t vocab, devio_sampler **out);

/* s may be NULL. */
void devio_sampler_free(devio_sampler *s);

/* The vocab the sampler was created for. */
uint32_t devio_sampler_vocab(const devio_sampler *s);

/* Validate params against the ranges above. DEVIO_OK, or DEVIO_E_INVALID with
 * a message naming the field (err may be NULL). Does not depend on the vocab. */
devio_status devio_sampler_check(const devio_sample_params *p, devio_error *err);

/* Temperatures below this are greedy (step 2). */
#define DEVIO_GREEDY_BELOW 1e-5f

/* Step 1b's output: n ids and logprobs into caller-owned arrays of n
 * (n <= DEVIO_TOP_LOGPROBS_MAX, device/devio.h). */
typedef struct devio_top_logprobs {
    uint32_t n;
    int32_t *ids;
    float *logprobs;
} devio_top_logprobs;

/* Step 0b's inputs are p's logit processing (device/devio.h) and the
 * history: the tokens the penalties count (any order, repeats count), a
 * sequence's token record from p->penalty_from up to the sampled position,
 * borrowed for the call. */

/* Whether p's penalties are on (repetition_penalty neither 0 nor 1, or a
 * presence or frequency penalty). */
bool devio_sample_penalised(const devio_sample_params *p);

/* Whether step 0b changes anything: a bias, a mask or a ban, or penalties
 * that are on with a history to count. */
bool devio_sample_processes(const devio_sample_params *p, uint32_t n_history);

/* Step 0b's inputs against the ranges above and the vocab: token ids (of
 * the bias, the ban and the history) in [0, vocab), biases not NaN, a mask of
 * exactly (vocab + 31) / 32 words, finite penalties. DEVIO_OK, or
 * DEVIO_E_INVALID naming the field. */
devio_status devio_sample_check_tokens(const devio_sample_params *p, uint32_t vocab,
                                       const int32_t *history, uint32_t n_history,
                                       devio_error *err);

/* Whether p's mask, banned tokens and -inf biases exclude every token of
 * the vocab whatever the logits (p checked). Then step 0b would fail for
 * any row: a caller can refuse such p before a step runs. DEVIO_E_NOMEM
 * when its scratch cannot be had; else DEVIO_OK and *none. */
devio_status devio_sample_excludes_all(const devio_sample_params *p, uint32_t vocab,
                                       bool *none);

/* Step 1 alone: the raw log-softmax of `logits` at `token`, the value a
 * sample of that token reports. DEVIO_E_INVALID for a bad token or when every
 * logit is NaN or -inf. */
devio_status devio_sampler_logprob(devio_sampler *s, const float *logits, int32_t token,
                                   float *out);

/* Sample one token from `logits` (vocab floats, borrowed for the call),
 * with p's logit processing and no history. `position` is the sequence
 * position the sampled token will occupy. Writes *token and *logprob on
 * DEVIO_OK; leaves them untouched otherwise. DEVIO_E_INVALID: a NULL
 * pointer, params that devio_sampler_check refuses, or every logit NaN or
 * -inf. */
devio_status devio_sampler_run(devio_sampler *s, const float *logits,
                               const devio_sample_params *p, uint64_t position,
                               int32_t *token, float *logprob);

/* devio_sampler_run with the penalties' history (n_history tokens, NULL
 * when 0) and step 1b (top may be NULL or ask for 0). DEVIO_E_INVALID also
 * for what devio_sample_check_tokens refuses, top->n over
 * DEVIO_TOP_LOGPROBS_MAX or the vocab, and processing that allows no token. */
devio_status devio_sampler_run_ex(devio_sampler *s, const float *logits,
                                  const devio_sample_params *p, const int32_t *history,
                                  uint32_t n_history, uint64_t position, int32_t *token,
                                  float *logprob, devio_top_logprobs *top);

/* Philox4x32-10 (Salmon et al., SC'11). With M0 = 0xD2511F53,
 * M1 = 0xCD9E8D57 and hi/lo the halves of a 32x32->64-bit product, one round
 * maps (c0, c1, c2, c3) to
 *   (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0));
 * ten rounds, the first with (k0, k1) = key, each later one after adding
 * 0x9E3779B9 to k0 and 0xBB67AE85 to k1 (mod 2^32). Matches the
 * known-answer vectors published with Random123. Exposed for tests and for
 * other backends to match. */
void devio_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The upper bound on g(r) (step 8, from the random word r) that the sampler
 * uses to rule tokens out without computing g; results are exact only while
 * g(r) <= cap for every r. Exposed so that sampler_test can check all of
 * them; nothing else needs it. */
float devio_sampler_gumbel_cap(const devio_sampler *s, uint32_t r);

#ifdef __cplusplus
}
#endif
#endif
