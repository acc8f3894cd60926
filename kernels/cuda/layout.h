// Layout copies for the GPU trainer's fast block (train/fast_block.cpp). Plain C++ header, no
// LibTorch.
#pragma once

#include <cstdint>

namespace rwd::kernels::cuda {

// dst (n, y, x, d) = src (n, x, y, d) for contiguous 16-bit elements (BF16 bit patterns): the
// attention heads' transpose (B, H, T, D) <-> (B, T, H, D). A copy: the bits move unchanged.
// LibTorch's strided copy does this at a fraction of the memory bandwidth (the generic
// elementwise kernel, a 4-d index per element); here each thread moves 16 bytes where d is a
// multiple of 8 and both pointers are 16-byte aligned. Returns 0 or a cudaError_t value.
int swap_middle_dims_16bit(const uint16_t* src, uint16_t* dst, int64_t n, int64_t x, int64_t y,
                           int64_t d, void* stream);

}  // namespace rwd::kernels::cuda
