// The optimizer's end of a training step on the GPU in two launches per 128 tensors: the global
// gradient norm (deterministic FP64 sum of squares) and one AdamW pass (clip scale, decoupled
// weight decay, both moments and the parameter update) that reads each of p, g, m, v once.
// LibTorch's multi-tensor ops (`_foreach_*`) make nine passes over the 2 GB of gpt2-small's
// optimizer state instead. Plain C++ header, no LibTorch.
#pragma once

#include <cstdint>

namespace rwd::kernels::cuda {

// One FP32 tensor's optimizer state, contiguous device memory of n elements each. g is read
// (and written back scaled when AdamScalars::scale_g); m, v, p are updated in place.
struct AdamSegment {
  float* p;
  float* g;
  float* m;
  float* v;
  int64_t n;
  int decay;  // 1: apply the weight decay factor (nanoGPT decays matrices only)
  // Optional: the parameter digest's word sum of the updated p (common/hash.h digest_term over
  // its FP32 bit patterns and indices, what param_digest.cu computes), added into *digest by
  // adamw_update with integer atomics (order-free: bitwise repeatable) while p is in registers.
  unsigned long long* digest = nullptr;
};

// The scalars of one update, already rounded to FP32 by the caller as LibTorch's multi-tensor
// kernels round their double arguments (opmath FP32). `variant` (0 .. kAdamVariants-1) picks
// where the arithmetic fuses a multiply and an add (FMA) and how v / bc2 is formed; the Trainer
// chooses it by comparing every variant bit for bit with LibTorch's own `_foreach_*` sequence
// on its device, so that the fused pass reproduces that sequence exactly. Its digits:
//   variant % 2        m + a1*g            fma(a1, g, m) | m + (a1*g)
//   variant / 2 % 4    v + a2*g*g          fma(a2*g, g, v) | fma(a2, g*g, v) | v + (a2*g)*g | v + a2*(g*g)
//   variant / 8 % 3    v / bc2             v / bc2 | v * rbc2_d | v * rbc2_f
//   variant / 24       p + step*(m/denom)  fma(step, m/denom, p) | p + step*(m/denom)
struct AdamScalars {
  float gscale;   // clip factor applied to g first when scale_g
  int scale_g;
  float decay;    // 1 - lr * weight_decay
  float b1, a1;   // beta1, 1 - beta1
  float b2, a2;   // beta2, 1 - beta2
  float bc2, rbc2_d, rbc2_f;  // 1 - beta2^t; 1/bc2 formed in double; 1/float(bc2) in FP32
  float eps;
  float step;     // -lr / bc1
  int variant;
};
constexpr int kAdamVariants = 2 * 4 * 3 * 2;

// Returns 0 or a cudaError_t value; stream is a cudaStream_t (nullptr = default stream).
// partials: device scratch of at least sumsq_partial_count(...) doubles; out: one device double.
int64_t sumsq_partial_count(const AdamSegment* segs, int count);
int grad_sumsq_sqrt(const AdamSegment* segs, int count, double* partials, double* out, void* stream);
int adamw_update(const AdamSegment* segs, int count, const AdamScalars& s, void* stream);

}  // namespace rwd::kernels::cuda
