/* cuda_backend.h - the CUDA backend: device/backend/backend.h on one NVIDIA GPU
 * through the CUDA runtime, strict numerics (device/numerics/numspec.h) bit for bit.
 * Shipped as the plugin libdevio-backend-cuda.so; linked directly only by
 * its tests. The state it creates is owned by the core through the vtable. */
#ifndef DEVIO_CUDA_BACKEND_H
#define DEVIO_CUDA_BACKEND_H

#include "device/backend/backend.h"

extern const devio_backend_ops devio_cuda_backend;

/* A CUDA runtime error (a cudaError_t, nonzero) as devio reports it:
 * DEVIO_E_DEVICE, "CUDA error in WHAT: NAME: TEXT". Returns the status. */
devio_status devio_cuda_error(int code, const char *what, devio_error *err);

#endif
