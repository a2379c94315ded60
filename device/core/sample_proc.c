/* sample_proc.c - a sample's processing in the core: checked at launch or apply, copied into its ticket, and
 * given the sequence's token record as the penalties' history. It never samples (sampler.c does). */
#include <stdlib.h>
#include <string.h>

#include "device/core/core.h"
#include "device/status.h"

bool dv_proc_asks(const devio_sample_params *p)
{
    return p->n_bias || p->allowed || p->n_banned || devio_sample_penalised(p) || p->logprobs;
}

uint32_t dv_proc_history(const devio_sample_params *p, const dv_seq *q, uint64_t position,
                         const int32_t **history)
{
    *history = NULL;
    if (!devio_sample_penalised(p) || !q || !q->toks || position <= p->penalty_from)
        return 0;
    uint64_t end = position < q->len ? position : q->len;
    if (end <= p->penalty_from)
        return 0;
    *history = q->toks + p->penalty_from;
    return (uint32_t)(end - p->penalty_from);
}

devio_status dv_proc_check(const devio_device *d, const devio_sample_params *p, devio_error *err)
{
    if (p->logprobs > DEVIO_TOP_LOGPROBS_MAX || p->logprobs > d->vocab)
        return devio_fail(err, DEVIO_E_INVALID, "logprobs must be at most %u (got %u)",
                          DEVIO_TOP_LOGPROBS_MAX < d->vocab ? DEVIO_TOP_LOGPROBS_MAX : d->vocab,
                          p->logprobs);
    devio_status s = devio_sample_check_tokens(p, d->vocab, NULL, 0, err);
    if (s != DEVIO_OK)
        return s;
    bool none = false;
    if (devio_sample_excludes_all(p, d->vocab, &none) != DEVIO_OK)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory checking allowed_tokens");
    if (none)
        return devio_fail(err, DEVIO_E_INVALID,
                          "allowed_tokens, banned_tokens and -inf logit_bias leave no token to "
                          "sample");
    return DEVIO_OK;
}

size_t dv_proc_bytes(const devio_sample_params *p)
{
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

void dv_proc_copy(devio_sample_params *dst, char **buf)
{
    dst->bias_ids = take(buf, dst->bias_ids, dst->n_bias, sizeof *dst->bias_ids);
    dst->bias = take(buf, dst->bias, dst->n_bias, sizeof *dst->bias);
    dst->allowed = take(buf, dst->allowed, dst->allowed ? dst->allowed_words : 0,
                        sizeof *dst->allowed);
    dst->banned = take(buf, dst->banned, dst->n_banned, sizeof *dst->banned);
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
