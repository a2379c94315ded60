/* stream_backend.h - "stream", a second backend for tests: the reference's numbers computed
 * on a stream thread of its own, like a GPU queue. submit enqueues and returns at once, wait
 * blocks on the batch; logits stay in the backend's own memory; samples can be taken on the
 * "device"; faults can be injected. Built into tests and as the plugin libdevio-backend-stream.so.
 * Test code only: it must never be linked into a shipped binary. */
#ifndef DEVIO_STREAM_BACKEND_H
#define DEVIO_STREAM_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "device/backend/backend.h"

extern const devio_backend_ops devio_stream_backend;

/* What a stream state has seen, for assertions. */
typedef struct devio_stream_stats {
    uint32_t submitted, waited;  /* batches */
    uint32_t max_queued;         /* most batches submitted and not yet finished at once */
    uint32_t held;               /* batches that started only after the hold was met */
    uint32_t hold_timeouts;      /* holds given up after 5 s */
    uint32_t samples;            /* rows sampled by the sample slot */
    uint32_t logits_reads;       /* logits_read calls */
    uint32_t adapters_added, adapters_removed;
} devio_stream_stats;

/* state is what create made (the test captures it). */
void devio_stream_stats_get(void *state, devio_stream_stats *out);

/* From now on the stream thread starts a batch only when `n` batches are
 * queued (or 5 s passed): a test that launches n steps back to back sees
 * them all submitted before the first one computes. 0 turns it off. */
void devio_stream_hold(void *state, uint32_t n);

/* Fail the k-th submit (counting from 1) or the k-th wait from now with
 * DEVIO_E_DEVICE; 0 = never. The wait fault computes the step first and
 * then reports it failed, as a device error found at sync time would.
 * sticky: the wait fault breaks the device for good, as a CUDA error does:
 * info reports it in `failure` and every later submit is refused.
 * STREAM_BACKEND_BREAK_AT_WAIT=k in the environment at create does the same
 * (wait_k = k, sticky) for tests that reach the backend only as a plugin.
 * STREAM_BACKEND_STEP_MS=ms at create makes every step take at least ms
 * (a slow device, for tests of long waits). */
void devio_stream_fail(void *state, uint32_t submit_k, uint32_t wait_k, bool sticky);

#endif
