/* routes_ops.c - the operations routes: /healthz, /readyz, /metrics and the contract at /v1/openapi.yaml.
 * Read-only; they must answer even after teardown, and never wait on a step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/status.h"
#include "service/http/request.h"
#include "service/routes/route_handlers.h"
#include "service/server.h"

extern const char devio_openapi_yaml[];
extern const unsigned long devio_openapi_yaml_len;

/* Why the backend can compute no more (a sticky CUDA error), into why; false
 * while it can, and after teardown (then there is no device to ask). */
static bool device_failed(devio_server *s, char *why, size_t n)
{
    devio_device *dev;
    devio_device_info info = {0};
    if (devio_server_hold(s, &dev, NULL) == DEVIO_OK) {
        devio_device_info_get(dev, &info);
        devio_server_release(s);
    }
    snprintf(why, n, "%s", info.failure);
    return info.failure[0] != '\0';
}

/* Liveness: the process answers and its backend has not failed for good. A
 * failed backend never recovers in this process, so the answer is an error
 * and the orchestrator restarts the process; draining and a history that
 * cannot be written are readiness matters, not this one's. */
devio_status devio_route_healthz(devio_server *s, const devio_request *rq, devio_reply *out,
                                 devio_error *err)
{
    (void)rq;
    char why[200];
    if (device_failed(s, why, sizeof why))
        return devio_fail(err, DEVIO_E_DEVICE, "the device failed for good: %s", why);
    return devio_reply_json(out, 200, json_pack("{s:s}", "status", "ok"), err);
}

/* What /readyz answers and devio_ready exports: serving, on a device whose
 * backend has not failed for good (a CUDA error), with a ticket history that
 * can be written (launches are refused while it cannot; the store's heartbeat
 * makes it ready again once a write commits). On false, why says why. */
static bool ready_now(devio_server *s, const devio_store_health *h, char *why, size_t n)
{
    if (!atomic_load(&s->ready)) {
        snprintf(why, n, "not serving");
        return false;
    }
    char failure[200];
    if (device_failed(s, failure, sizeof failure)) {
        snprintf(why, n, "the device failed: %s", failure);
        return false;
    }
    if (!h->writable) {
        snprintf(why, n, "the ticket history cannot be written: %s", h->reason);
        return false;
    }
    return true;
}

devio_status devio_route_readyz(devio_server *s, const devio_request *rq, devio_reply *out,
                                devio_error *err)
{
    (void)rq;
    devio_store_health h;
    devio_store_health_get(s->store, &h);
    char why[256];
    if (!ready_now(s, &h, why, sizeof why))
        return devio_fail(err, DEVIO_E_NOT_READY, "%s", why);
    return devio_reply_json(out, 200, json_pack("{s:s}", "status", "ready"), err);
}

devio_status devio_route_metrics(devio_server *s, const devio_request *rq, devio_reply *out,
                                 devio_error *err)
{
    (void)rq;
    devio_device *dev;
    devio_metrics_device md = {0};
    devio_adapter_ack live = {0};
    devio_metrics_adapters ma = {0};
    devio_error down = {0};
    devio_store_health h;
    devio_store_health_get(s->store, &h);
    char why[256];
    bool ready = ready_now(s, &h, why, sizeof why);
    devio_metrics_store ms = {.writable = h.writable, .errors = h.errors,
                              .last_success_ms = h.last_success_ms};
    ms.commit_seconds = h.commit_seconds;
    bool up = devio_server_hold(s, &dev, &down) == DEVIO_OK;
    if (up) {
        md.facts = devio_facts_get(dev);
        const devio_config *cfg = devio_config_of(dev);
        md.max_seqs = cfg->max_seqs;
        md.logits_handles = cfg->logits_handles;
        devio_device_info info;
        devio_device_info_get(dev, &info);
        md.memory_total = info.memory_total;
        md.memory_used = info.memory_used;
        /* rows_served per adapter comes from the device's table as it is now. */
        devio_adapter_cmd list = {.kind = DEVIO_ADAPTER_CMD_LIST};
        if (devio_adapter_command(dev, &list, &live, NULL) == DEVIO_OK) {
            ma.live = live.adapters;
            ma.n_live = live.n_adapters;
        }
        ma.capacity = cfg->max_loras;
        devio_server_release(s);
    }
    devio_metrics_set_event_subscribers(&s->metrics, devio_events_subscribers(&s->events));
    devio_metrics_set_connections_refused(&s->metrics,
                                          atomic_load(&s->listener.refused_total) +
                                              atomic_load(&s->listener.refused_address));
    char *text = devio_metrics_render(&s->metrics, up ? &md : NULL, up ? &ma : NULL, &ms, ready);
    devio_adapter_ack_free(&live);
    if (!text)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory rendering the metrics");
    devio_reply_bytes(out, 200, "text/plain; version=0.0.4", text, strlen(text));
    return DEVIO_OK;
}

devio_status devio_route_openapi(devio_server *s, const devio_request *rq, devio_reply *out,
                                 devio_error *err)
{
    (void)s;
    (void)rq;
    char *body = malloc(devio_openapi_yaml_len + 1);
    if (!body)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    memcpy(body, devio_openapi_yaml, devio_openapi_yaml_len);
    devio_reply_bytes(out, 200, "application/yaml", body, devio_openapi_yaml_len);
    return DEVIO_OK;
}
