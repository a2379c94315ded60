/* kernels/emu/emu_sample.cc - kernels/cuda_sample.cu as host C++ for the cuda-emu plugin: the
 * same source, compiled against kernels/emu/'s cuda_runtime.h. */
#include "kernels/cuda_sample.cu"
