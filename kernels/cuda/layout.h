// Layout copies for the GPU trainer's fast block (train/fast_block.cpp) and the Python op's BF16
// path (kernels/attention_layout.cpp). Plain C++ header, no LibTorch.
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

// FP32 rounded to BF16 (to nearest even, as LibTorch's cast) while it moves between the qkv
// GEMM's layout (B, T, 3, H, D) and the attention kernels' (3, B, H, T, D): to_heads, src is
// the former and dst the latter; else the other way (dQ, dK, dV back for the GEMMs). Each thread
// reads 32 bytes and writes 16. Needs D % 8 == 0 and 16-byte aligned pointers, else returns
// cudaErrorInvalidValue (the caller copies with LibTorch); returns 0 or a cudaError_t value.
int qkv_layout_to_bf16(const float* src, uint16_t* dst, int64_t B, int64_t T, int64_t H, int64_t D,
                       bool to_heads, void* stream);

// The same move for BF16 src (the bits unchanged): q, k, v of a fused qkv projection, (B, T, 3,
// H, D), into the attention kernels' (3, B, H, T, D) (to_heads), or back.
int qkv_layout_16bit(const uint16_t* src, uint16_t* dst, int64_t B, int64_t T, int64_t H, int64_t D,
                     bool to_heads, void* stream);

}  // namespace rwd::kernels::cuda
