/* kernels/emu/emu_block.cc - the emulator's executor: a launch's blocks one
 * after another on the calling host thread, each block's threads as fibers.
 * A thread runs until it reaches a warp collective, __syncthreads or its
 * end; when no thread can run, every collective whose mask's lanes have all
 * arrived completes (the lanes' values exchanged at once, so a warp's 32
 * lanes are in lockstep there), and when only barrier waiters are left the
 * barrier opens. What a GPU would fault on, or leave undefined, is reported
 * with the kernel, block and thread and becomes the context's sticky error:
 * a collective that part of its warp never reaches (a lane exited, waits at
 * __syncthreads or at another collective), a mask that leaves out the
 * calling lane or names lanes the block lacks, a shuffle from a lane outside
 * the mask, shared memory out of bounds or raced on (a word written by one
 * thread and read or written by another with no barrier between: the block's
 * __syncthreads, or a full-warp __syncwarp for lanes of one warp), a
 * misaligned vector access, and any memory fault of device code (guard pages
 * around every device buffer, freed buffers kept inaccessible). */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <utility>
#include <vector>

#include "kernels/emu/emu_fiber.h"
#include "kernels/emu/emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace devio_emu {

/* Kernels run only under the runtime's lock (emu_runtime.cc), one host
 * thread at a time: the thread running now and the executor are plain
 * globals, which every host thread that runs kernels shares in turn. */
ctx *cur;

namespace {

enum { T_RUN, T_BAR, T_COLL, T_DONE };

const size_t STATIC_SHARED_MAX = 48 * 1024;

struct ethread : ctx {
    fiber f;
    fiber_stack stack;
    unsigned lin, lane, warp;
    int state;
    int ck;
    unsigned cmask;
    uint32_t cval, cres;
    int cparam, cwidth;
    void *fake;
};

/* Who touched a shared word last, in which barrier interval: the block's
 * barrier count and the warp's full-warp __syncwarp count at the time. */
struct access {
    int32_t tid;
    uint32_t bar, ws;
};
struct word_rec {
    access w;    /* the last write */
    access r[2]; /* the last read, and an earlier one by another thread */
};

const access NONE = {-1, 0, 0};

struct executor {
    fiber_pool pool;
    std::vector<ethread> t;
    fiber sched;
    const launch_rec *L = nullptr;
    uint3 bidx{0, 0, 0};
    unsigned n = 0, n_warps = 0;
    std::vector<char> smem;
    size_t smem_used = 0;
    std::vector<std::pair<const void *, size_t>> sites;
    std::vector<word_rec> shadow;
    uint32_t bar = 0;
    std::vector<uint32_t> ws;
    ethread *running = nullptr;
    sigjmp_buf jb;
    volatile bool in_kernel = false;
    cudaError_t code = cudaSuccess;
    const void *sched_lo = nullptr;
    size_t sched_size = 0;
    void *sched_fake = nullptr;
};

executor *X;

const char *coll_name(int k)
{
    static const char *names[] = {"__syncwarp",       "__shfl_sync",      "__shfl_xor_sync",
                                  "__shfl_down_sync", "__shfl_up_sync",   "__ballot_sync",
                                  "__any_sync",       "__all_sync"};
    return k >= 0 && k < 8 ? names[k] : "a collective";
}

uint3 idx_of(const executor *x, unsigned lin)
{
    const dim3 &b = x->L->block;
    return uint3{lin % b.x, lin / b.x % b.y, lin / (b.x * b.y)};
}

/* "kernel K, block (..), thread (..): what" into the report. */
void report(executor *x, const ethread *t, cudaError_t code, const char *what)
{
    char msg[700];
    const launch_rec &L = *x->L;
    if (t)
        snprintf(msg, sizeof msg,
                 "kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), thread (%u,%u,%u) of block "
                 "(%u,%u,%u): %s",
                 L.name.c_str(), x->bidx.x, x->bidx.y, x->bidx.z, L.grid.x, L.grid.y, L.grid.z,
                 t->thread_idx.x, t->thread_idx.y, t->thread_idx.z, L.block.x, L.block.y,
                 L.block.z, what);
    else
        snprintf(msg, sizeof msg, "kernel %s, block (%u,%u,%u) of grid (%u,%u,%u): %s",
                 L.name.c_str(), x->bidx.x, x->bidx.y, x->bidx.z, L.grid.x, L.grid.y, L.grid.z,
                 what);
    record_fault(code, msg);
    if (x->code == cudaSuccess)
        x->code = code;
}

void switch_in(executor *x, ethread *t)
{
    x->running = t;
    cur = t;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&x->sched_fake, t->stack.lo, t->stack.size);
#endif
    fiber_switch(&x->sched, &t->f);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(x->sched_fake, nullptr, nullptr);
#endif
    x->running = nullptr;
    cur = nullptr;
}

