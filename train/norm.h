// LayerNorm (no bias) on the GPU through rewind's kernels (kernels/cuda/layer_norm.h): the
// residual add before it and the BF16 casts around it fused in, and a deterministic weight
// gradient. The fast block, the fast head and the module path's layer_norm (mixed.cpp) all
// compute their GPU LayerNorms here when the kernels apply, so the three give the same bits.
// Numerics 5 and 6 (run_spec.cpp); earlier recordings replay with LibTorch's LayerNorm.
#pragma once

#include <torch/types.h>

namespace rwd::train {

// nanoGPT's LayerNorm epsilon: every LayerNorm of the model, LibTorch's or the kernels'.
constexpr double kLayerNormEps = 1e-5;

// Process-wide: whether GPU LayerNorms run the kernels. Starts as REWIND_FUSED_NORM says (0 or
// 1; unset: on); a replay follows the recording's numerics unless the variable is set.
bool fused_norm();
void set_fused_norm(bool on);
bool fused_norm_from_env();

// Whether the kernels compute LayerNorm(x) with this weight and bias: a CUDA build, x FP32 on a
// GPU, no bias, fused_norm(), a width the kernels take.
bool norm_kernels_apply(const torch::Tensor& x, const torch::Tensor& bias);

struct NormForward {
  torch::Tensor y;           // x + residual (FP32), where a residual was given
  torch::Tensor out;         // LayerNorm(y) * w: BF16 (rounded once) or FP32
  torch::Tensor mean, rstd;  // FP32, for norm_backward
  bool kernels = false;      // computed by the kernels (else by LibTorch): norm_backward's `kernels`
};
// x: (..., C) FP32; residual: undefined or x's shape in BF16. The kernels where they apply
// (norm_kernels_apply), else LibTorch's LayerNorm (the add, then the rounding, as separate ops).
NormForward norm_forward(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& w, bool bf16_out);

struct NormBackward {
  torch::Tensor dx;       // residual + LayerNorm's input gradient, FP32, x's shape
  torch::Tensor dx_bf16;  // dx rounded to BF16, where asked for
  torch::Tensor dw;       // (C) FP32
};
// g: the output's gradient, x's shape, FP32 or BF16; residual: undefined or FP32 of x's shape.
// x: the normalized input (norm_forward's y where it had a residual); kernels: the forward's.
NormBackward norm_backward(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& mean,
                           const torch::Tensor& rstd, const torch::Tensor& w, const torch::Tensor& residual,
                           bool want_bf16, bool kernels);

// LayerNorm(x) * w in FP32 as an autograd op over the kernels (the module path's).
torch::Tensor norm_module(const torch::Tensor& x, const torch::Tensor& w);

}  // namespace rwd::train
