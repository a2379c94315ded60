/* adapter_files.c - an adapter's files: the containment rules of adapter.h, and hashing the weights file.
 * It must never resolve a path outside the adapters root, and never read more than one chunk of a file at a time. */
/* glibc declares realpath() only for XSI; the build's _POSIX_C_SOURCE alone hides it. */
#define _XOPEN_SOURCE 700
#include "device/adapter_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/path.h"
#include "device/adapter.h"
#include "device/sha256.h"
#include "device/status.h"

#define HASH_CHUNK 65536

/* ---- paths ---- */

void devio_adapter_paths_free(devio_adapter_paths *p)
{
    free(p->dir);
    free(p->config);
    free(p->weights);
    memset(p, 0, sizeof *p);
}

/* The lexical rule every build applies before touching the file system:
 * relative, non-empty, and no ".." that climbs above the root. */
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
    long depth = 0;
    for (const char *s = rel; *s;) {
        size_t n = strcspn(s, "/");
        if (n == 2 && s[0] == '.' && s[1] == '.')
            depth--;
        else if (n > 0 && !(n == 1 && s[0] == '.'))
            depth++;
        if (depth < 0)
            return devio_fail(err, DEVIO_E_INVALID,
                              "adapter path '%.120s' climbs with '..' to outside the adapters "
                              "root",
                              rel);
        s += n;
        while (*s == '/')
            s++;
    }
    return DEVIO_OK;
}

/* WASI runtimes refuse a symlink that leads out of a preopened directory
 * with ENOTCAPABLE; that is the same escape realpath() catches natively, and
 * must give the same status. */
static bool escaped(int e)
{
#ifdef ENOTCAPABLE
    return e == ENOTCAPABLE;
#else
    (void)e;
    return false;
#endif
}

#ifndef __wasi__
/* True when `p` is `root` or lies below it; both are realpath() results. */
static bool path_within(const char *root, const char *p)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return true;
    return strncmp(root, p, n) == 0 && (p[n] == '\0' || p[n] == '/');
}
#endif

/* Resolves DIR/NAME to a real, contained path. A missing file (a dangling
 * symlink included) is DEVIO_E_IO naming it. */
static devio_status resolve_file(const char *root_real, const char *dir, const char *rel,
                                 const char *name, char **out, devio_error *err)
{
    *out = NULL;
    char *p = devio_path_join(dir, name);
    if (!p)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    struct stat sb;
    if (stat(p, &sb) != 0) {
        int e = errno;
        free(p);
        if (escaped(e))
            return devio_fail(err, DEVIO_E_INVALID,
                              "%.120s/%s is a link to outside the adapters root", rel, name);
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: %s", rel, name,
                          e == ENOENT ? "not found in the adapter directory" : strerror(e));
    }
#ifdef __wasi__
    (void)root_real;
    *out = p;
#else
    char *real = realpath(p, NULL);
    int e = errno;
    free(p);
    if (!real)
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: cannot resolve: %s", rel, name,
                          strerror(e));
    if (!path_within(root_real, real)) {
        free(real);
        return devio_fail(err, DEVIO_E_INVALID,
                          "%.120s/%s is a link to outside the adapters root", rel, name);
    }
    *out = real;
#endif
    if (!S_ISREG(sb.st_mode)) {
        free(*out);
        *out = NULL;
        return devio_fail(err, DEVIO_E_IO, "%.120s/%s: not a regular file", rel, name);
    }
    return DEVIO_OK;
}

/* Resolves root/rel to a contained directory and, for each wanted file,
 * its contained path. Natively, root, directory and files all go through
 * realpath(), so symlinks and ".." are judged by where they lead. */
devio_status devio_adapter_paths_resolve(const char *root, const char *rel, bool want_config,
                                         devio_adapter_paths *P, devio_error *err)
{
    memset(P, 0, sizeof *P);
    if (!root || !root[0])
        return devio_fail(err, DEVIO_E_INVALID, "no adapters root is configured");
    devio_status st = check_rel_lexical(rel, err);
    if (st != DEVIO_OK)
        return st;
    char *root_real = NULL;
#ifdef __wasi__
    /* No realpath: the lexical rule above plus the runtime's preopen sandbox. */
    root_real = strdup(root);
    if (!root_real)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    P->dir = devio_path_join(root_real, rel);
    if (!P->dir) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        goto out;
    }
    struct stat sb;
    if (stat(P->dir, &sb) != 0) {
        if (escaped(errno))
            st = devio_fail(err, DEVIO_E_INVALID,
                            "adapter path '%.120s' resolves to outside the adapters root", rel);
        else
            st = devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel,
                            errno == ENOENT ? "not found in the adapters root" : strerror(errno));
        goto out;
    }
