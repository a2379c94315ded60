/* adapter_files.c - an adapter's files: the containment rules of adapter.h, kept by opening component by component below one root descriptor, and hashing the weights file.
 * It must never follow a link or '..' below the root, open anything by a full path after the root, or read more than one chunk of a file at a time when hashing. */
#include "device/adapter/adapter_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/adapter/adapter.h"
#include "common/sha256.h"
#include "device/status.h"

#define HASH_CHUNK 65536
#define NAME_MAX_BYTES 255 /* one path component */

void devio_adapter_fds_close(devio_adapter_fds *F)
{
    if (F->dir >= 0)
        close(F->dir);
    if (F->config >= 0)
        close(F->config);
    if (F->weights >= 0)
        close(F->weights);
    F->dir = F->config = F->weights = -1;
}

/* WASI runtimes refuse a path that leads out of a preopened directory with
 * ENOTCAPABLE: the same escape, and it must give the same status. */
static bool escaped(int e)
{
#ifdef ENOTCAPABLE
    return e == ENOTCAPABLE;
#else
    (void)e;
    return false;
#endif
}

/* True when `name` in dirfd is itself a symbolic link (looked at, not followed). */
static bool is_link(int dirfd, const char *name)
{
    struct stat sb;
    return fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode);
}

/* The lexical rule, applied before anything is opened: relative, non-empty,
 * no '..' and no empty component. */
static devio_status check_rel_lexical(const char *rel, devio_error *err)
{
    if (!rel || !rel[0])
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter path is empty: it must name a directory inside the adapters "
                          "root");
    if (rel[0] == '/')
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter path '%.120s' is absolute, which is outside the adapters root "
                          "(paths are relative to it)",
                          rel);
    for (const char *s = rel; *s;) {
        size_t n = strcspn(s, "/");
        bool last = s[n] == '\0' || s[n + strspn(s + n, "/")] == '\0';
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return devio_fail(err, DEVIO_E_INVALID,
                              "adapter path '%.120s' contains '..', which could lead outside the "
                              "adapters root",
                              rel);
        if (!last && s[n] == '/' && s[n + 1] == '/')
            return devio_fail(err, DEVIO_E_INVALID,
                              "adapter path '%.120s' has an empty component ('//')", rel);
        if (n > NAME_MAX_BYTES)
            return devio_fail(err, DEVIO_E_INVALID,
                              "adapter path '%.120s' has a component longer than %d bytes", rel,
                              NAME_MAX_BYTES);
        s += n;
        while (*s == '/')
            s++;
    }
    return DEVIO_OK;
}

/* Opens directory `name` below dirfd without following a link. */
static devio_status open_component(int dirfd, const char *rel, const char *name, int *out,
                                   bool *outside, devio_error *err)
{
    *out = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*out >= 0)
        return DEVIO_OK;
    int e = errno;
    *outside = is_link(dirfd, name) || escaped(e);
    if (is_link(dirfd, name))
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter path '%.120s' goes through a symbolic link ('%.60s'), which "
                          "could lead outside the adapters root; links are not followed",
                          rel, name);
    if (escaped(e))
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter path '%.120s' resolves to outside the adapters root", rel);
    /* What the request named is not there: the request's fault. Anything
     * else (EIO, EACCES, EMFILE, ...) is the server's: io_error. */
    if (e == ENOTDIR)
        return devio_fail(err, DEVIO_E_INVALID, "adapter path '%.120s' is not a directory", rel);
    if (e == ENOENT)
        return devio_fail(err, DEVIO_E_INVALID,
                          "adapter directory '%.120s': not found in the adapters root", rel);
    return devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel, strerror(e));
}

/* Opens file `name` of the adapter directory dirfd: no link, a regular
 * file (O_NONBLOCK, so that a FIFO put there cannot hang the open). */
static devio_status open_file(int dirfd, const char *rel, const char *name, int *out,
                              bool *outside, devio_error *err)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        *outside = is_link(dirfd, name) || escaped(e);
        if (*outside)
            return devio_fail(err, DEVIO_E_INVALID,
                              "%.120s/%s is a symbolic link, which could lead outside the "
                              "adapters root; links are not followed",
                              rel, name);
        if (e == ENOENT)
            return devio_fail(err, DEVIO_E_INVALID, "%.120s/%s: not found in the adapter directory",
                              rel, name);
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: %s", rel, name, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: cannot stat: %s", rel, name, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return devio_fail(err, DEVIO_E_INVALID, "%.120s/%s: not a regular file", rel, name);
    }
    *out = fd;
    return DEVIO_OK;
}