/* From a fiber back to its block's scheduler; `last` when it never resumes. */
void yield_out(bool last)
{
    executor *x = X;
    ethread *t = x->running;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(last ? nullptr : &t->fake, x->sched_lo, x->sched_size);
#else
    (void)last;
#endif
    fiber_switch(&t->f, &x->sched);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(t->fake, nullptr, nullptr);
#endif
}

/* From fiber `from` straight to fiber `to` of the same warp. */
void hand_to(executor *x, ethread *from, ethread *to, bool last)
{
    x->running = to;
    cur = to;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(last ? nullptr : &from->fake, to->stack.lo, to->stack.size);
#else
    (void)last;
#endif
    fiber_switch(&from->f, &to->f);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(from->fake, nullptr, nullptr);
#endif
}

bool resolve_warp(executor *x, unsigned w, bool *progressed);

/* Thread t has stopped (at a collective or a barrier, or `last`: it ended).
 * The next runnable lane of its warp, in ring order, runs next, so that a
 * warp's lanes reach a collective one after another without the scheduler;
 * when none is left the warp's collectives are completed here, and t goes
 * on at once if its own was. Only a warp with nothing left to run goes back
 * to the scheduler. Returns when t runs again. */
void park(ethread *t, bool last)
{
    executor *x = X;
    unsigned base = t->warp * 32, cnt = x->n - base < 32 ? x->n - base : 32;
    for (;;) {
        for (unsigned k = 1; k < cnt; k++) {
            ethread *o = &x->t[base + (t->lane + k) % cnt];
            if (o->state == T_RUN) {
                hand_to(x, t, o, last);
                return;
            }
        }
        bool progressed = false;
        if (!resolve_warp(x, t->warp, &progressed) || !progressed)
            break;
        if (t->state == T_RUN)
            return;
    }
    yield_out(last);
}

void fiber_entry()
{
    executor *x = X;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    x->L->args->run();
    ethread *t = x->running;
    t->state = T_DONE;
    park(t, true);
    abort(); /* a finished fiber is never resumed */
}

