// GPT-2 in LibTorch (nanoGPT layout: pre-LayerNorm blocks, GELU MLP 4x, tied head, biases
// only with Config::bias) whose attention and BF16 rounding points follow a per-layer/head/op precision plan.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <memory>
#include <vector>

#include "kernels/attention_op.h"
#include "train/config.h"
#include "plan/plan.h"

namespace rwd::train {

// What a forward pass hands back besides the logits: per-layer attention captures (stats
// always; tensors only for the layers listed in `tensor_layers`).
// Which attention runs inside the blocks: ours (the precision plan's kernels), PyTorch's
// scaled_dot_product_attention (LibTorch >= 2, the GPU speed baseline), or plain LibTorch
// FP32 attention math (the CPU cost baseline). The baselines take no precision plan.
enum class AttentionImpl { kRewind, kSdpa, kTorchMath };

// Whether a block runs as train/fast_block.cpp's one BF16 autograd node where its plan allows
// (every module low, no head promoting an attention op, no bias, no tensor capture): kAuto on
// CUDA tensors (bitwise equal to the module path there), kOn on any device (the CPU plumbing
// test: there the module path's FP32 GEMM emulation differs in accumulation), kOff never.
// REWIND_FAST_BLOCK=0 in the environment gives kOff (the before/after benchmark).
// The same switch, set_fused_loss, picks the loss: the BF16 head and fused cross-entropy of
// fast_block.h unless the head is FP32 (REWIND_FUSED_LOSS=0: the module path's FP32 loss,
// numerics 2 on CUDA).
enum class FastPath { kAuto, kOn, kOff };

struct ForwardTap {
  std::vector<int> tensor_layers;  // layers whose q, k, v, o, lse, dO, delta are kept
  std::vector<std::shared_ptr<kernels::AttentionCapture>> layers;  // filled, n_layer entries
};

// Where a model's parameters are allocated: on the CPU and filled (init_weights then draws the
// same weights on every device), or on the device and uninitialized, for a restore whose
// checkpoint overwrites every one of them (Trainer::load_state is strict).
struct ParamAlloc {
  torch::Device device = torch::kCPU;
  bool filled = true;
};

class BlockImpl : public torch::nn::Module {
 public:
  // `alloc`: where the parameters live and whether they are filled (ones and zeros, as
  // nanoGPT's init starts) or left uninitialized for a checkpoint to overwrite.
  BlockImpl(const Config& c, int layer, const ParamAlloc& alloc = {});
  // x: (B, T, C) FP32 residual stream.
  torch::Tensor forward(const torch::Tensor& x, const plan::Plan& plan,
                        std::shared_ptr<kernels::AttentionCapture> capture);

  AttentionImpl impl = AttentionImpl::kRewind;
  FastPath fast = FastPath::kAuto;
  torch::Tensor stats_on;  // GPTImpl::set_stats_flag
  uint64_t sr_key = 0;     // GPTImpl::set_sr_micro_batch: this layer's stochastic-rounding key
  torch::Tensor ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj;  // weights, nanoGPT order
  // Biases ("<weight>_bias"), registered only when Config::bias; undefined otherwise.
  torch::Tensor ln_1_bias, c_attn_bias, c_proj_bias, ln_2_bias, c_fc_bias, mlp_proj_bias;
  // GPTImpl::keep_bf16_weights: whether the fast block keeps its weights' BF16 casts in
  // `bf16` (c_attn, c_proj, c_fc, mlp_proj) from the first micro-batch to the last.
  bool keep_bf16 = false;
  std::array<torch::Tensor, 4> bf16;

 private:
  int layer_, n_head_, n_embd_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const Config& c, const ParamAlloc& alloc = {});
  // idx: (B, T) int64 -> logits (B, T, V) FP32 (BF16 values unless the head is FP32).
  torch::Tensor forward(const torch::Tensor& idx, const plan::Plan& plan, ForwardTap* tap);
  // Mean cross-entropy in FP32.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets,
                     const plan::Plan& plan, ForwardTap* tap);
  // nanoGPT init from a seeded generator: N(0, 0.02), residual projections
  // N(0, 0.02/sqrt(2 n_layer)), LayerNorm weights 1.
  void init_weights(uint64_t seed);
  // W_Q of one head: rows [h*D, (h+1)*D) of c_attn, shape (D, C).
  torch::Tensor wq_slice(int layer, int head) const;
  const torch::Tensor& layer_c_attn(int layer) const { return blocks_[layer]->c_attn; }

  const Config& config() const { return config_; }
  void set_attention_impl(AttentionImpl impl);
  void set_fast_path(FastPath fast);
  void set_fused_loss(FastPath fused) { fused_loss_ = fused; }
  // Sampled monitors (Trainer::set_monitor_every): every block's attention reads this device
  // int32 when it collects stats, 0 meaning "not this step" (kernels::AttentionOptions).
  void set_stats_flag(const torch::Tensor& flag);
  // The micro-batch the next forward computes: each layer's attention gets the stochastic-
  // rounding key sr_call_key(seed, step, micro, layer) (kernels/stochastic_round.h), so the
  // pv=sr / acc=sr / qk=sr heads of a replay draw the recording's bits.
  void set_sr_micro_batch(uint64_t seed, int64_t step, int64_t micro);
  // Between keep_bf16_weights(true) and (false), the fast block and head cast each GEMM weight
  // to BF16 once and reuse the cast in every later forward (the same values while the weights
  // stay unchanged: the trainer brackets one step's micro-batches, before its update). A step
  // of A micro-batches then casts the weights once, not A times (gpt2-small: 124M parameters
  // read and written as BF16, 49 launches, a micro-batch). false drops the casts.
  void keep_bf16_weights(bool on);
  torch::Tensor wte, wpe, ln_f;
  torch::Tensor ln_f_bias;  // only when Config::bias
  torch::nn::ModuleList h;

 private:
  // Embeddings and blocks: the final residual stream (B, T, C) FP32.
  torch::Tensor trunk(const torch::Tensor& idx, const plan::Plan& plan, ForwardTap* tap);

  Config config_;
  std::vector<Block> blocks_;
  FastPath fused_loss_ = FastPath::kAuto;
  bool keep_bf16_ = false;
  torch::Tensor wte_bf16_;  // wte's kept cast (keep_bf16_weights)
};
TORCH_MODULE(GPT);

// keep_bf16_weights(true) for this object's life when `want` (the trainer: one step's
// micro-batches), false again however the step ends. REWIND_BF16_WEIGHT_CACHE=0 keeps none: a
// cast per micro-batch, as before (an A/B switch: the same values either way).
class KeepBf16Weights {
 public:
  KeepBf16Weights(GPT& model, bool want);
  ~KeepBf16Weights();
  KeepBf16Weights(const KeepBf16Weights&) = delete;
  KeepBf16Weights& operator=(const KeepBf16Weights&) = delete;

 private:
  GPT& model_;
  bool on_ = false;
};

}  // namespace rwd::train
