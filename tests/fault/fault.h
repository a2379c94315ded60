/* fault.h - fault injection for the tests: fail the N-th allocation or the N-th file I/O call.
 * Test-only (linked into tests/fault_sweep_test with -Wl,--wrap); never part of a production binary. */
#ifndef DEVIO_TEST_FAULT_H
#define DEVIO_TEST_FAULT_H

#include <stdbool.h>
#include <stdint.h>

/* What a counted call is. ALLOC: malloc, calloc, realloc, strdup, strndup,
 * posix_memalign, aligned_alloc (through the link wraps) and SQLite's
 * allocator. jansson's own allocations are not failed: jansson 2.14's lexer
 * drops a failed append (lex_save) and then stops the process on an
 * assert, which no caller can handle. IO: open, openat, read, pread, fstat, stat, mmap,
 * fopen, fread, realpath (through the link wraps) and SQLite's VFS (open,
 * read, write, truncate, sync, shared-memory map). */
typedef enum fault_kind {
    FAULT_ALLOC = 0,
    FAULT_IO,
    FAULT_KINDS,
} fault_kind;

/* Start counting calls of `kind` from zero; the n-th one (n >= 1) fails,
 * once, or with `persist` the n-th and every later one (SQLite's
 * "persistent" faults, which reach the error paths' own calls); n = 0 only
 * counts. Calls of the other kind are neither counted nor
 * failed. Counting is process-wide (every thread), as SQLite's own fault
 * simulator does. */
void fault_arm(fault_kind kind, uint64_t n, bool persist);
/* Stop counting; returns the number of calls counted since fault_arm. */
uint64_t fault_disarm(void);
/* True when the armed fault has fired since fault_arm. */
bool fault_fired(void);
/* The counting step itself, for the shims outside the link wraps (SQLite's
 * allocator and VFS, jansson): true when this call must fail. */
bool fault_hit(fault_kind kind);

/* Route SQLite's allocator and its default VFS through the counters (SQLite's
 * own way: SQLITE_CONFIG_MALLOC over the default allocator, a VFS shim
 * registered as the default). Call once, before SQLite is first used. 0 ok. */
int fault_sqlite_install(void);

#endif
