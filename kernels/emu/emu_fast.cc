/* kernels/emu/emu_fast.cc - kernels/cuda_fast.cu as host C++ for the cuda-emu plugin: the same
 * source, compiled against kernels/emu/'s cuda_runtime.h. */
#include "kernels/cuda_fast.cu"