bool sched_fail(executor *x, const ethread *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool sched_fail(executor *x, const ethread *t, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    report(x, t, cudaErrorLaunchFailure, what);
    return false;
}

/* Completes every collective of warp w whose lanes have all arrived. False
 * with x->code set when one is malformed. */
bool resolve_warp(executor *x, unsigned w, bool *progressed)
{
    unsigned base = w * 32, cnt = x->n - base < 32 ? x->n - base : 32;
    unsigned exists = cnt == 32 ? 0xffffffffu : (1u << cnt) - 1;
    for (unsigned l = 0; l < cnt; l++) {
        ethread &a = x->t[base + l];
        if (a.state != T_COLL)
            continue;
        unsigned m = a.cmask;
        const char *name = coll_name(a.ck);
        if (!(m >> l & 1u))
            return sched_fail(x, &a, "%s with mask 0x%08x, which leaves out the calling lane %u",
                              name, m, l);
        if (m & ~exists)
            return sched_fail(x, &a,
                              "%s with mask 0x%08x names lanes the block lacks (its warp %u has "
                              "%u threads)",
                              name, m, w, cnt);
        int width = a.cwidth;
        if (width <= 0 || width > 32 || (width & (width - 1)))
            return sched_fail(x, &a, "%s with width %d", name, width);
        for (unsigned j = 0; j < 32; j++) {
            if (!(m >> j & 1u))
                continue;
            const ethread &b = x->t[base + j];
            if (b.state == T_COLL && b.ck == a.ck && b.cmask == m && b.cwidth == width)
                continue;
            if (b.state == T_DONE)
                return sched_fail(x, &a,
                                  "%s with mask 0x%08x is reached by part of the warp: lane %u "
                                  "has exited",
                                  name, m, j);
            if (b.state == T_BAR)
                return sched_fail(x, &a,
                                  "%s with mask 0x%08x is reached by part of the warp: lane %u "
                                  "waits at __syncthreads",
                                  name, m, j);
            return sched_fail(x, &a,
                              "lanes of warp %u disagree: lane %u is at %s with mask 0x%08x, "
                              "lane %u at %s with mask 0x%08x",
                              w, l, name, m, j, coll_name(b.ck), b.cmask);
        }
        unsigned ballot = 0;
        for (unsigned j = 0; j < 32; j++)
            if ((m >> j & 1u) && x->t[base + j].cval)
                ballot |= 1u << j;
        for (unsigned j = 0; j < 32; j++) {
            if (!(m >> j & 1u))
                continue;
            ethread &b = x->t[base + j];
            unsigned seg = j & ~(unsigned)(width - 1), src = j;
            switch (b.ck) {
            case COLL_SHFL_IDX: src = seg + ((unsigned)b.cparam & (unsigned)(width - 1)); break;
            case COLL_SHFL_XOR: src = j ^ (unsigned)b.cparam; break;
            case COLL_SHFL_DOWN: src = j + (unsigned)b.cparam; break;
            case COLL_SHFL_UP: src = j - (unsigned)b.cparam; break;
            default: break;
            }
            if (src >= 32 || (src & ~(unsigned)(width - 1)) != seg)
                src = j; /* outside the lane's segment: its own value, as on the GPU */
            if (!(m >> src & 1u))
                return sched_fail(x, &b, "%s: lane %u reads lane %u, which is not in mask 0x%08x",
                                  name, j, src, m);
            switch (b.ck) {
            case COLL_BALLOT: b.cres = ballot; break;
            case COLL_ANY: b.cres = ballot != 0; break;
            case COLL_ALL: b.cres = ballot == m; break;
            case COLL_SYNC: b.cres = 0; break;
            default: b.cres = x->t[base + src].cval; break;
            }
        }
        for (unsigned j = 0; j < 32; j++)
            if (m >> j & 1u)
                x->t[base + j].state = T_RUN;
        if (a.ck == COLL_SYNC && m == exists)
            x->ws[w]++;
        *progressed = true;
    }
    return true;
}

/* The first thread stuck at a collective, for a block that cannot go on. */
bool stuck(executor *x)
{
    for (unsigned i = 0; i < x->n; i++) {
        const ethread &a = x->t[i];
        if (a.state == T_COLL)
            return sched_fail(x, &a,
                              "%s with mask 0x%08x never completes: lanes of its mask wait at "
                              "__syncthreads or have exited",
                              coll_name(a.ck), a.cmask);
    }
    return sched_fail(x, nullptr, "the block cannot go on");
}

bool run_block(executor *x, uint3 b)
{
    const launch_rec &L = *x->L;
    x->bidx = b;
    for (unsigned i = 0; i < x->n; i++) {
        ethread &t = x->t[i];
        t.thread_idx = idx_of(x, i);
        t.block_idx = b;
        t.block_dim = L.block;
        t.grid_dim = L.grid;
        t.lin = i;
        t.lane = i % 32;
        t.warp = i / 32;
        t.state = T_RUN;
        t.fake = nullptr;
        if (!x->pool.get(i, &t.stack))
            return sched_fail(x, nullptr, "out of host memory for %u emulated threads", x->n);
#ifdef EMU_ASAN
        ASAN_UNPOISON_MEMORY_REGION(t.stack.lo, t.stack.size);
#endif
        fiber_init(&t.f, t.stack, fiber_entry);
    }
    /* Shared memory starts as NaN bits: a read of what no thread wrote shows. */
    memset(x->smem.data(), 0xff, L.smem);
    x->smem_used = L.smem;
    x->sites.clear();
    x->shadow.assign((L.smem + 3) / 4, word_rec{NONE, {NONE, NONE}});
    x->bar = 0;
    x->ws.assign(x->n_warps, 0);
    bool rev = reverse_order();
    if (sigsetjmp(x->jb, 1)) { /* a memory fault of device code (on_fault) */
        x->in_kernel = false;
#ifdef EMU_ASAN
        /* Back on the scheduler's stack without a switch: say so. */
        __sanitizer_start_switch_fiber(nullptr, x->sched_lo, x->sched_size);
        __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
        x->running = nullptr;
        cur = nullptr;
        return false;
    }
    x->in_kernel = true;
    for (;;) {
        for (unsigned k = 0; k < x->n; k++) {
            ethread *t = &x->t[rev ? x->n - 1 - k : k];
            if (t->state != T_RUN)
                continue;
            switch_in(x, t);
            if (x->code != cudaSuccess) {
                x->in_kernel = false;
                return false;
            }
        }
        bool progressed = false, ok = true;
        for (unsigned w = 0; w < x->n_warps && ok; w++)
            ok = resolve_warp(x, w, &progressed);
        if (!ok)
            break;
        if (progressed)
            continue;
        unsigned live = 0, at_bar = 0;
        for (unsigned i = 0; i < x->n; i++) {
            live += x->t[i].state != T_DONE;
            at_bar += x->t[i].state == T_BAR;
        }
        if (live == 0)
            break;
        if (at_bar == live) {
            for (unsigned i = 0; i < x->n; i++)
                if (x->t[i].state == T_BAR)
                    x->t[i].state = T_RUN;
            x->bar++;
            continue;
        }
        stuck(x);
        break;
    }
    x->in_kernel = false;
    return x->code == cudaSuccess;
}

void on_fault(int sig, siginfo_t *si, void *uc);
struct sigaction old_segv, old_bus;

void on_fault(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    executor *x = X;
    if (x && x->in_kernel && x->running) {
        char what[300], addr[220];
        if (x->pool.in_guard(si->si_addr))
            snprintf(addr, sizeof addr, "%p, the guard page below an emulated thread's stack "
                     "(stack overflow)", si->si_addr);
        else if (!describe_address(si->si_addr, addr, sizeof addr))
            snprintf(addr, sizeof addr, "%p, which is no device memory", si->si_addr);
        snprintf(what, sizeof what, "illegal address: %s", addr);
        report(x, x->running, cudaErrorIllegalAddress, what);
        siglongjmp(x->jb, 1);
    }
    /* Not emulated device code: the handler before ours decides, at the
     * fault's next occurrence (the instruction runs again on return). */
    sigaction(sig, sig == SIGSEGV ? &old_segv : &old_bus, nullptr);
}

} // namespace

