// LibTorch entry points of the attention kernels: the autograd op (CPU emulation or, under
// REWIND_CUDA, the CUDA kernels), the plain BF16 and FP32 LibTorch baselines, and SDPA.
#pragma once

#include <memory>
#include <vector>

#include <torch/types.h>

#include "kernels/attention_params.h"

namespace rwd::kernels {

struct AttentionOptions {
  float scale = 0.0f;  // alpha, usually 1/sqrt(D)
  bool causal = true;
  bool naive = false;  // materialized S (one tile), same rounding points
  int block_q = 64, block_k = 64;
  std::vector<HeadFlags> flags;  // one per head; empty means every head at the defaults
  // AttentionParams::sr_key: the call's stochastic-rounding key, sr_call_key(seed, step,
  // micro-batch, layer) (kernels/stochastic_round.h); read by heads with an sr flag only.
  uint64_t sr_key = 0;
  // CUDA: an int32 on the device, read by the forward when a capture asks for stats: 0 leaves
  // the plain BF16 heads' stats untouched (no monitors this step). The trainer's sampled
  // monitors: one graph serves both kinds of step. Undefined: stats always collected.
  torch::Tensor stats_on;
};

// Filled when passed to attention(): q, k, v, o, lse and stats in the forward, d_o and delta
// in the backward. Tensors are clones (FP32, (B,H,T,D) or (B,H,T)) owned by the capture.
struct AttentionCapture {
  torch::Tensor q, k, v, o, lse, d_o, delta;
  torch::Tensor x;  // set by the caller (the GPT block): the input the qkv projection read, (B,T,C)
  std::vector<HeadStats> stats;
  // CUDA forward: the stats stay on the device (raw HeadStats bytes) until fetch_stats(), so
  // the forward pass never waits for the GPU. Undefined on the CPU, where `stats` is filled.
  torch::Tensor stats_pending;
  bool keep_tensors = true;  // false: only `stats` is filled (cheap per-step monitors)
};

// Moves pending device stats into capture.stats (one device->host copy; waits for the
// forward that produced them). A no-op when nothing is pending.
void fetch_stats(AttentionCapture& capture);
// The same for many captures at once: their pending stats travel in one device->host copy
// (a step's layers and micro-batches: one wait instead of one per layer).
void fetch_stats(const std::vector<AttentionCapture*>& captures);

// q, k, v: FP32 (B, H, T, D), all on the CPU (emulation) or all on one CUDA device (CUDA
// kernels, REWIND_CUDA builds only). Returns FP32 (B, H, T, D) holding BF16 values except for
// o=fp32 heads. Differentiable in q, k, v. Throws c10::Error on bad shapes/dtypes/options.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionOptions& opt,
                        std::shared_ptr<AttentionCapture> capture = nullptr);

// The GPU trainer's fast path (train/fast_block.cpp): attention on the BF16 operands the
// block holds in the kernels' layout, with none of attention()'s conversions and no autograd.
// Only for plans that promote no op of any head to FP32 (bf16_attention_ok): those heads need
// FP32 twins of q, k, v, O or dO, which attention() makes. Same kernels, same bits as
// attention() on FP32 tensors holding these BF16 values. On the CPU (plumbing tests) the
// emulation runs on widened copies.
bool bf16_attention_ok(const std::vector<HeadFlags>& flags);
// qkv: (3, B, H, T, D) contiguous BF16. Returns O (B, H, T, D) BF16 and sets lse (B, H, T)
// FP32. capture (optional; keep_tensors must be false) gets the head stats as attention()'s.
torch::Tensor attention_bf16_forward(const torch::Tensor& qkv, const AttentionOptions& opt,
                                     AttentionCapture* capture, torch::Tensor& lse);
// o, d_o: (B, H, T, D) contiguous BF16. Returns dQ, dK, dV as one FP32 (3, B, H, T, D) tensor.
torch::Tensor attention_bf16_backward(const torch::Tensor& qkv, const torch::Tensor& o,
                                      const torch::Tensor& lse, const torch::Tensor& d_o,
                                      const AttentionOptions& opt);

// Plain BF16 LibTorch attention, what eager PyTorch computes under autocast: q, k, v rounded
// to BF16; S = bf16(bf16(q k^T) * scale); P = softmax(S) in FP32; O = bf16(bf16(P) v).
// Built from FP32 ops and BF16 round-trip casts, so autograd rounds the gradients at the same
// casts. The error baseline of the tests. FP32 in, FP32 out.
torch::Tensor attention_plain_bf16(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, double scale, bool causal);

// LibTorch attention math in FP32 (matmul, masked softmax, matmul): the CPU speed baseline.
torch::Tensor attention_torch_fp32(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, double scale, bool causal);

// at::scaled_dot_product_attention on BF16 copies of q, k, v (the GPU speed baseline);
// returns BF16. Needs LibTorch >= 2.0; with 1.13 it throws c10::Error.
torch::Tensor attention_sdpa(const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, bool causal);

}  // namespace rwd::kernels
