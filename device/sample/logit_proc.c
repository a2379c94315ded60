/* logit_proc.c - the checks on a sample's logit processing (sampler.h step 0b) that come before any sampling.
 * Pure functions of their arguments; they never touch a sampler's scratch. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "device/sample/sampler.h"
#include "device/status.h"

#define NEG_INF (-INFINITY)

devio_status devio_sample_check_tokens(const devio_sample_params *q, uint32_t vocab,
                                       const int32_t *history, uint32_t n_history,
                                       devio_error *err)
{
    if ((q->n_bias && (!q->bias_ids || !q->bias)) || (q->n_banned && !q->banned) ||
        (n_history && !history))
        return devio_fail(err, DEVIO_E_INVALID,
                          "logit_bias, banned_tokens and the penalty history: a count of "
                          "%u, %u and %u with no array",
                          q->n_bias, q->n_banned, n_history);
    for (uint32_t k = 0; k < q->n_bias; k++)
        if (q->bias_ids[k] < 0 || (uint32_t)q->bias_ids[k] >= vocab || q->bias[k] != q->bias[k])
            return devio_fail(err, DEVIO_E_INVALID,
                              "logit_bias: entry %u (token %d) is outside the vocabulary of "
                              "%u or not a number", k, q->bias_ids[k], vocab);
    if (q->allowed && q->allowed_words != (vocab + 31u) / 32u)
        return devio_fail(err, DEVIO_E_INVALID,
                          "allowed_tokens: %u words, the vocabulary of %u needs %u",
                          q->allowed_words, vocab, (vocab + 31u) / 32u);
    for (uint32_t k = 0; k < q->n_banned; k++)
        if (q->banned[k] < 0 || (uint32_t)q->banned[k] >= vocab)
            return devio_fail(err, DEVIO_E_INVALID,
                              "banned_tokens: entry %u (token %d) is outside the vocabulary "
                              "of %u", k, q->banned[k], vocab);
    for (uint32_t k = 0; k < n_history; k++)
        if (history[k] < 0 || (uint32_t)history[k] >= vocab)
            return devio_fail(err, DEVIO_E_INVALID,
                              "penalty history: token %d is outside the vocabulary of %u",
                              history[k], vocab);
    if (q->repetition_penalty != 0.0f &&
        (!(q->repetition_penalty > 0.0f) || q->repetition_penalty > FLT_MAX))
        return devio_fail(err, DEVIO_E_INVALID,
                          "repetition_penalty must be finite and > 0 (1 = off)");
    if (!(q->presence_penalty == q->presence_penalty) ||
        q->presence_penalty > FLT_MAX || q->presence_penalty < -FLT_MAX ||
        !(q->frequency_penalty == q->frequency_penalty) ||
        q->frequency_penalty > FLT_MAX || q->frequency_penalty < -FLT_MAX)
        return devio_fail(err, DEVIO_E_INVALID,
                          "presence_penalty and frequency_penalty must be finite (0 = off)");
    return DEVIO_OK;
}

devio_status devio_sample_excludes_all(const devio_sample_params *q, uint32_t vocab,
                                       bool *none)
{
    *none = false;
    if (!q->allowed && !q->n_banned && !q->n_bias)
        return DEVIO_OK;
    const uint32_t words = (vocab + 31u) / 32u;
    uint32_t *open = malloc(words * sizeof *open);
    if (!open)
        return DEVIO_E_NOMEM;
    for (uint32_t w = 0; w < words; w++)
        open[w] = q->allowed ? q->allowed[w] : ~0u;
    if (vocab % 32u) /* ids past the vocab are no tokens */
        open[words - 1] &= (1u << (vocab % 32u)) - 1u;
    for (uint32_t k = 0; k < q->n_banned; k++)
        open[(uint32_t)q->banned[k] >> 5] &= ~(1u << ((uint32_t)q->banned[k] & 31u));
    /* A -inf bias bans its token whatever else is added to it. */
    for (uint32_t k = 0; k < q->n_bias; k++)
        if (q->bias[k] == NEG_INF)
            open[(uint32_t)q->bias_ids[k] >> 5] &= ~(1u << ((uint32_t)q->bias_ids[k] & 31u));
    bool any = false;
    for (uint32_t w = 0; w < words && !any; w++)
        any = open[w] != 0;
    free(open);
    *none = !any;
    return DEVIO_OK;
}
