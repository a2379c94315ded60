/* store_health.c - whether the store can write: the writer's record of commits and failures, its heartbeat, its log line.
 * Read by /readyz, /metrics and launch; it must never log once per failed write, nor block a reader on SQLite. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/log.h"
#include "service/store/store_internal.h"

/* Upper bounds (seconds) of the commit-time buckets: 25 us to 1 s. */
static const double commit_le[] = {0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                   0.005,    0.01,    0.025,  0.05,    0.1,    1.0};
_Static_assert(sizeof commit_le / sizeof *commit_le <= DEVIO_HIST_MAX, "commit_le fits a devio_hist");

void store_health_init(devio_store *s)
{
    s->commit_seconds = devio_hist_make(commit_le, sizeof commit_le / sizeof *commit_le);
}

void devio_store_health_get(devio_store *s, devio_store_health *out)
{
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    out->writable = !s->unwritable;
    out->errors = s->errors;
    out->last_success_ms = s->last_success_ms;
    out->commit_seconds = s->commit_seconds;
    if (s->unwritable)
        snprintf(out->reason, sizeof out->reason, "%s", s->why);
    pthread_mutex_unlock(&s->mu);
}

bool devio_store_writable(devio_store *s)
{
    if (!s)
        return false;
    pthread_mutex_lock(&s->mu);
    bool w = !s->unwritable;
    pthread_mutex_unlock(&s->mu);
    return w;
}

/* The first failure of a run is logged at once; later ones at most one line
 * per STORE_LOG_EVERY_US, with the count of those not logged. */
static void log_failure(devio_store *s, uint64_t failed, const char *msg, bool first)
{
    uint64_t now = devio_clock_us();
    s->suppressed += failed;
    if (!first && now - s->last_log_us < STORE_LOG_EVERY_US)
        return;
    if (first)
        devio_log(DEVIO_LOG_ERROR, "store",
                  "ticket store %s: writes fail: %s; launches and awaits answer 503"
                  " store_unavailable and /readyz is unready until a write succeeds",
                  s->path, msg);
    else
        devio_log(DEVIO_LOG_ERROR, "store", "ticket store %s: %" PRIu64 " more writes failed: %s",
                  s->path, s->suppressed, msg);
    s->suppressed = 0;
    s->last_log_us = now;
}

void store_health_note(devio_store *s, bool committed, uint64_t failed, const char *msg)
{
    s->errors += failed;
    s->last_beat_us = devio_clock_us();
    if (committed && !s->gone) {
        s->last_success_ms = devio_unix_ms();
        if (s->unwritable)
            devio_log(DEVIO_LOG_INFO, "store",
                      "ticket store %s: writes succeed again after %" PRIu64 " failed", s->path,
                      s->failed_run);
        s->unwritable = false;
        s->why[0] = '\0';
        s->failed_run = 0;
        s->suppressed = 0;
        return;
    }
    if (failed == 0)
        return;
    bool first = !s->unwritable;
    s->unwritable = true;
    s->failed_run += failed;
    snprintf(s->why, sizeof s->why, "%s", msg ? msg : "unknown SQLite error");
    log_failure(s, failed, s->why, first);
}

bool store_health_beat_due(devio_store *s, struct timespec *at)
{
    uint64_t now = devio_clock_us();
    if (now - s->last_beat_us >= STORE_BEAT_US)
        return true;
    uint64_t left = STORE_BEAT_US - (now - s->last_beat_us);
    clock_gettime(CLOCK_REALTIME, at);
    at->tv_sec += (time_t)(left / 1000000u);
    at->tv_nsec += (long)(left % 1000000u) * 1000L;
    if (at->tv_nsec >= 1000000000L) {
        at->tv_sec++;
        at->tv_nsec -= 1000000000L;
    }
    return false;
}

bool store_health_file_gone(devio_store *s, char *msg, size_t len)
{
    struct stat sb;
    bool gone = false;
    if (stat(s->path, &sb) != 0) {
        gone = errno == ENOENT || errno == ENOTDIR;
        if (gone)
            snprintf(msg, len, "the history file %s was removed under the running server;"
                               " restart it to open a new one", s->path);
    } else if (sb.st_dev != s->file_dev || sb.st_ino != s->file_ino) {
        gone = true;
        snprintf(msg, len, "the history file %s was replaced by another file under the running"
                           " server; restart it to open that one", s->path);
    }
    if (gone) {
        pthread_mutex_lock(&s->mu);
        s->gone = true;
        pthread_mutex_unlock(&s->mu);
    }
    return gone;
}

bool store_health_beat(devio_store *s, char *msg, size_t len)
{
    if (store_health_file_gone(s, msg, len))
        return false;
    char txt[32];
    snprintf(txt, sizeof txt, "%" PRId64, devio_unix_ms());
    int rc = store_step_reset(s->st_begin);
    if (rc == SQLITE_DONE) {
        sqlite3_bind_text(s->st_beat, 1, txt, -1, SQLITE_TRANSIENT);
        rc = store_step_reset(s->st_beat);
    }
    if (rc == SQLITE_DONE)
        rc = store_step_reset(s->st_commit);
    if (rc == SQLITE_DONE)
        return true;
    snprintf(msg, len, "%s", sqlite3_errmsg(s->wdb));
    if (!sqlite3_get_autocommit(s->wdb))
        store_step_reset(s->st_rollback);
    return false;
}
