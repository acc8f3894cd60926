// Host-side validation shared by the CUDA attention launchers: shapes, tile sizes, pointers and
// each head's plan flags (copied once from the device), and the choice of kernels per head.
#include <cmath>
#include <vector>

#include "kernels/cuda/attention_internal.cuh"

namespace rwd::kernels::cuda {

namespace {

constexpr int kGpuBlockK = 64;  // must equal kBlockK in attention_common.cuh

Prec prec_of(const HeadFlags& f, Op op) { return f.prec[static_cast<int>(op)]; }

// Flags the GPU implements: every op of the CPU twin except a fault on bwd (which has no
// defined meaning), so such a launch is refused rather than silently ignored.
bool head_supported(const HeadFlags& f) {
  return prec_of(f, Op::kBwd) != Prec::kFault && std::isfinite(f.beta) && std::isfinite(f.eps) &&
         f.eps >= 0.0f;
}

}  // namespace

int plan_launch(const AttentionParams& p, const HeadFlags* host_flags, bool backward,
                bool have_q32, bool have_k32,
                bool have_v32, bool have_o32, bool simt_fp32, cudaStream_t stream,
                LaunchPlan* plan) {
  if (p.batch <= 0 || p.heads <= 0 || p.seq <= 0 || !cuda_head_dim_supported(p.dim) ||
      !std::isfinite(p.scale) || p.flags == nullptr) {
    return cudaErrorInvalidValue;
  }
  // Tiled with the kernels' 64-key tile, or tiling off (block_k <= 0, >= T, or naive
  // attention, which has the same rounding points as a single tile).
  plan->tiling_off = p.naive || p.block_k <= 0 || p.block_k >= p.seq;
  if (!plan->tiling_off && p.block_k != kGpuBlockK) return cudaErrorNotSupported;

  std::vector<HeadFlags> flags(static_cast<size_t>(p.heads));
  if (host_flags != nullptr) {
    flags.assign(host_flags, host_flags + p.heads);
  } else {
    cudaError_t err = cudaMemcpyAsync(flags.data(), p.flags, flags.size() * sizeof(HeadFlags),
                                      cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess) return err;
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) return err;
  }

  plan->any_simt = plan->any_fast = plan->any_split = false;
  plan->fwd_variants = plan->fwd_variants_stats = 0;
  for (const HeadFlags& f : flags) {
    if (!head_supported(f)) return cudaErrorNotSupported;
    const bool qk32 = prec_of(f, Op::kQk) == Prec::kFp32;
    const bool pv32 = prec_of(f, Op::kPv) == Prec::kFp32;
    const bool sm64 = prec_of(f, Op::kSoftmax) == Prec::kFp32;
    const bool bwd32 = prec_of(f, Op::kBwd) == Prec::kFp32;
    const bool o32 = prec_of(f, Op::kO) == Prec::kFp32;
    const bool d64 = prec_of(f, Op::kDelta) == Prec::kFp32;
    const bool dfault = prec_of(f, Op::kDelta) == Prec::kFault;
    if ((qk32 && (!have_q32 || !have_k32)) || (pv32 && !have_v32)) return cudaErrorInvalidValue;
    if (backward && bwd32 && (!have_q32 || !have_k32 || !have_v32)) return cudaErrorInvalidValue;
    if (backward && (o32 || d64) && !f.delta_dpp && !have_o32) return cudaErrorInvalidValue;
    // Must match forward_variant (attention_internal.cuh) and backward_needs_simt
    // (attention_common.cuh).
    const bool simt = backward ? qk32 || pv32 || sm64 || bwd32 || d64 || dfault
                               : forward_variant(f, false, simt_fp32) < 0;
    plan->any_simt = plan->any_simt || simt;
    plan->any_fast = plan->any_fast || !simt;
    if (!backward && !simt) {
      plan->any_split = plan->any_split || forward_fp32(f);
      plan->fwd_variants |= 1u << forward_variant(f, false, simt_fp32);
      plan->fwd_variants_stats |= 1u << forward_variant(f, true, simt_fp32);
    }
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
