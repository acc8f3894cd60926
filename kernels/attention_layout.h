// The attention path's layout moves (the GPU trainer's fast block, train/fast_block.cpp, and the
// Python op, python/attention_ext.cpp): q, k, v into the kernels' dense (3, B, H, T, D), and dQ,
// dK, dV back in the layout of a fused qkv projection's output, so that the gradient reaches the
// projection with no transposing copy. Moves only: the bits are unchanged (FP32 values are
// rounded to nearest even, as a cast to BF16 rounds them). On a GPU our copy kernels
// (kernels/cuda/layout.h; LibTorch's strided copies ran at 0.4-2 TB/s), else LibTorch's.
#pragma once

#include <torch/types.h>

namespace rwd::kernels {

// q, k, v: BF16 (B, H, T, D), same shape and device. One dense (3, B, H, T, D) tensor. On a GPU
// in one of our copy kernels where q, k, v are the (B, H, T, D) views of a fused projection's
// (B, T, 3, H, D) output (nanoGPT's and GPT-2's c_attn) or each the transposed view of a (B, T,
// H, D) tensor (Llama's q_proj, k_proj, v_proj); otherwise torch::stack.
torch::Tensor stack_heads_bf16(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// dqkv: dense FP32 (3, B, H, T, D). The same values rounded to BF16, shape (3, B, H, T, D), with
// the strides of a (B, T, 3, H, D) buffer: dQ, dK, dV are the views of that buffer a fused qkv
// projection's output gradient is made of (on every device; python/rewind/_compiled.py's fake
// gives the same strides).
torch::Tensor qkv_grad_bf16(const torch::Tensor& dqkv);

// src FP32 or BF16, (B, T, 3, H, D) (dense) to BF16 (3, B, H, T, D) (to_heads), or dense
// (3, B, H, T, D) back to BF16 (B, T, 3, H, D).
torch::Tensor qkv_relayout(const torch::Tensor& src, int64_t B, int64_t T, int64_t H, int64_t D, bool to_heads);

// (n, x, y, d) -> (n, y, x, d), dense: the heads' transpose (B, H, T, D) <-> (B, T, H, D). On a
// GPU t must be dense BF16.
torch::Tensor swap_heads_bf16(const torch::Tensor& t);

// x: (B, H, T, D); BF16 and dense (a transposed (B, T, H, D) view moved by our copy kernel on a GPU).
torch::Tensor dense_heads_bf16(const torch::Tensor& x);

}  // namespace rwd::kernels
