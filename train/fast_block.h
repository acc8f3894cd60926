// The GPT block as one autograd function over BF16 tensors: the GPU trainer's fast path.
//
// The block of model.cpp keeps activations in FP32 tensors that hold BF16 values and casts at
// every GEMM (two conversions per rounding point, an FP32 head transpose, a concatenated FP32
// dQKV), and LibTorch's autograd queues each of those ops from the host. This path computes
// the same values with the same rounding points in BF16 tensors, in one autograd node whose
// backward is written out: LayerNorm (LibTorch's kernels, FP32), the four BF16 GEMMs (the
// same cuBLAS calls as CudaBf16LinearFn), the attention kernels on a (3, B, H, T, D) BF16
// buffer, GELU and its gradient on BF16 operands (computed in FP32 and rounded once, as the
// FP32 op followed by the rounding does). On CUDA it is bitwise equal to the module path
// (GpuTrainer.FastBlockEqualsTheModulePathBitwise), so it changes no recording's bits.
#pragma once

#include <memory>

#include <torch/types.h>

#include "kernels/attention_op.h"
#include "plan/plan.h"

namespace rwd::train {

// The block's weights in nanoGPT order (no biases: the path takes none).
struct BlockWeights {
  torch::Tensor ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj;
  // The four GEMM weights' BF16 casts where the caller keeps them for the step's micro-batches
  // (GPTImpl::keep_bf16_weights); undefined: cast here.
  torch::Tensor c_attn_b, c_proj_b, c_fc_b, mlp_proj_b;
};

// Whether `fast_block` computes this layer: every module low, no biases, no head promoting an
// attention op to FP32, no tensor capture. Other layers take the module path.
bool fast_block_applies(const plan::LayerPlan& lp, bool has_bias,
                        const kernels::AttentionCapture* capture);

// x: (B, T, C) FP32 residual stream -> the block's output, differentiable in x and the weights.
torch::Tensor fast_block(const torch::Tensor& x, const BlockWeights& w, int n_head,
                         const kernels::AttentionOptions& opt,
                         std::shared_ptr<kernels::AttentionCapture> capture);

// The tied LM head as one node over BF16 tensors: final LayerNorm (FP32, rounded once), then
// the BF16 logits x wte^T (B, T, V), not widened. Bitwise the module path's lm_head on CUDA.
// wte_b: wte's BF16 cast where the caller keeps it (undefined: cast here).
torch::Tensor fast_head(const torch::Tensor& x, const torch::Tensor& ln_f, const torch::Tensor& wte,
                        const torch::Tensor& wte_b = {});

// Mean cross-entropy of BF16 logits (..., V) against int64 targets (...), in FP32, with the
// gradient written in BF16 (kernels/cuda/cross_entropy.h: one pass over the logits each way
// instead of autocast's FP32 copy, log_softmax and cast back). Same rounding points as the
// module path's FP32 cross-entropy; its sums run in another order (numerics 3 on CUDA). On the
// CPU the same math runs as LibTorch ops (plumbing tests).
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace rwd::train
