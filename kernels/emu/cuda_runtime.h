/* kernels/emu/cuda_runtime.h - what a .cu file of kernels/ sees in the
 * emulated build: the runtime API (cuda_runtime_api.h) and, in C++, the
 * device side (emu_device.h): qualifiers, built-in variables, warp
 * collectives, barriers, shared memory, atomics and intrinsics. */
#ifndef DEVIO_EMU_CUDA_RUNTIME_H
#define DEVIO_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "emu_device.h"
#endif

#endif
