/* kernels/emu/emu_internal.h - what the emulator's runtime (emu_runtime.cc
 * and the files it names: memory, streams, events, errors, faults on
 * request) and its executor (emu_block.cc: blocks of fibers, collectives,
 * barriers, shared memory and its race detector) say to each other.
 * Private to kernels/emu/. */
#ifndef DEVIO_EMU_INTERNAL_H
#define DEVIO_EMU_INTERNAL_H

#include <stddef.h>

#include <memory>
#include <string>

#include "kernels/emu/emu_device.h"

namespace devio_emu {

/* A queued kernel launch; owns its arguments. */
struct launch_rec {
    std::string name;
    const void *func;
    dim3 grid, block;
    size_t smem;
    std::unique_ptr<call> args;
};

/* Runs every block of L on this host thread. cudaSuccess, or the error of
 * a fault in device code (already reported with record_fault). */
cudaError_t run_launch(const launch_rec &L);

/* Keeps msg as the report that cudaGetErrorString gives for code and
 * prints it on stderr ("devio-emu: ..."). */
void record_fault(cudaError_t code, const char *msg);

/* What a faulting address is, for the report of a fault in device code:
 * "N bytes past the end of a buffer of M bytes", "a freed buffer", ...;
 * false when the emulator knows nothing of it. */
bool describe_address(const void *addr, char *buf, size_t n);

/* Installs the handler that turns a fault of device code (a guard page, a
 * freed buffer, a wild pointer) into a report and a sticky error. */
void install_fault_handler();

/* DEVIO_EMU_ORDER=reverse runs a block's threads last to first between
 * barriers (a schedule that exposes missing barriers differently). */
bool reverse_order();

} // namespace devio_emu

#endif
