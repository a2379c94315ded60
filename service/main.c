/* main.c - devio-server: configuration, signals, start and orderly stop.
 * Signals are taken by sigwait in this thread only; handlers never run in request threads. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "service/config.h"
#include "service/server.h"

int main(int argc, char **argv)
{
    devio_server_config cfg;
    devio_server_config_default(&cfg);
    int rc = devio_server_config_parse(&cfg, argc, argv, stdout, stderr);
    if (rc != 0)
        return rc > 0 ? 0 : 2;

    /* Block SIGTERM/SIGINT before any thread starts, so every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A file-size limit (RLIMIT_FSIZE) fails the write, which the store reports, instead of
     * killing the process. */
    signal(SIGXFSZ, SIG_IGN);

    static devio_server srv;
    devio_error err = {0};
    if (devio_server_start(&srv, &cfg, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-server: %s: %s\n", devio_status_str(err.status), err.message);
        return 1;
    }
    devio_device_info info;
    devio_device_info_get(srv.dev, &info);
    fprintf(stderr, "devio-server: serving %s on port %u (epoch %llu) with backend %s (%s "
                    "numerics) on %s; SIGTERM stops\n",
            cfg.model, srv.port, (unsigned long long)devio_store_epoch(srv.store), info.backend,
            devio_numerics_str(info.numerics), info.device);
    printf("listening %u\n", srv.port);
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "devio-server: signal %d, draining\n", sig);
    devio_server_stop(&srv);
    fprintf(stderr, "devio-server: stopped\n");
    return 0;
}
