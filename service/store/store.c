/* store.c - the store's lifecycle: open (schema, writer thread, reader and lookup connections), close, and its counters.
 * The other store_*.c files do the work; this one must never leave a thread or a connection behind on failure. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/status.h"
#include "service/store/store_internal.h"

devio_store_options devio_store_options_default(void)
{
    return (devio_store_options){.retention = 0, .busy_timeout_ms = 5000};
}

/* The queue's and the reader's locks; false (nothing left initialised) on failure. */
static bool init_locks(devio_store *s)
{
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        return false;
    if (pthread_mutex_init(&s->rmu, NULL) != 0)
        goto out_mu;
    if (pthread_mutex_init(&s->lmu, NULL) != 0)
        goto out_rmu;
    if (pthread_cond_init(&s->work, NULL) != 0)
        goto out_lmu;
    if (pthread_cond_init(&s->done, NULL) == 0)
        return true;
    pthread_cond_destroy(&s->work);
out_lmu:
    pthread_mutex_destroy(&s->lmu);
out_rmu:
    pthread_mutex_destroy(&s->rmu);
out_mu:
    pthread_mutex_destroy(&s->mu);
    return false;
}

/* Everything open made after the locks, then the store itself. */
static void free_store(devio_store *s)
{
    store_writer_finalize(s);
    store_history_finalize(s);
    /* The last connection to close checkpoints the WAL into the file. */
    sqlite3_close(s->ldb);
    sqlite3_close(s->rdb);
    sqlite3_close(s->wdb);
    /* Only now: closing any descriptor of the file drops every POSIX lock
     * this process holds on it, SQLite's among them. */
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    pthread_cond_destroy(&s->done);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->lmu);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->mu);
    free(s->path);
    free(s);
}

/* Why path cannot be a writable store, when the file system says so: "" when
 * nothing obvious. The WAL needs the file and its directory writable (the
 * -wal and -shm files are created beside it). */
static void diagnose(const char *path, char *why, size_t len)
{
    struct stat sb;
    why[0] = '\0';
    char *dir = strdup(path);
    if (!dir)
        return;
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, strlen(dir) + 1, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(why, len, "the path is a directory");
    else if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        snprintf(why, len, "the path is not a regular file");
    else if (stat(path, &sb) == 0 && access(path, R_OK | W_OK) != 0)
        snprintf(why, len, "the file is not writable: %s", strerror(errno));
    else if (stat(dir, &sb) != 0)
        snprintf(why, len, "its directory %s: %s", dir, strerror(errno));
    else if (access(dir, W_OK | X_OK) != 0)
        snprintf(why, len, "its directory %s is not writable (the WAL files are created there): %s",
                 dir, strerror(errno));
    free(dir);
}

/* Hold path for the life of the store, so that a second server on the same
 * file is refused instead of interleaving its epochs and ticket ids with
 * ours. flock, on the file itself, before SQLite opens it: it names the
 * file whatever path reaches it (relative, absolute, a link), it is dropped
 * by the kernel when the process dies, and on Linux it never meets the
 * fcntl byte-range locks SQLite takes (other readers, the sqlite3 shell, are
 * not stopped). A path that cannot be opened or locked here (a directory, a
 * file system without flock) is left to SQLite's open and its diagnosis. */
static devio_status lock_file(devio_store *s, const char *path, devio_error *err)
{
    int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0)
        return DEVIO_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return DEVIO_OK;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        s->lock_fd = fd;
        return DEVIO_OK;
    }
    int e = errno;
    close(fd);
    if (e != EWOULDBLOCK)
        return DEVIO_OK;
    return devio_fail(err, DEVIO_E_IO,
                      "ticket store %s: another process holds this file (a devio-server "
                      "already serves it); one server per history file, give this one "
                      "another --db", path);
}

devio_status devio_store_open(const char *path, const devio_store_options *o,
                              devio_store **out, devio_error *err)
{
    if (!out)
        return devio_fail(err, DEVIO_E_INVALID, "devio_store_open: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return devio_fail(err, DEVIO_E_INVALID, "ticket store path is empty");

    devio_store *s = calloc(1, sizeof *s);
    char *copy = strdup(path);
    if (!s || !copy || !init_locks(s)) {
        free(copy);
        free(s);
        return devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: out of memory", path);
    }
    s->path = copy;
    s->lock_fd = -1;
    store_health_init(s);
    s->opt = o ? *o : devio_store_options_default();
    if (s->opt.busy_timeout_ms == 0) /* a zeroed options struct means the default */
        s->opt.busy_timeout_ms = 5000;

    devio_status st = lock_file(s, path, err);
    if (st == DEVIO_OK)
        st = store_connect(path, s->opt.busy_timeout_ms, &s->wdb, err);
    struct stat sb;
    if (st == DEVIO_OK && stat(path, &sb) == 0) {
        s->file_dev = sb.st_dev;
        s->file_ino = sb.st_ino;
    }
    if (st == DEVIO_OK)
        st = store_schema_open(s, err);
    if (st == DEVIO_OK)
        st = store_writer_prepare(s, err);
    if (st == DEVIO_OK)
        st = store_connect(path, s->opt.busy_timeout_ms, &s->rdb, err);
    if (st == DEVIO_OK)
        st = store_connect(path, s->opt.busy_timeout_ms, &s->ldb, err);
    if (st == DEVIO_OK)
        st = store_lookups_prepare(s, err);
    int prc = st == DEVIO_OK ? pthread_create(&s->thread, NULL, store_writer_main, s) : 0;
    if (prc != 0)
        st = devio_fail(err, DEVIO_E_NOMEM, "ticket store %s: cannot start the writer: %s", path,
                        strerror(prc));
    if (st != DEVIO_OK) {
        free_store(s);
        char why[200];
        diagnose(path, why, sizeof why);
        if (why[0] && err) {
            char msg[sizeof err->message];
            snprintf(msg, sizeof msg, "%s", err->message);
            devio_fail(err, st, "%s (%s)", msg, why);
        }
        return st;
    }
    *out = s;
    return DEVIO_OK;
}

void devio_store_close(devio_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* the writer drains the queue before it returns */

    free_store(s);
}

uint64_t devio_store_epoch(const devio_store *s)
{
    return s ? s->epoch : 0;
}

uint32_t devio_store_schema_version(const devio_store *s)
{
    return s ? s->schema_version : 0;
}

void devio_store_first_ids(const devio_store *s, uint64_t *seq, uint64_t *logits)
{
    *seq = s ? (uint64_t)s->ids_reserved[STORE_ID_SEQ] + 1 : 1;
    *logits = s ? (uint64_t)s->ids_reserved[STORE_ID_LOGITS] + 1 : 1;
}

static void raise_to(_Atomic uint64_t *at, uint64_t v)
{
    uint64_t cur = atomic_load(at);
    while (cur < v && !atomic_compare_exchange_weak(at, &cur, v))
        ;
}

void devio_store_ids_used(devio_store *s, uint64_t seq_high, uint64_t logits_high)
{
    raise_to(&s->ids_used[STORE_ID_SEQ], seq_high);
    raise_to(&s->ids_used[STORE_ID_LOGITS], logits_high);
}

uint64_t devio_store_next_ticket_id(const devio_store *s)
{
    if (!s)
        return 0;
    /* The store is const to the caller but next_id moves under mu; the object
     * was allocated mutable, so locking through a cast is well defined. */
    devio_store *m = (devio_store *)s;
    pthread_mutex_lock(&m->mu);
    uint64_t v = m->next_id;
    pthread_mutex_unlock(&m->mu);
    return v;
}

