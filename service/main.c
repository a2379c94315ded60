/* main.c - devio-server: configuration, signals, start and orderly stop.
 * Signals are taken by sigwait in this thread only; handlers never run in request threads. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "service/config.h"
#include "service/server.h"

/* Wait for SIGTERM, SIGINT or SIGQUIT (each drains). SIGHUP, SIGUSR1 and
 * SIGUSR2 are logged and the server goes on serving: logs go to stderr,
 * which nothing here reopens, and no other meaning is given to them. */
static int wait_for_stop(const sigset_t *set)
{
    for (;;) {
        int sig = 0;
        if (sigwait(set, &sig) != 0)
            continue;
        if (sig == SIGTERM || sig == SIGINT || sig == SIGQUIT)
            return sig;
        devio_log(DEVIO_LOG_INFO, "signal", "signal %d (SIG%s) ignored: still serving; SIGTERM,"
                  " SIGINT or SIGQUIT drain and stop", sig, sigabbrev_np(sig));
    }
}

int main(int argc, char **argv)
{
    devio_server_config cfg;
    devio_server_config_default(&cfg);
    int rc = devio_server_config_parse(&cfg, argc, argv, stdout, stderr);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    devio_log_configure("devio-server", (devio_log_format)cfg.log_format,
                        (devio_log_level)cfg.log_level);

    /* Block the signals a process manager or a terminal sends before any
     * thread starts, so every thread inherits the mask and only sigwait
     * below sees them. */
    sigset_t set;
    sigemptyset(&set);
    const int taken[] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof taken / sizeof *taken; i++)
        sigaddset(&set, taken[i]);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A file-size limit (RLIMIT_FSIZE) reached by the store is a failed write
     * (EFBIG, reported as store_unavailable), not the end of the process. */
    signal(SIGXFSZ, SIG_IGN);

    static devio_server srv;
    devio_error err = {0};
    if (devio_server_start(&srv, &cfg, &err) != DEVIO_OK) {
        devio_log_field f[] = {DEVIO_LF_S("code", devio_status_str(err.status))};
        devio_logf(DEVIO_LOG_ERROR, "start", f, 1, "%s: %s", devio_status_str(err.status),
                   err.message);
        return 1;
    }
    devio_device_info info;
    devio_device_info_get(srv.dev, &info);
    const devio_config *dc = devio_config_of(srv.dev);
    uint64_t kv_tokens = (uint64_t)dc->kv_blocks * dc->block_size;
    unsigned long long kv_mib = (unsigned long long)(devio_kv_block_bytes(
        &srv.model->cfg, dc->block_size, dc->numerics == DEVIO_NUMERICS_FAST) * dc->kv_blocks >> 20);
    devio_log_field f[] = {
        DEVIO_LF_S("model", cfg.model),      DEVIO_LF_S("listen", cfg.listen),
        DEVIO_LF_U("port", srv.port),
        DEVIO_LF_U("epoch", devio_store_epoch(srv.store)), DEVIO_LF_S("backend", info.backend),
        DEVIO_LF_S("numerics", devio_numerics_str(info.numerics)),
        DEVIO_LF_S("device", info.device), DEVIO_LF_U("max_seq_len", dc->max_seq_len),
        DEVIO_LF_U("kv_tokens", kv_tokens),
    };
    devio_logf(DEVIO_LOG_INFO, "start", f, sizeof f / sizeof *f,
               "serving %s on %s, port %u (epoch %llu) with backend %s (%s numerics) on %s; "
               "sequences of up to %u positions (the model declares %u), a KV pool of %llu "
               "tokens (%llu MiB); SIGTERM drains and stops",
               cfg.model, cfg.listen, srv.port, (unsigned long long)devio_store_epoch(srv.store),
               info.backend, devio_numerics_str(info.numerics), info.device, dc->max_seq_len,
               srv.model->cfg.max_position_embeddings, (unsigned long long)kv_tokens, kv_mib);
    printf("listening %u\n", srv.port);
    fflush(stdout);
    int sig = wait_for_stop(&set);
    devio_log(DEVIO_LOG_INFO, "stop", "signal %d (SIG%s): draining (launches refused, up to %u ms)",
              sig, sigabbrev_np(sig), cfg.drain_ms);
    devio_server_stop(&srv);
    devio_log(DEVIO_LOG_INFO, "stop", "stopped");
    return 0;
}