#ifdef EMU_ASAN
/* AddressSanitizer's report of device code says where in the launch it was. */
void asan_context(const char *report)
{
    (void)report;
    executor *x = X;
    if (x && x->in_kernel && x->running) {
        const ethread *t = x->running;
        fprintf(stderr, "devio-emu: the report above is from kernel %s, block (%u,%u,%u), "
                "thread (%u,%u,%u)\n", x->L->name.c_str(), x->bidx.x, x->bidx.y, x->bidx.z,
                t->thread_idx.x, t->thread_idx.y, t->thread_idx.z);
    }
}
#endif

/* At every launch: the process (a test harness, a sanitizer) may have put
 * its own handler in since; that one is kept as the one to fall back to. */
void install_fault_handler()
{
    struct sigaction sa, now;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    int sigs[2] = {SIGSEGV, SIGBUS};
    struct sigaction *olds[2] = {&old_segv, &old_bus};
    for (int i = 0; i < 2; i++)
        if (sigaction(sigs[i], nullptr, &now) == 0 && now.sa_sigaction != on_fault)
            sigaction(sigs[i], &sa, olds[i]);
#ifdef EMU_ASAN
    __asan_set_error_report_callback(asan_context);
#endif
}

cudaError_t run_launch(const launch_rec &L)
{
    /* One executor, made at the first launch and kept. */
    if (!X)
        X = new executor;
    executor *x = X;
    /* Set up once on each host thread that runs kernels: faults are handled
     * on their own stack (a fiber's may be the one that overflowed), and
     * under AddressSanitizer the scheduler's stack is the thread's own. */
    static thread_local bool ready;
    static thread_local void *stack_lo;
    static thread_local size_t stack_size;
    if (!ready) {
        stack_t old;
        if (sigaltstack(nullptr, &old) == 0 && (old.ss_flags & SS_DISABLE)) {
            /* none yet (a sanitizer's runtime may have set one: it stays) */
            size_t alt = 64 * 1024;
            stack_t ss;
            ss.ss_sp = malloc(alt);
            ss.ss_size = alt;
            ss.ss_flags = 0;
            if (ss.ss_sp)
                sigaltstack(&ss, nullptr);
        }
#ifdef EMU_ASAN
        pthread_attr_t at;
        if (pthread_getattr_np(pthread_self(), &at) == 0) {
            pthread_attr_getstack(&at, &stack_lo, &stack_size);
            pthread_attr_destroy(&at);
        }
#endif
        ready = true;
    }
    x->sched_lo = stack_lo;
    x->sched_size = stack_size;
    install_fault_handler();
    x->L = &L;
    x->code = cudaSuccess;
    x->n = L.block.x * L.block.y * L.block.z;
    x->n_warps = (x->n + 31) / 32;
    if (x->t.size() < x->n)
        x->t.resize(x->n);
    if (x->smem.size() < L.smem + STATIC_SHARED_MAX)
        x->smem.resize(L.smem + STATIC_SHARED_MAX);
    for (unsigned z = 0; z < L.grid.z; z++)
        for (unsigned y = 0; y < L.grid.y; y++)
            for (unsigned bx = 0; bx < L.grid.x; bx++)
                if (!run_block(x, uint3{bx, y, z}))
                    return x->code;
    return cudaSuccess;
}

