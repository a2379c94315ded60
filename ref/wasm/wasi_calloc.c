/* wasi_calloc.c - calloc for the wasm32-wasi build that skips clearing memory that was never used.
 * Must never hand out a byte that is not zero, and never compute anything else: it only stands between calloc and malloc. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Linked with -Wl,--wrap=calloc: every call to calloc, the C library's own
 * included, lands here.
 *
 * Why: wasi-libc's malloc has no mmap, so its calloc clears every block,
 * while glibc serves large blocks from fresh zero pages and clears nothing.
 * The reference backend callocs its KV cache (hundreds of MiB at the default
 * sizes); clearing it costs the module a third of its start-up and commits
 * every page at once.
 *
 * Linear memory beyond the current memory size has never been part of the
 * heap, and the pages that memory.grow adds are zero by definition, so the
 * part of a new block at or above the size measured before malloc needs no
 * clearing; the part below it may hold old data and is cleared. The
 * allocator's own bookkeeping lies outside the block it returns. */
void *__wrap_calloc(size_t n, size_t size);

void *__wrap_calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    size_t bytes = n * size;
    /* 64-bit: a full 4 GiB memory is 2^32 bytes. */
    uint64_t fresh = (uint64_t)__builtin_wasm_memory_size(0) * 65536u;
    unsigned char *p = malloc(bytes);
    if (!p)
        return NULL;
    uint64_t lo = (uint64_t)(uintptr_t)p, hi = lo + bytes;
    if (hi <= fresh)
        memset(p, 0, bytes);
    else if (lo < fresh)
        memset(p, 0, (size_t)(fresh - lo));
    return p;
}