#else
    root_real = realpath(root, NULL);
    if (!root_real)
        return devio_fail(err, DEVIO_E_INVALID, "adapters root '%.120s' cannot be resolved: %s",
                          root, strerror(errno));
    char *joined = devio_path_join(root_real, rel);
    if (!joined) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        goto out;
    }
    P->dir = realpath(joined, NULL);
    int e = errno;
    free(joined);
    if (!P->dir) {
        st = devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel,
                        e == ENOENT ? "not found in the adapters root" : strerror(e));
        goto out;
    }
    if (!path_within(root_real, P->dir)) {
        st = devio_fail(err, DEVIO_E_INVALID,
                        "adapter path '%.120s' resolves to outside the adapters root", rel);
        goto out;
    }
    struct stat sb;
    if (stat(P->dir, &sb) != 0) {
        st = devio_fail(err, DEVIO_E_IO, "adapter directory '%.120s': %s", rel, strerror(errno));
        goto out;
    }
#endif
    if (!S_ISDIR(sb.st_mode)) {
        st = devio_fail(err, DEVIO_E_IO, "adapter path '%.120s' is not a directory", rel);
        goto out;
    }
    if (want_config && (st = resolve_file(root_real, P->dir, rel, DEVIO_ADAPTER_CONFIG_NAME,
                                          &P->config, err)) != DEVIO_OK)
        goto out;
    st = resolve_file(root_real, P->dir, rel, DEVIO_ADAPTER_WEIGHTS_NAME, &P->weights, err);
out:
    free(root_real);
    if (st != DEVIO_OK)
        devio_adapter_paths_free(P);
    return st;
}

/* ---- the weights file ---- */

static void file_id_of(const struct stat *sb, devio_file_id *id)
{
    id->dev = sb->st_dev;
    id->ino = sb->st_ino;
    id->size = sb->st_size;
    id->mtime = sb->st_mtim;
}

static bool file_id_equal(const devio_file_id *a, const devio_file_id *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Streams the file through SHA-256 without holding it in memory. */
devio_status devio_adapter_hash_file(const char *path, const char *label, char hex[65],
                                     uint64_t *size, devio_file_id *id, devio_error *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return devio_fail(err, DEVIO_E_IO, "%.120s: cannot open: %s", label, strerror(errno));
    devio_status st = DEVIO_OK;
    uint8_t *buf = malloc(HASH_CHUNK);
    struct stat sb;
    if (!buf) {
        st = devio_fail(err, DEVIO_E_NOMEM, "out of memory hashing %.120s", label);
        goto out;
    }
    if (fstat(fd, &sb) != 0) {
        st = devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", label, strerror(errno));
        goto out;
    }
    devio_sha256 h;
    devio_sha256_init(&h);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, HASH_CHUNK);
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
    if (id)
        file_id_of(&sb, id);
out:
    free(buf);
    close(fd);
    return st;
}

devio_status devio_adapter_file_unchanged(const char *path, const char *label,
                                          const devio_file_id *before, devio_error *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return devio_fail(err, DEVIO_E_IO, "%.120s: cannot stat: %s", label, strerror(errno));
    devio_file_id now;
    file_id_of(&sb, &now);
    if (!file_id_equal(before, &now))
        return devio_fail(err, DEVIO_E_IO, "%.120s: changed while being loaded; try again",
                          label);
    return DEVIO_OK;
}

/* ---- public: adapter.h ---- */

devio_status devio_adapter_path_check(const char *root, const char *rel_path, devio_error *err)
{
    devio_adapter_paths P;
    devio_error e = {0};
    devio_status st = devio_adapter_paths_resolve(root, rel_path, true, &P, &e);
    if (st == DEVIO_OK)
        devio_adapter_paths_free(&P);
    if (st != DEVIO_E_INVALID)
        return DEVIO_OK; /* missing or unreadable: the load names it */
    if (err)
        *err = e;
    return st;
}

devio_status devio_adapter_file_hash(const char *root, const char *rel_path, char hex[65],
                                     uint64_t *size, devio_error *err)
{
    devio_adapter_paths P;
    devio_status st = devio_adapter_paths_resolve(root, rel_path, false, &P, err);
    if (st != DEVIO_OK)
        return st;
    char wlabel[320];
    snprintf(wlabel, sizeof wlabel, "%s/%s", rel_path, DEVIO_ADAPTER_WEIGHTS_NAME);
    st = devio_adapter_hash_file(P.weights, wlabel, hex, size, NULL, err);
    devio_adapter_paths_free(&P);
    return st;
}
