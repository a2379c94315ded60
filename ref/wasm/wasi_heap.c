/* wasi_heap.c - the heap break and calloc of the wasm32-wasi build: memory grown in large steps, fresh memory never cleared.
 * Must never hand out a byte of calloc memory that is not zero, and never compute anything: it only sits under malloc. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Linked with -Wl,--wrap=sbrk -Wl,--wrap=calloc, so every call to sbrk and
 * calloc, the C library's own included, lands here.
 *
 * Why. wasi-libc's malloc takes memory from sbrk, which grows linear memory
 * by exactly what it is asked for; the reference backend makes a few dozen
 * large allocations at start-up (weights, one KV cache per layer), and under
 * Node every memory.grow costs about 2 ms (V8 accounts the growth and
 * collects garbage), so growing in large steps saves most of that. And its
 * calloc clears every block, having no mmap, where glibc serves large
 * blocks from fresh zero pages: clearing the KV cache cost the module a
 * third of its start-up and committed every page of it.
 *
 * The break. Memory from the initial memory size up to `brk_end` belongs to
 * malloc; memory above it is either not grown yet or grown ahead and never
 * handed out, and both are zero (memory.grow adds zero pages). Nothing else
 * in the module grows memory. The break is one per process, as the heap is:
 * this is the C library's state, which is why it is a file-scope variable. */
void *__wrap_sbrk(intptr_t increment);
void *__wrap_calloc(size_t n, size_t size);

#define PAGE 65536u
#define MEMORY_MAX 4294967296ull /* 65536 pages: all a wasm32 memory can address */

static uint64_t brk_end; /* 0 until the first call */

static uint64_t memory_bytes(void)
{
    return (uint64_t)__builtin_wasm_memory_size(0) * PAGE;
}

static uint64_t current_break(void)
{
    if (brk_end == 0)
        brk_end = memory_bytes();
    return brk_end;
}

static int grow_pages(uint64_t bytes)
{
    return __builtin_wasm_memory_grow(0, (size_t)((bytes + PAGE - 1) / PAGE)) == SIZE_MAX ? -1 : 0;
}

void *__wrap_sbrk(intptr_t increment)
{
    uint64_t end = current_break();
    if (increment == 0)
        return (void *)(uintptr_t)end;
    /* Linear memory cannot shrink, and malloc asks in whole pages. */
    if (increment < 0 || increment % PAGE != 0) {
        errno = EINVAL;
        return (void *)-1;
    }
    uint64_t need = end + (uint64_t)increment, have = memory_bytes();
    if (need > MEMORY_MAX) {
        errno = ENOMEM;
        return (void *)-1;
    }
    if (need > have) {
        /* Half as much again as the memory holds, so the number of grows is
         * logarithmic in the heap size; just what is needed when that much
         * is not to be had. */
        uint64_t ahead = need + have / 2;
        if (ahead > MEMORY_MAX)
            ahead = MEMORY_MAX;
        if (grow_pages(ahead - have) != 0 && grow_pages(need - have) != 0) {
            errno = ENOMEM;
            return (void *)-1;
        }
    }
    brk_end = need;
    return (void *)(uintptr_t)end;
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    size_t bytes = n * size;
    /* What lies at or above the break now has never been handed out. */
    uint64_t fresh = current_break();
    unsigned char *p = malloc(bytes);
    if (!p)
        return NULL;
    /* The allocator's own bookkeeping lies outside the block it returns. */
    uint64_t lo = (uint64_t)(uintptr_t)p, hi = lo + bytes;
    if (hi <= fresh)
        memset(p, 0, bytes);
    else if (lo < fresh)
        memset(p, 0, (size_t)(fresh - lo));
    return p;
}
