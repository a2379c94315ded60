/* fault.c - the counters and the link wraps of tests/fault: each __wrap_X counts the call and fails the armed one, else calls __real_X.
 * Test-only; it must never change what a call does when it is not the armed one. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fault/fault.h"

/* Process-wide on purpose: the counted calls happen in code that takes no
 * context (malloc has no cls), on any thread. */
static _Atomic int armed_kind = -1;
static _Atomic uint64_t armed_n, counted;
static atomic_bool fired, persisting;

void fault_arm(fault_kind kind, uint64_t n, bool persist)
{
    atomic_store(&armed_kind, -1);
    atomic_store(&persisting, persist);
    atomic_store(&counted, 0);
    atomic_store(&armed_n, n);
    atomic_store(&fired, false);
    atomic_store(&armed_kind, (int)kind);
}

uint64_t fault_disarm(void)
{
    atomic_store(&armed_kind, -1);
    return atomic_load(&counted);
}

bool fault_fired(void)
{
    return atomic_load(&fired);
}

bool fault_hit(fault_kind kind)
{
    if (atomic_load(&armed_kind) != (int)kind)
        return false;
    uint64_t c = atomic_fetch_add(&counted, 1) + 1;
    uint64_t n = atomic_load(&armed_n);
    if (n == 0 || c < n || (c > n && !atomic_load(&persisting)))
        return false;
    atomic_store(&fired, true);
    return true;
}

/* ---- allocation -------------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

void *__wrap_malloc(size_t n)
{
    if (fault_hit(FAULT_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
    if (fault_hit(FAULT_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (fault_hit(FAULT_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    if (fault_hit(FAULT_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    if (fault_hit(FAULT_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strndup(s, n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    if (fault_hit(FAULT_ALLOC))
        return ENOMEM;
    return __real_posix_memalign(p, a, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    if (fault_hit(FAULT_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_aligned_alloc(a, n);
}

/* ---- file I/O ---------------------------------------------------------- */

int __real_open(const char *path, int flags, ...);
int __real_openat(int dir, const char *path, int flags, ...);
ssize_t __real_read(int fd, void *buf, size_t n);
ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
int __real_fstat(int fd, struct stat *sb);
int __real_stat(const char *path, struct stat *sb);
void *__real_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);
FILE *__real_fopen(const char *path, const char *mode);
size_t __real_fread(void *p, size_t size, size_t n, FILE *fp);
char *__real_realpath(const char *path, char *resolved);

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int __wrap_open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return -1;
    }
    return __real_open(path, flags, mode);
}

int __wrap_openat(int dir, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return -1;
    }
    return __real_openat(dir, path, flags, mode);
}

ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return -1;
    }
    return __real_read(fd, buf, n);
}

ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off)
{
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return -1;
    }
    return __real_pread(fd, buf, n, off);
}

int __wrap_fstat(int fd, struct stat *sb)
{
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return -1;
    }
    return __real_fstat(fd, sb);
}

int __wrap_stat(const char *path, struct stat *sb)
{
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return -1;
    }
    return __real_stat(path, sb);
}

/* An anonymous mapping is an allocation (it fails as out of memory); a
 * mapping of a file is a file call. */
void *__wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
    bool anon = (flags & MAP_ANONYMOUS) != 0;
    if (fault_hit(anon ? FAULT_ALLOC : FAULT_IO)) {
        errno = anon ? ENOMEM : EIO;
        return MAP_FAILED;
    }
    return __real_mmap(a, n, prot, flags, fd, off);
}

FILE *__wrap_fopen(const char *path, const char *mode)
{
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return NULL;
    }
    return __real_fopen(path, mode);
}

/* A failed fread reads nothing and sets the stream's error flag, as glibc
 * does on a read error (_IO_ERR_SEEN is what ferror() tests). */
size_t __wrap_fread(void *p, size_t size, size_t n, FILE *fp)
{
    if (fault_hit(FAULT_IO)) {
        fp->_flags |= _IO_ERR_SEEN;
        errno = EIO;
        return 0;
    }
    return __real_fread(p, size, n, fp);
}

char *__wrap_realpath(const char *path, char *resolved)
{
    if (fault_hit(FAULT_IO)) {
        errno = EIO;
        return NULL;
    }
    return __real_realpath(path, resolved);
}