/* ---- what device code calls (emu_device.h) ---- */

uint32_t collective(int kind, unsigned mask, uint32_t value, int param, int width)
{
    ethread *t = X->running;
    t->ck = kind;
    t->cmask = mask;
    t->cval = value;
    t->cparam = param;
    t->cwidth = width;
    t->state = T_COLL;
    park(t, false);
    return t->cres;
}

void barrier()
{
    ethread *t = X->running;
    t->state = T_BAR;
    park(t, false);
}

void device_fault(cudaError_t code, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    executor *x = X;
    if (!x || !x->running) {
        fprintf(stderr, "devio-emu: %s (outside device code)\n", what);
        abort();
    }
    report(x, x->running, code, what);
    x->running->state = T_DONE;
    yield_out(true);
    abort(); /* never resumed */
}

namespace {

bool ordered(const executor *x, const ethread *t, const access &a)
{
    return a.tid < 0 || a.tid == (int32_t)t->lin || a.bar != x->bar ||
           ((unsigned)a.tid / 32 == t->warp && a.ws != x->ws[t->warp]);
}

[[noreturn]] void race(executor *x, bool write, const access &other, bool other_wrote,
                       size_t off)
{
    uint3 o = idx_of(x, (unsigned)other.tid);
    device_fault(cudaErrorLaunchFailure,
         "shared memory race: this thread %s the word at byte %zu, which thread (%u,%u,%u) %s "
         "with no barrier between",
         write ? "writes" : "reads", off, o.x, o.y, o.z, other_wrote ? "wrote" : "read");
}

} // namespace

void shared_access(const void *addr, size_t n, bool write)
{
    executor *x = X;
    ethread *t = x->running;
    const char *p = static_cast<const char *>(addr), *lo = x->smem.data();
    if (p < lo || p + n > lo + x->smem_used)
        device_fault(cudaErrorIllegalAddress,
             "shared memory %s of %zu bytes at offset %td, outside the block's %zu bytes",
             write ? "write" : "read", n, p - lo, x->smem_used);
    size_t off = (size_t)(p - lo);
    uint32_t ws = x->ws[t->warp];
    for (size_t w = off / 4; w < (off + n + 3) / 4; w++) {
        word_rec &r = x->shadow[w];
        if (!ordered(x, t, r.w))
            race(x, write, r.w, true, w * 4);
        if (write) {
            for (const access &a : r.r)
                if (!ordered(x, t, a))
                    race(x, true, a, false, w * 4);
            r.w = access{(int32_t)t->lin, x->bar, ws};
            r.r[0] = r.r[1] = NONE;
        } else {
            if (r.r[0].tid != (int32_t)t->lin)
                r.r[1] = r.r[0];
            r.r[0] = access{(int32_t)t->lin, x->bar, ws};
        }
    }
}

void *dyn_shared_base() { return X->smem.data(); }

void *static_shared(size_t bytes, size_t align, const void *site)
{
    executor *x = X;
    for (const auto &s : x->sites)
        if (s.first == site)
            return x->smem.data() + s.second;
    size_t off = (x->smem_used + align - 1) / align * align;
    if (off + bytes - x->L->smem > STATIC_SHARED_MAX)
        device_fault(cudaErrorInvalidValue, "static shared memory above %zu bytes", STATIC_SHARED_MAX);
    memset(x->smem.data() + off, 0xff, bytes);
    x->smem_used = off + bytes;
    x->shadow.resize((x->smem_used + 3) / 4, word_rec{NONE, {NONE, NONE}});
    x->sites.emplace_back(site, off);
    return x->smem.data() + off;
}

} // namespace devio_emu
