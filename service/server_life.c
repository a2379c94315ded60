/* server_life.c - devio-server's start and stop: the model, the store, the device and the HTTP loop opened in order, a drain, then all closed in reverse.
 * Nothing here answers a request; a start that fails closes everything it opened. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/codec.h"
#include "common/log.h"
#include "device/backend/backend.h"
#include "device/status.h"
#include "ref/builtin.h"
#include "service/server.h"

/* Workers for the routes that may wait (offload.h): adapter commands, history
 * pages, effects and logits reads. Enough that requests waiting on different
 * things (a step, a locked file, an adapter's load) rarely queue behind one
 * another; more requests than this wait in order, holding no HTTP thread. */
#define OFFLOAD_WORKERS 16

/* The device's on_ids hook: the store keeps its id marks past these. */
static void ids_used(void *store, uint64_t seq_high, uint64_t logits_high)
{
    devio_store_ids_used(store, seq_high, logits_high);
}

static devio_status read_token(devio_server *s, devio_error *err)
{
    const char *tok = s->cfg.token;
    char buf[4096];
    if (s->cfg.token_file) {
        FILE *f = fopen(s->cfg.token_file, "r");
        if (!f)
            return devio_fail(err, DEVIO_E_IO, "cannot read token file %s: %s",
                              s->cfg.token_file, strerror(errno));
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
            n--;
        buf[n] = '\0';
        if (n == 0)
            return devio_fail(err, DEVIO_E_INVALID, "token file %s is empty", s->cfg.token_file);
        tok = buf;
    }
    if (tok) {
        s->token = strdup(tok);
        s->token_len = strlen(tok);
        if (!s->token)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    }
    return DEVIO_OK;
}

devio_status devio_server_start(devio_server *s, const devio_server_config *cfg,
                                devio_error *err)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    pthread_rwlock_init(&s->dev_lock, NULL);
    pthread_mutex_init(&s->launch_mu, NULL);
    pthread_mutex_init(&s->cursors_mu, NULL);
    devio_metrics_init(&s->metrics);
    devio_adapters_init(&s->adapters);
    devio_keys_init(&s->keys);
    s->tickets.metrics = &s->metrics;
    s->tickets.answer = devio_step_answer_text;
    devio_listen_addr sa;
    devio_status st = devio_listen_addr_parse(cfg->listen, &sa, err);
    if (st == DEVIO_OK)
        st = devio_tls_load(&s->tls, cfg->tls_cert, cfg->tls_key, err);
    devio_config dc = cfg->device;
    const devio_backend_ops *ops = NULL;
    devio_registry_builtin(&s->registry, cfg->backend_path);
    s->registry.numerics = cfg->device.numerics;
    if (st == DEVIO_OK)
        st = devio_registry_find(&s->registry, cfg->backend, &ops, err);
    if (st == DEVIO_OK && s->registry.note[0])
        devio_log(DEVIO_LOG_INFO, "backend", "backend auto passed over %s", s->registry.note);
    if (st == DEVIO_OK)
        st = read_token(s, err);
    devio_model_params mp = cfg->load;
    if (st == DEVIO_OK)
        st = devio_model_load_with(cfg->model, &mp, &s->model, err);
    if (st == DEVIO_OK)
        st = devio_waits_start(&s->waits, &devio_server_mhd_waits, err);
    if (st == DEVIO_OK)
        st = devio_offload_start(&s->offload, OFFLOAD_WORKERS, err);
    s->offload_started = st == DEVIO_OK;
    if (st == DEVIO_OK)
        st = devio_leases_start(&s->leases, cfg->ticket_lease_ms, &devio_server_reaper, s, err);
    s->tickets.leases = &s->leases;
    devio_store_options so = devio_store_options_default();
    so.retention = cfg->retention;
    so.key_retention = cfg->key_retention;
    so.on_written = devio_server_written;
    so.on_written_ctx = s;
    if (st == DEVIO_OK)
        st = devio_store_open(cfg->db, &so, &s->store, err);
    s->tickets.store = s->store;
    if (st == DEVIO_OK) {
        dc.epoch = devio_store_epoch(s->store);
        dc.first_ticket_id = devio_store_next_ticket_id(s->store);
        devio_store_first_ids(s->store, &dc.first_seq_id, &dc.first_logits_id);
        dc.on_ids = ids_used;
        dc.on_ids_ctx = s->store;
        dc.use_worker_thread = true;
        dc.on_settled = devio_server_settled;
        dc.on_settled_ctx = s;
        st = devio_events_start(&s->events, cfg->event_buffer, cfg->event_subscribers,
                                dc.epoch, err);
    }
    if (st == DEVIO_OK) {
        dc.on_event = devio_events_hook;
        dc.on_event_ctx = &s->events;
        st = devio_adapters_root(cfg->adapters, cfg->adapters_given, &dc.adapters_root, err);
    }
    if (st == DEVIO_OK) {
        st = devio_open(s->model, ops, &dc, &s->dev, err);
    }
    /* A backend that copied the weights (CUDA) never reads the host's again. */
    if (st == DEVIO_OK && ops->copies_weights) {
        devio_model_release_weights(s->model);
        devio_log(DEVIO_LOG_INFO, "start",
                  "backend '%s' holds the weights; their host memory was released", ops->name);
    }
    if (st == DEVIO_OK) {
        devio_device_info di = {0};
        devio_device_info_get(s->dev, &di);
        devio_metrics_set_backend(&s->metrics, di.backend);
        const devio_config *c = devio_config_of(s->dev);
        s->max_body_values = (uint64_t)c->max_batch_tokens + 64ull * c->max_rows +
                             4ull * s->model->cfg.vocab_size + 1024;
    }
    /* Before listening: the adapters recorded as loaded are loaded again, so
     * the first request sees the same table the last process had. */
    if (st == DEVIO_OK)
        st = devio_adapters_start(&s->adapters, s->store, s->dev, NULL, err);
    if (st == DEVIO_OK)
        st = devio_server_http_start(s, &sa, err);
    if (st != DEVIO_OK) {
        devio_server_stop(s);
        return st;
    }
    atomic_store(&s->ready, true);
    return DEVIO_OK;
}

