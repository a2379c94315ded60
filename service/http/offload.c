/* offload.c - worker threads for requests that may wait: a queue, workers started on demand and kept, a stop that runs what is queued.
 * A job runs exactly once, on a worker or (when none can start) on the submitter's thread; nothing here blocks a submitter. */
#include <stdlib.h>
#include <string.h>

#include "device/status.h"
#include "service/http/offload.h"

static void *worker_main(void *arg)
{
    devio_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->head && !o->stopping) {
            o->idle++;
            pthread_cond_wait(&o->work, &o->mu);
            o->idle--;
        }
        devio_offload_job *j = o->head;
        if (!j)
            break; /* stopping, and nothing is left */
        o->head = j->next;
        if (!o->head)
            o->tail = NULL;
        pthread_mutex_unlock(&o->mu);
        j->run(j);
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* One more worker, under o->mu; false when none could be started. */
static bool spawn(devio_offload *o)
{
    if (o->n >= o->max || pthread_create(&o->threads[o->n], NULL, worker_main, o) != 0)
        return false;
    o->n++;
    return true;
}

devio_status devio_offload_start(devio_offload *o, uint32_t max, devio_error *err)
{
    memset(o, 0, sizeof *o);
    o->max = max ? max : 1;
    o->threads = calloc(o->max, sizeof *o->threads);
    if (!o->threads)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the worker threads");
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->work, NULL);
    pthread_mutex_lock(&o->mu);
    bool ok = spawn(o);
    pthread_mutex_unlock(&o->mu);
    if (!ok) {
        devio_offload_stop(o);
        return devio_fail(err, DEVIO_E_NOMEM, "cannot start a worker thread");
    }
    return DEVIO_OK;
}

void devio_offload_submit(devio_offload *o, devio_offload_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&o->mu);
    bool queued = !o->stopping;
    if (queued) {
        if (o->tail)
            o->tail->next = job;
        else
            o->head = job;
        o->tail = job;
        /* Jobs may wait for long (a step, a locked file): one that finds no
         * idle worker gets a new one while there is room. */
        if (o->idle == 0 && !spawn(o) && o->n == 0) {
            o->head = o->tail = NULL;
            queued = false;
        }
        pthread_cond_signal(&o->work);
    }
    pthread_mutex_unlock(&o->mu);
    if (!queued)
        job->run(job);
}

void devio_offload_stop(devio_offload *o)
{
    if (!o->threads)
        return;
    pthread_mutex_lock(&o->mu);
    o->stopping = true;
    pthread_cond_broadcast(&o->work);
    pthread_mutex_unlock(&o->mu);
    for (uint32_t i = 0; i < o->n; i++)
        pthread_join(o->threads[i], NULL);
    pthread_cond_destroy(&o->work);
    pthread_mutex_destroy(&o->mu);
    free(o->threads);
    o->threads = NULL;
}
