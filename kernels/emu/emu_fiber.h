/* kernels/emu/emu_fiber.h - the emulator's lightweight contexts: one per
 * emulated thread of a block, each on its own stack, switched by saving
 * and restoring the callee-saved registers (x86-64; ucontext elsewhere).
 * A stack is owned by its fiber_pool, which keeps them for reuse across
 * blocks and launches of one host thread; each has a guard page below it. */
#ifndef DEVIO_EMU_FIBER_H
#define DEVIO_EMU_FIBER_H

#include <stddef.h>

#include <vector>

namespace devio_emu {

struct fiber_stack {
    char *lo;    /* lowest usable byte; the guard page is just below */
    size_t size; /* usable bytes */
};

/* A context: what emu_fiber_switch saves and restores. */
struct fiber {
    void *sp = nullptr; /* saved stack pointer (x86-64) or ucontext_t* */
};

/* Makes f start entry() on stack s at its next switch-in. entry never returns. */
void fiber_init(fiber *f, fiber_stack s, void (*entry)());
/* Saves the running context in from and resumes to. */
void fiber_switch(fiber *from, fiber *to);

/* Stacks of one host thread, reused; grown to the largest block seen. */
struct fiber_pool {
    std::vector<fiber_stack> stacks;
    ~fiber_pool();
    /* Stack i (made on first use); false when memory ran out. */
    bool get(size_t i, fiber_stack *out);
    /* Whether p lies in the guard page of one of the stacks. */
    bool in_guard(const void *p) const;
};

} // namespace devio_emu

#endif