/* Tickets launched and not yet awaited; 0 after teardown. */
static uint32_t tickets_in_flight(devio_server *s)
{
    devio_device *dev;
    if (devio_server_hold(s, &dev, NULL) != DEVIO_OK)
        return 0;
    uint32_t n = devio_facts_get(dev).tickets_in_flight;
    devio_server_release(s);
    return n;
}

void devio_server_stop(devio_server *s)
{
    atomic_store(&s->ready, false);
    atomic_store(&s->draining, true);
    /* Event streams never end by themselves: they end now, so that the drain below does not
     * wait on them. */
    devio_events_close(&s->events);
    if (s->mhd) {
        /* Drain for a bounded time: /readyz answers 503 and launches are
         * refused (not_ready), but the listener stays open, so that clients,
         * new connections included, still await what they launched and read
         * facts, history and metrics; requests in progress finish. */
        for (uint32_t waited = 0; waited < s->cfg.drain_ms &&
                                  (tickets_in_flight(s) > 0 || atomic_load(&s->active) > 0);
             waited += 10)
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    }
    uint32_t aborted = 0;
    devio_server_teardown(s, "server stopped", &aborted);
    /* Teardown settled every step, which resumed the awaits parked on them;
     * none may stay suspended when the daemon stops. */
    if (s->waits.timer_started)
        devio_waits_close(&s->waits);
    /* Requests on workers finish (the device is gone: they answer at once)
     * and bring their connections back before the daemon stops. */
    if (s->offload_started)
        devio_offload_stop(&s->offload);
    s->offload_started = false;
    devio_server_http_stop(s);
    devio_events_stop(&s->events);
    /* The daemon's last completions may have queued jobs for the reaper,
     * which find the device gone; the store's last batches resume nothing
     * (no connection is left), then the table stops. */
    devio_leases_stop(&s->leases);
    devio_store_close(s->store);
    s->store = NULL;
    devio_waits_stop(&s->waits);
    devio_registry_close(&s->registry);
    devio_model_free(s->model);
    s->model = NULL;
    free(s->token);
    s->token = NULL;
    devio_adapters_fini(&s->adapters);
    devio_keys_destroy(&s->keys);
    devio_metrics_fini(&s->metrics);
    pthread_rwlock_destroy(&s->dev_lock);
    pthread_mutex_destroy(&s->launch_mu);
    pthread_mutex_destroy(&s->cursors_mu);
}
