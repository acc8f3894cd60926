// RWD_HOST_DEVICE: a function compiled for the host and, under nvcc, for the device too (common
// code that kernels/cuda calls: the parameter digest's hashes, the attention block order).
#pragma once

#if defined(__CUDACC__)
#define RWD_HOST_DEVICE __host__ __device__
#else
#define RWD_HOST_DEVICE
#endif
