// Autocast(bfloat16) emulation on FP32 tensors: values are rounded to BF16 exactly where
// torch.autocast would hold them in BF16, while the arithmetic runs in FP32 (products of two
// BF16 values are exact in FP32, so only the accumulation order differs from a BF16 GEMM).
#pragma once

#include <torch/types.h>

namespace rwd::train {

// x rounded to the nearest BF16 (ties to even), returned as FP32. Gradient passes through
// unchanged (the consumer's backward has already rounded it where autocast would).
torch::Tensor round_bf16(const torch::Tensor& x);

// y = x W^T. low: W rounded to BF16 (autocast's cast; x arrives rounded by its producer, so
// a promoted producer feeds FP32 values), FP32 accumulation, and
// if round_out the result rounded to BF16 (autocast returns BF16); backward mirrors autocast:
// the incoming gradient is rounded to BF16, dX = g W and dW = g^T X are computed from BF16
// operands with FP32 accumulation and rounded to BF16 (then widened into the FP32 master
// gradient). Not low: plain FP32 everywhere.
// x_bf16: the caller knows x holds BF16 values (its producer rounded them). Only then may a
// low linear on CUDA run as a tensor-core BF16 GEMM (cuBLAS, FP32 accumulation; FP32 output
// when !round_out); otherwise it runs the FP32 emulation, whose rounding points are the same.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, bool low, bool round_out,
                     bool x_bf16);

// a (..., in) BF16 times b_t (in, out) BF16 -> (..., out) FP32, accumulated in FP32 (cuBLAS on
// CUDA): with round_out the GEMM writes BF16 (autocast's result) that is then widened; without
// it, FP32 where LibTorch can (>= 2.8: mm's out_dtype), else the FP32 GEMM on the BF16 values.
torch::Tensor bf16_matmul(const torch::Tensor& a, const torch::Tensor& b_t, bool round_out);

// LayerNorm over the last dim (eps 1e-5) in the input's dtype; b: the bias, or undefined
// (none). Low: the output rounded to BF16 (the cast the next matmul makes).
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         bool low);

// The tied LM head: final LayerNorm, then x wteᵀ (B, T, V). Low: LayerNorm output, wte and
// logits rounded to BF16 (autocast's BF16 GEMM).
torch::Tensor lm_head(const torch::Tensor& x, const torch::Tensor& ln_f, const torch::Tensor& ln_f_bias,
                      const torch::Tensor& wte, bool low);

// Mean cross-entropy of logits (..., V) against targets (...), in the logits' dtype.
torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace rwd::train
