/* kernels/emu/emu_fiber.cc - fiber_init, fiber_switch and the stack pool of
 * emu_fiber.h. On x86-64 a switch pushes the six callee-saved registers,
 * swaps stack pointers and pops the other context's: a dozen instructions,
 * no system call (ucontext's swapcontext
 * makes a sigprocmask call per switch, which the emulator would make
 * millions of times). Other machines use ucontext. */
#include "kernels/emu/emu_fiber.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace devio_emu {

static const size_t STACK = 64 * 1024;

static size_t page()
{
    static size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return pg;
}

fiber_pool::~fiber_pool()
{
    for (const fiber_stack &s : stacks)
        munmap(s.lo - page(), s.size + page());
}

bool fiber_pool::get(size_t i, fiber_stack *out)
{
    while (stacks.size() <= i) {
        size_t len = STACK + page();
        char *m = static_cast<char *>(
            mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (m == MAP_FAILED)
            return false;
        mprotect(m, page(), PROT_NONE);
        stacks.push_back(fiber_stack{m + page(), STACK});
    }
    *out = stacks[i];
    return true;
}

bool fiber_pool::in_guard(const void *p) const
{
    const char *c = static_cast<const char *>(p);
    for (const fiber_stack &s : stacks)
        if (c >= s.lo - page() && c < s.lo)
            return true;
    return false;
}

#if defined(__x86_64__)

extern "C" void devio_emu_ctx_switch(void **save_sp, void *new_sp);

/* devio_emu_ctx_switch(save_sp, new_sp): rdi, rsi. The floating-point
 * control words are not switched: every fiber of a host thread shares its
 * environment, and device code never changes it. */
asm(".text\n"
    ".globl devio_emu_ctx_switch\n"
    ".hidden devio_emu_ctx_switch\n"
    ".type devio_emu_ctx_switch, @function\n"
    "devio_emu_ctx_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size devio_emu_ctx_switch, .-devio_emu_ctx_switch\n");

void fiber_init(fiber *f, fiber_stack s, void (*entry)())
{
    /* From the top: a zero return address for entry (it never returns),
     * entry itself for the switch's ret, then six zero registers. entry
     * starts with rsp = top - 8, as after a call. */
    uintptr_t top = ((uintptr_t)(s.lo + s.size)) & ~(uintptr_t)15;
    uint64_t *sp = reinterpret_cast<uint64_t *>(top);
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)entry;
    for (int i = 0; i < 6; i++)
        *--sp = 0;
    f->sp = sp;
}

void fiber_switch(fiber *from, fiber *to) { devio_emu_ctx_switch(&from->sp, to->sp); }

#else

/* The fallback: each fiber's ucontext_t lives at the top of its stack, the
 * scheduler's in a per-thread slot. */
static thread_local ucontext_t host_ctx;

static ucontext_t *ctx_of(fiber *f)
{
    if (!f->sp)
        f->sp = &host_ctx;
    return static_cast<ucontext_t *>(f->sp);
}

void fiber_init(fiber *f, fiber_stack s, void (*entry)())
{
    ucontext_t *uc = reinterpret_cast<ucontext_t *>(s.lo + s.size - sizeof(ucontext_t));
    uc = reinterpret_cast<ucontext_t *>((uintptr_t)uc & ~(uintptr_t)63);
    getcontext(uc);
    uc->uc_stack.ss_sp = s.lo;
    uc->uc_stack.ss_size = (size_t)((char *)uc - s.lo);
    uc->uc_link = nullptr;
    makecontext(uc, entry, 0);
    f->sp = uc;
}

void fiber_switch(fiber *from, fiber *to) { swapcontext(ctx_of(from), ctx_of(to)); }

#endif

} // namespace devio_emu