devio_status devio_adapter_open(const char *root, const char *rel, bool want_config,
                                devio_adapter_fds *F, devio_error *err)
{
    F->dir = F->config = F->weights = -1;
    F->outside = false;
    if (!root || !root[0])
        return devio_fail(err, DEVIO_E_INVALID, "no adapters root is configured");
    devio_status st = check_rel_lexical(rel, err);
    if (st != DEVIO_OK) {
        F->outside = true;
        return st;
    }
    /* The root was checked at start; one that went away since is the server's fault. */
    int cur = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cur < 0)
        return devio_fail(err, DEVIO_E_IO, "adapters root '%.120s' cannot be opened: %s",
                          root, strerror(errno));
    char name[NAME_MAX_BYTES + 1];
    for (const char *s = rel; *s;) {
        size_t n = strcspn(s, "/");
        if (!(n == 1 && s[0] == '.')) {
            memcpy(name, s, n); /* n <= NAME_MAX_BYTES: check_rel_lexical */
            name[n] = '\0';
            int next;
            st = open_component(cur, rel, name, &next, &F->outside, err);
            close(cur);
            if (st != DEVIO_OK)
                return st;
            cur = next;
        }
        s += n;
        while (*s == '/')
            s++;
    }
    F->dir = cur;
    if (want_config &&
        (st = open_file(F->dir, rel, DEVIO_ADAPTER_CONFIG_NAME, &F->config, &F->outside, err)) !=
            DEVIO_OK)
        goto out_close;
    if ((st = open_file(F->dir, rel, DEVIO_ADAPTER_WEIGHTS_NAME, &F->weights, &F->outside,
                        err)) != DEVIO_OK)
        goto out_close;
    return DEVIO_OK;

out_close:
    devio_adapter_fds_close(F);
    return st;
}

/* ---- the weights file ---- */

devio_status devio_adapter_hash_fd(int fd, const char *label, char hex[65], uint64_t *size,
                                   devio_error *err)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", label, strerror(errno));
    uint8_t *buf = malloc(HASH_CHUNK);
    if (!buf)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory hashing %.120s", label);
    devio_status st = DEVIO_OK;
    devio_sha256 h;
    devio_sha256_init(&h);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = pread(fd, buf, HASH_CHUNK, (off_t)total);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            st = devio_fail(err, DEVIO_E_IO, "%.120s: read failed at byte %llu: %s", label,
                            (unsigned long long)total, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        devio_sha256_update(&h, buf, (size_t)n);
        total += (uint64_t)n;
    }
    if (total != (uint64_t)sb.st_size) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: changed size while being read", label);
        goto out;
    }
    uint8_t digest[32];
    devio_sha256_final(&h, digest);
    devio_sha256_hex(digest, hex);
    *size = total;
out:
    free(buf);
    return st;
}

/* ---- public: adapter.h ---- */

devio_status devio_adapter_path_check(const char *root, const char *rel_path, devio_error *err)
{
    devio_adapter_fds F;
    devio_error e = {0};
    devio_status st = devio_adapter_open(root, rel_path, true, &F, &e);
    if (st == DEVIO_OK)
        devio_adapter_fds_close(&F);
    if (st == DEVIO_OK || !F.outside)
        return DEVIO_OK; /* missing or unreadable: the load names it, and it is recorded */
    if (err)
        *err = e;
    return st;
}

devio_status devio_adapter_file_hash(const char *root, const char *rel_path, char hex[65],
                                     uint64_t *size, devio_error *err)
{
    devio_adapter_fds F;
    devio_status st = devio_adapter_open(root, rel_path, false, &F, err);
    if (st != DEVIO_OK)
        return st;
    char wlabel[320];
    snprintf(wlabel, sizeof wlabel, "%s/%s", rel_path, DEVIO_ADAPTER_WEIGHTS_NAME);
    st = devio_adapter_hash_fd(F.weights, wlabel, hex, size, err);
    devio_adapter_fds_close(&F);
    return st;
}
