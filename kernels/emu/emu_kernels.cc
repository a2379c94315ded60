/* kernels/emu/emu_kernels.cc - kernels/cuda_kernels.cu as host C++ for the
 * cuda-emu plugin: the same source, compiled against kernels/emu/'s
 * cuda_runtime.h instead of the toolkit's. */
#include "kernels/cuda_kernels.cu"
