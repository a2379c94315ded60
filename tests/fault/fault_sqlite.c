/* fault_sqlite.c - SQLite under tests/fault's counters: its allocator (SQLITE_CONFIG_MALLOC) and a VFS shim over the default VFS.
 * Test-only; the shim forwards every call it does not fail to the VFS it wraps, unchanged. */
#include <stddef.h>
#include <string.h>

#include <sqlite3.h>

#include "tests/fault/fault.h"

/* ---- allocator: SQLite's own faultsim wraps the methods it finds -------- */

static sqlite3_mem_methods mem_real;

static void *mem_malloc(int n)
{
    return fault_hit(FAULT_ALLOC) ? NULL : mem_real.xMalloc(n);
}

static void *mem_realloc(void *p, int n)
{
    return fault_hit(FAULT_ALLOC) ? NULL : mem_real.xRealloc(p, n);
}

/* ---- VFS shim: each file is the real VFS's file behind a header --------- */

typedef struct shim_file {
    sqlite3_file base;   /* pMethods = the shim's methods */
    sqlite3_file *real;  /* the real VFS's file, right after this struct */
} shim_file;

static sqlite3_vfs *vfs_real;
static sqlite3_vfs vfs_shim;
static sqlite3_io_methods io_shim;

#define REAL(f) (((shim_file *)(f))->real)

static int io_close(sqlite3_file *f)
{
    int rc = REAL(f)->pMethods->xClose(REAL(f));
    f->pMethods = NULL;
    return rc;
}

static int io_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off)
{
    if (fault_hit(FAULT_IO))
        return SQLITE_IOERR_READ;
    return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}

/* A failed write is the disk filling up. */
static int io_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off)
{
    if (fault_hit(FAULT_IO))
        return SQLITE_FULL;
    return REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}

static int io_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    if (fault_hit(FAULT_IO))
        return SQLITE_IOERR_TRUNCATE;
    return REAL(f)->pMethods->xTruncate(REAL(f), size);
}

static int io_sync(sqlite3_file *f, int flags)
{
    if (fault_hit(FAULT_IO))
        return SQLITE_IOERR_FSYNC;
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}

static int io_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}

static int io_lock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xLock(REAL(f), l);
}

static int io_unlock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xUnlock(REAL(f), l);
}

static int io_check_reserved(sqlite3_file *f, int *out)
{
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}

static int io_file_control(sqlite3_file *f, int op, void *arg)
{
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}

static int io_sector_size(sqlite3_file *f)
{
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}

static int io_device_chars(sqlite3_file *f)
{
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}

static int io_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp)
{
    if (fault_hit(FAULT_IO))
        return SQLITE_IOERR_SHMMAP;
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, pgsz, extend, pp);
}

static int io_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}

static void io_shm_barrier(sqlite3_file *f)
{
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}

static int io_shm_unmap(sqlite3_file *f, int del)
{
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}

static int io_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp)
{
    return REAL(f)->pMethods->xFetch(REAL(f), off, n, pp);
}

static int io_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static int vfs_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)v;
    shim_file *s = (shim_file *)f;
    s->base.pMethods = NULL;
    s->real = (sqlite3_file *)(s + 1);
    if (fault_hit(FAULT_IO))
        return SQLITE_CANTOPEN;
    int rc = vfs_real->xOpen(vfs_real, name, s->real, flags, out_flags);
    /* The real open may set pMethods even when it fails; then xClose is due. */
    if (s->real->pMethods) {
        io_shim.iVersion = s->real->pMethods->iVersion;
        s->base.pMethods = &io_shim;
    }
    return rc;
}

static int vfs_delete(sqlite3_vfs *v, const char *name, int sync)
{
    (void)v;
    return vfs_real->xDelete(vfs_real, name, sync);
}

static int vfs_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
    (void)v;
    return vfs_real->xAccess(vfs_real, name, flags, out);
}

static int vfs_full_path(sqlite3_vfs *v, const char *name, int n, char *out)
{
    (void)v;
    return vfs_real->xFullPathname(vfs_real, name, n, out);
}

int fault_sqlite_install(void)
{
    if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &mem_real) != SQLITE_OK)
        return -1;
    sqlite3_mem_methods m = mem_real;
    m.xMalloc = mem_malloc;
    m.xRealloc = mem_realloc;
    if (sqlite3_config(SQLITE_CONFIG_MALLOC, &m) != SQLITE_OK)
        return -1;
    if (sqlite3_initialize() != SQLITE_OK)
        return -1;
    vfs_real = sqlite3_vfs_find(NULL);
    if (!vfs_real)
        return -1;
    /* Everything but open, delete, access and the full path goes to the real
     * VFS's own slots (randomness, sleep, time, dlopen, syscalls). */
    vfs_shim = *vfs_real;
    vfs_shim.zName = "devio-fault";
    vfs_shim.pNext = NULL;
    vfs_shim.szOsFile = (int)sizeof(shim_file) + vfs_real->szOsFile;
    vfs_shim.xOpen = vfs_open;
    vfs_shim.xDelete = vfs_delete;
    vfs_shim.xAccess = vfs_access;
    vfs_shim.xFullPathname = vfs_full_path;
    io_shim = (sqlite3_io_methods){
        .iVersion = 3,
        .xClose = io_close,
        .xRead = io_read,
        .xWrite = io_write,
        .xTruncate = io_truncate,
        .xSync = io_sync,
        .xFileSize = io_file_size,
        .xLock = io_lock,
        .xUnlock = io_unlock,
        .xCheckReservedLock = io_check_reserved,
        .xFileControl = io_file_control,
        .xSectorSize = io_sector_size,
        .xDeviceCharacteristics = io_device_chars,
        .xShmMap = io_shm_map,
        .xShmLock = io_shm_lock,
        .xShmBarrier = io_shm_barrier,
        .xShmUnmap = io_shm_unmap,
        .xFetch = io_fetch,
        .xUnfetch = io_unfetch,
    };
    return sqlite3_vfs_register(&vfs_shim, 1) == SQLITE_OK ? 0 : -1;
}
