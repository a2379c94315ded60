/* heap_test.c - checks wasi_heap.c: calloc blocks are zero whatever the heap held, and the break grows ahead of malloc.
 * Must never pass without having checked every byte of every calloc block it asked for. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* wasi-libc declares sbrk only for _DEFAULT_SOURCE; the build is POSIX. */
void *sbrk(intptr_t increment);

/* xorshift32: a fixed sequence of sizes and choices, the same on every run. */
static uint32_t next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

int main(void)
{
    enum { SLOTS = 64, ROUNDS = 20000 };
    unsigned char *live[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    uint32_t s = 12345;
    unsigned long checked = 0, dirty = 0, straddling = 0, grows = 0, sbrk_moves = 0;
    size_t pages = __builtin_wasm_memory_size(0);
    uintptr_t brk = (uintptr_t)sbrk(0);
    for (int it = 0; it < ROUNDS; it++) {
        uint32_t k = next(&s) % SLOTS;
        if (live[k]) {
            /* Leave garbage behind for later blocks to reuse. */
            memset(live[k], 0xab, size[k]);
            free(live[k]);
            live[k] = NULL;
        }
        /* Mostly small blocks, a quarter up to 8 MiB, which move the break
         * and so start below and end above the old one. */
        size_t n = next(&s) % 4 == 0 ? next(&s) % (8u << 20) : next(&s) % 4096;
        if (next(&s) % 2) {
            uintptr_t before = (uintptr_t)sbrk(0);
            unsigned char *p = calloc(1, n);
            if (!p) {
                fprintf(stderr, "heap_test: out of memory at round %d\n", it);
                return 2;
            }
            straddling += (uintptr_t)p < before && (uintptr_t)p + n > before;
            for (size_t i = 0; i < n; i++)
                if (p[i]) {
                    dirty++;
                    break;
                }
            checked++;
            live[k] = p;
        } else {
            live[k] = malloc(n);
            if (live[k])
                memset(live[k], 0xcd, n);
        }
        size[k] = n;
        if (__builtin_wasm_memory_size(0) != pages) {
            pages = __builtin_wasm_memory_size(0);
            grows++;
        }
        if ((uintptr_t)sbrk(0) != brk) {
            brk = (uintptr_t)sbrk(0);
            sbrk_moves++;
        }
    }
    for (int k = 0; k < SLOTS; k++)
        free(live[k]);
    int calloc_ok = dirty == 0 && straddling > 0;
    /* Growing ahead: memory grows far less often than the break moves. */
    int grow_ok = sbrk_moves > 0 && grows * 2 <= sbrk_moves;
    printf("heap_test: %lu calloc blocks checked, %lu straddling the break, %lu not zero; "
           "break moved %lu times, memory grew %lu times: %s\n",
           checked, straddling, dirty, sbrk_moves, grows, calloc_ok && grow_ok ? "ok" : "FAILED");
    return calloc_ok && grow_ok ? 0 : 1;
}
