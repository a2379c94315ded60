/* kernels/emu/emu_ssm.cc - kernels/cuda_ssm.cu as host C++ for the cuda-emu
 * plugin: the same source, compiled against kernels/emu/'s cuda_runtime.h. */
#include "kernels/cuda_ssm.cu"
