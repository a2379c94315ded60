/* sample_proc.c - a sample's processing in the core: checked at launch or apply, copied into its ticket, and
 * given the sequence's token record as the penalties' history. It never samples (sampler.c does). */
#include <stdlib.h>
#include <string.h>

#include "device/core/core.h"
#include "device/status.h"

bool dv_proc_asks(const devio_sample_proc *p)
{
    return p && (p->n_bias || p->allowed || p->n_banned || dv_proc_penalised(p) || p->logprobs);
}

bool dv_proc_penalised(const devio_sample_proc *p)
{
    return p && ((p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f) ||
                 p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

devio_logit_proc dv_logit_proc(const devio_sample_proc *p, const dv_seq *q, uint64_t position)
{
    devio_logit_proc l = {.repetition_penalty = 1.0f};
    if (!p)
        return l;
    l = (devio_logit_proc){.bias_ids = p->bias_ids, .bias = p->bias, .n_bias = p->n_bias,
                           .allowed = p->allowed, .allowed_words = p->allowed_words,
                           .banned = p->banned, .n_banned = p->n_banned,
                           .repetition_penalty = p->repetition_penalty == 0.0f
                                                     ? 1.0f : p->repetition_penalty,
                           .presence_penalty = p->presence_penalty,
                           .frequency_penalty = p->frequency_penalty};
    if (dv_proc_penalised(p) && q && q->toks && position > p->penalty_from) {
        uint64_t end = position < q->len ? position : q->len;
        if (end > p->penalty_from) {
            l.history = q->toks + p->penalty_from;
            l.n_history = (uint32_t)(end - p->penalty_from);
        }
    }
    return l;
}

devio_status dv_proc_check(const devio_device *d, const devio_sample_proc *p, devio_error *err)
{
    if (!p)
        return DEVIO_OK;
    if (p->logprobs > DEVIO_TOP_LOGPROBS_MAX || p->logprobs > d->vocab)
        return devio_fail(err, DEVIO_E_INVALID, "logprobs must be at most %u (got %u)",
                          DEVIO_TOP_LOGPROBS_MAX < d->vocab ? DEVIO_TOP_LOGPROBS_MAX : d->vocab,
                          p->logprobs);
    devio_logit_proc l = dv_logit_proc(p, NULL, 0);
    devio_status s = devio_logit_proc_check(&l, d->vocab, err);
    if (s != DEVIO_OK)
        return s;
    bool none = false;
    if (devio_logit_proc_excludes_all(&l, d->vocab, &none) != DEVIO_OK)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory checking allowed_tokens");
    if (none)
        return devio_fail(err, DEVIO_E_INVALID,
                          "allowed_tokens, banned_tokens and -inf logit_bias leave no token to "
                          "sample");
    return DEVIO_OK;
}

size_t dv_proc_bytes(const devio_sample_proc *p)
{
    if (!p)
        return 0;
    return (size_t)p->n_bias * (sizeof *p->bias_ids + sizeof *p->bias) +
           (p->allowed ? (size_t)p->allowed_words * sizeof *p->allowed : 0) +
           (size_t)p->n_banned * sizeof *p->banned;
}

/* n items of `size` bytes from src into *buf (advanced); NULL for none. */
static void *take(char **buf, const void *src, size_t n, size_t size)
{
    if (!src || n == 0)
        return NULL;
    void *d = *buf;
    memcpy(d, src, n * size);
    *buf += n * size;
    return d;
}

void dv_proc_copy(devio_sample_proc *dst, const devio_sample_proc *p, char **buf)
{
    *dst = *p;
    dst->bias_ids = take(buf, p->bias_ids, p->n_bias, sizeof *p->bias_ids);
    dst->bias = take(buf, p->bias, p->n_bias, sizeof *p->bias);
    dst->allowed = take(buf, p->allowed, p->allowed ? p->allowed_words : 0, sizeof *p->allowed);
    dst->banned = take(buf, p->banned, p->n_banned, sizeof *p->banned);
}

bool dv_seq_toks_reserve(const devio_device *d, dv_seq *q, uint32_t need)
{
    if (need <= q->toks_cap)
        return true;
    uint32_t cap = q->toks_cap ? q->toks_cap : 64;
    while (cap < need)
        cap = cap > UINT32_MAX / 2 ? need : cap * 2;
    if (cap > d->cfg.max_seq_len && need <= d->cfg.max_seq_len)
        cap = d->cfg.max_seq_len;
    int32_t *t = realloc(q->toks, (size_t)cap * sizeof *t);
    if (!t)
        return false;
    q->toks = t;
    q->toks_cap = cap;
    return true;
}
