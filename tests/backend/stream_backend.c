/* stream_backend.c - the "stream" test backend: the reference computing on a thread of its own
 * behind submit/wait, with its own logits memory, device-side sampling and injected faults.
 * It must produce exactly the reference's numbers; it never decides a number itself. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/backend/registry.h"
#include "device/sample/sampler.h"
#include "device/status.h"
#include "ref/ref_backend.h"
#include "tests/backend/stream_backend.h"

typedef enum { ITEM_STEP, ITEM_SAMPLE } item_kind;

/* One queued piece of work, as a GPU stream holds kernels. */
typedef struct item {
    item_kind kind;
    const devio_batch *batch;
    uint64_t seq; /* the batch's submit number */
} item;

typedef struct stream {
    void *ref;                /* the reference's state: every number comes from it */
    devio_backend_config cfg; /* as given, but logits_host is ours */
    float *arena;             /* [logits_rows, vocab]: "device" logits */
    devio_sampler *sampler;
    uint32_t vocab;

    pthread_mutex_t mu;
    pthread_cond_t cv;        /* items queued, items done, stop */
    pthread_t thread;
    bool thread_started, stop;
    item *items;              /* ring of n_items */
    uint32_t n_items;
    uint64_t items_in, items_done; /* counters; items_in - items_done are queued */
    uint64_t submits, waits;  /* batches */
    uint64_t steps_done;
    uint64_t *last_item;      /* [max_depth] per batch (seq % max_depth): its last item number */
    devio_status *status;     /* [max_depth] per batch */
    devio_error *errs;        /* [max_depth] per batch */
    uint32_t hold;            /* one-shot: the next step waits for this many queued */
    uint32_t fail_submit, fail_wait; /* countdowns, 0 = off */
    bool sticky;                      /* an injected wait fault breaks the device for good */
    uint32_t step_ms;                 /* each step takes at least this long (slow device) */
    char failure[200];                /* what broke it: info reports it, submits are refused */
    devio_stream_stats stats;
} stream;

static void run_item(stream *s, const item *it)
{
    uint32_t k = (uint32_t)(it->seq % s->cfg.max_depth);
    if (it->kind == ITEM_STEP) {
        if (s->step_ms)
            nanosleep(&(struct timespec){.tv_sec = s->step_ms / 1000,
                                         .tv_nsec = (long)(s->step_ms % 1000) * 1000000L},
                      NULL);
        devio_error err = {0};
        devio_status st = devio_ref_backend.wait(s->ref, it->batch, &err);
        pthread_mutex_lock(&s->mu);
        s->status[k] = st;
        s->errs[k] = err;
        s->steps_done++;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if (s->status[k] != DEVIO_OK)
        return;
    const devio_batch *b = it->batch;
    for (uint32_t i = 0; i < b->n_samples; i++) {
        devio_batch_sample *sm = &b->samples[i];
        const float *logits = s->arena + (size_t)sm->logits_row * s->vocab;
        if (devio_sampler_run(s->sampler, logits, &sm->params, sm->position, &sm->token,
                              &sm->logprob) != DEVIO_OK) {
            s->status[k] = devio_fail(&s->errs[k], DEVIO_E_DEVICE,
                                      "row %u: cannot sample, every logit is NaN or -inf",
                                      sm->row);
            return;
        }
        s->stats.samples++;
    }
}

/* Before a step starts: a pending hold waits for enough queued batches. */
static void honour_hold(stream *s)
{
    if (s->hold == 0)
        return;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    int rc = 0;
    while (s->submits - s->steps_done < s->hold && !s->stop && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &dl);
    if (s->submits - s->steps_done >= s->hold)
        s->stats.held++;
    else
        s->stats.hold_timeouts++;
    s->hold = 0;
}

static void *stream_main(void *arg)
{
    stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->items_in == s->items_done && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->items_in == s->items_done)
            break;
        item it = s->items[s->items_done % s->n_items];
        if (it.kind == ITEM_STEP)
            honour_hold(s);
        pthread_mutex_unlock(&s->mu);
        run_item(s, &it);
        pthread_mutex_lock(&s->mu);
        s->items_done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void stream_destroy(void *sp)
{
    stream *s = sp;
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    devio_backend_destroy(&devio_ref_backend, s->ref);
    devio_sampler_free(s->sampler);
    free(s->arena);
    free(s->items);
    free(s->last_item);
    free(s->status);
    free(s->errs);
    free(s);
}

static devio_status stream_create(const devio_model *model, const devio_backend_config *cfg,
                                  void **state, devio_error *err)
{
    *state = NULL;
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the stream backend");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->cfg = *cfg;
    s->vocab = cfg->shape->vocab;
    s->n_items = 2 * cfg->max_depth + 2;
    s->arena = calloc((size_t)cfg->logits_rows * s->vocab + 1, sizeof(float));
    s->items = calloc(s->n_items, sizeof *s->items);
    s->last_item = calloc(cfg->max_depth, sizeof *s->last_item);
    s->status = calloc(cfg->max_depth, sizeof *s->status);
    s->errs = calloc(cfg->max_depth, sizeof *s->errs);
    if (!s->arena || !s->items || !s->last_item || !s->status || !s->errs ||
        devio_sampler_create(s->vocab, &s->sampler) != DEVIO_OK) {
        stream_destroy(s);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the stream backend");
    }
    /* The reference computes strict numbers into our arena; fast numerics
     * here only move sampling to the stream (same bits). */
    devio_backend_config rc = *cfg;
    rc.logits_host = s->arena;
    rc.numerics = DEVIO_NUMERICS_STRICT;
    devio_status st = devio_backend_create(&devio_ref_backend, model, &rc, &s->ref, err);
    if (st == DEVIO_OK && pthread_create(&s->thread, NULL, stream_main, s) != 0)
        st = devio_fail(err, DEVIO_E_DEVICE, "cannot start the stream thread");
    s->thread_started = st == DEVIO_OK;
    if (st != DEVIO_OK) {
        stream_destroy(s);
        return st;
    }
    /* For end-to-end tests of a device that breaks for good (devio-server
     * loads the plugin; nothing else can reach devio_stream_fail). */
    const char *brk = getenv("STREAM_BACKEND_BREAK_AT_WAIT");
    if (brk && atoi(brk) > 0) {
        s->fail_wait = (uint32_t)atoi(brk);
        s->sticky = true;
    }
    /* A slow device for end-to-end tests of long waits (steps of a known length). */
    const char *slow = getenv("STREAM_BACKEND_STEP_MS");
    if (slow && atoi(slow) > 0)
        s->step_ms = (uint32_t)atoi(slow);
    *state = s;
    return DEVIO_OK;
}

static void stream_info(void *sp, devio_device_info *out)
{
    stream *s = sp;
    devio_ref_backend.info(s->ref, out);
    snprintf(out->device, sizeof out->device, "stream test device over the reference");
    pthread_mutex_lock(&s->mu);
    snprintf(out->failure, sizeof out->failure, "%s", s->failure);
    pthread_mutex_unlock(&s->mu);
}

/* Queue an item; the caller holds s->mu and the ring has room (at most
 * two items per batch and max_depth batches in flight). */
static void enqueue(stream *s, item_kind kind, const devio_batch *b, uint64_t seq)
{
    s->items[s->items_in % s->n_items] = (item){.kind = kind, .batch = b, .seq = seq};
    s->last_item[seq % s->cfg.max_depth] = s->items_in++;
    pthread_cond_broadcast(&s->cv);
}

static devio_status stream_submit(void *sp, const devio_batch *b, devio_error *err)
{
    stream *s = sp;
    pthread_mutex_lock(&s->mu);
    devio_status st = DEVIO_OK;
    if (s->failure[0]) {
        st = devio_fail(err, DEVIO_E_DEVICE, "stream: the device failed earlier: %s", s->failure);
    } else if (s->fail_submit && --s->fail_submit == 0) {
        st = devio_fail(err, DEVIO_E_DEVICE, "stream: injected submit fault (ticket %llu)",
                        (unsigned long long)b->ticket);
    } else {
        enqueue(s, ITEM_STEP, b, s->submits++);
        s->stats.submitted++;
        uint32_t queued = (uint32_t)(s->submits - s->steps_done);
        if (queued > s->stats.max_queued)
            s->stats.max_queued = queued;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

static devio_status stream_sample(void *sp, const devio_batch *b, devio_error *err)
{
    stream *s = sp;
    (void)err;
    pthread_mutex_lock(&s->mu);
    /* Right after its submit: the batch is the newest one. */
    enqueue(s, ITEM_SAMPLE, b, s->submits - 1);
    pthread_mutex_unlock(&s->mu);
    return DEVIO_OK;
}

static devio_status stream_wait(void *sp, const devio_batch *b, devio_error *err)
{
    stream *s = sp;
    (void)b;
    pthread_mutex_lock(&s->mu);
    uint64_t seq = s->waits++;
    uint32_t k = (uint32_t)(seq % s->cfg.max_depth);
    while (s->items_done <= s->last_item[k])
        pthread_cond_wait(&s->cv, &s->mu);
    devio_status st = s->status[k];
    if (st != DEVIO_OK && err)
        *err = s->errs[k];
    if (st == DEVIO_OK && s->fail_wait && --s->fail_wait == 0) {
        devio_error e = {0};
        st = devio_fail(&e, DEVIO_E_DEVICE, "stream: injected fault found at sync (ticket %llu)",
                        (unsigned long long)b->ticket);
        if (s->sticky)
            snprintf(s->failure, sizeof s->failure, "%.190s", e.message);
        if (err)
            *err = e;
    }
    s->stats.waited++;
    pthread_mutex_unlock(&s->mu);
    return st;
}

static devio_status stream_logits_read(void *sp, uint32_t slot, float *dst, devio_error *err)
{
    stream *s = sp;
    if (slot >= s->cfg.logits_rows)
        return devio_fail(err, DEVIO_E_INVALID, "logits slot %u of %u", slot,
                          s->cfg.logits_rows);
    memcpy(dst, s->arena + (size_t)slot * s->vocab, s->vocab * sizeof(float));
    pthread_mutex_lock(&s->mu);
    s->stats.logits_reads++;
    pthread_mutex_unlock(&s->mu);
    return DEVIO_OK;
}

static devio_status stream_adapter_add(void *sp, uint32_t slot, uint32_t generation,
                                       const struct devio_adapter *a, devio_error *err)
{
    stream *s = sp;
    devio_status st = devio_ref_backend.adapter_add(s->ref, slot, generation, a, err);
    if (st == DEVIO_OK)
        s->stats.adapters_added++;
    return st;
}

static void stream_adapter_remove(void *sp, uint32_t slot, uint32_t generation)
{
    stream *s = sp;
    devio_ref_backend.adapter_remove(s->ref, slot, generation);
    s->stats.adapters_removed++;
}

/* Export and import run with no batch in flight: the stream thread is idle. */
static devio_status stream_state_read(void *sp, devio_state_ref what, void *dst,
                                      devio_error *err)
{
    stream *s = sp;
    return devio_ref_backend.state_read(s->ref, what, dst, err);
}

static devio_status stream_state_write(void *sp, devio_state_ref what, const void *src,
                                       devio_error *err)
{
    stream *s = sp;
    return devio_ref_backend.state_write(s->ref, what, src, err);
}

const devio_backend_ops devio_stream_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = "stream",
    .create = stream_create,
    .destroy = stream_destroy,
    .info = stream_info,
    .submit = stream_submit,
    .wait = stream_wait,
    .adapter_add = stream_adapter_add,
    .adapter_remove = stream_adapter_remove,
    .logits_read = stream_logits_read,
    .sample = stream_sample,
    .state_read = stream_state_read,
    .state_write = stream_state_write,
};

/* The plugin entry (registry.h): what dlopen of libdevio-backend-stream.so finds. */
const devio_backend_ops *devio_backend_plugin(void);
const devio_backend_ops *devio_backend_plugin(void) { return &devio_stream_backend; }

void devio_stream_stats_get(void *state, devio_stream_stats *out)
{
    stream *s = state;
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

void devio_stream_hold(void *state, uint32_t n)
{
    stream *s = state;
    pthread_mutex_lock(&s->mu);
    s->hold = n;
    pthread_mutex_unlock(&s->mu);
}

void devio_stream_fail(void *state, uint32_t submit_k, uint32_t wait_k, bool sticky)
{
    stream *s = state;
    pthread_mutex_lock(&s->mu);
    s->fail_submit = submit_k;
    s->fail_wait = wait_k;
    s->sticky = sticky;
    pthread_mutex_unlock(&s->mu);
}
