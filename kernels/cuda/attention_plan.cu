// Host-side validation shared by the CUDA attention launchers: shapes, tile sizes, pointers and
// each head's plan flags (copied once from the device), and the choice of kernels per head.
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/switches.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/tma.cuh"

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

// A second stream per device with its fork/join events: the FP32 variants of a mixed launch run
// beside the BF16 ones instead of after them (one FP32 head alone fills few SMs).
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
int side_stream(SideStream** out) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static SideStream sides[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mu);
  SideStream& s = sides[dev];
  if (s.stream == nullptr) {
    err = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming);
    if (err != cudaSuccess) return err;
  }
  *out = &s;
  return cudaSuccess;
}

}  // namespace

int launch_beside(cudaStream_t stream, const std::function<int(cudaStream_t)>& side_work,
                  const std::function<int(cudaStream_t)>& main_work) {
  SideStream* side = nullptr;
  int err = side_stream(&side);
  if (err == 0) err = cudaEventRecord(side->fork, stream);
  if (err == 0) err = cudaStreamWaitEvent(side->stream, side->fork, 0);
  if (err == 0) err = side_work(side->stream);
  if (err == 0) err = cudaEventRecord(side->join, side->stream);
  if (err == 0) err = main_work(stream);
  if (err == 0) err = cudaStreamWaitEvent(stream, side->join, 0);
  return err;
}

int encode_tma_maps(const KernelArgs& a, int dim, TmaMaps* out) {
  // The driver's encoder through the runtime (no link against libcuda), looked up once.
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<Encode>(nullptr);
    }
    return reinterpret_cast<Encode>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(a.seq),
                              static_cast<cuuint64_t>(a.batch) * a.heads};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(dim) * sizeof(uint16_t),
                                 static_cast<cuuint64_t>(a.seq) * dim * sizeof(uint16_t)};
  const cuuint32_t box[3] = {64, 64, 1}, unit[3] = {1, 1, 1};
  CUtensorMap* maps[3] = {&out->q, &out->k, &out->v};
  const uint16_t* src[3] = {a.q, a.k, a.v};
  for (int i = 0; i < 3; ++i) {
    const CUresult r = encode(maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(src[i]), dims,
                              strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

bool wgmma_on() { return rwd::switches::on(rwd::switches::Switch::kAttnWgmma); }

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

  plan->any_simt = plan->any_fast = plan->any_split = plan->any_fast16 = false;
  plan->bf16 = Bf16Groups{};
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
    const bool any32 = qk32 || pv32 || sm64 || bwd32 || d64;
    const bool simt = backward ? dfault || (d64 && f.delta_dpp) || ((simt_fp32 || f.s_sr || f.pv_sr) && any32)
                               : forward_variant(f, false, simt_fp32) < 0;
    plan->any_simt = plan->any_simt || simt;
    plan->any_fast = plan->any_fast || !simt;
    if (backward && !simt) plan->any_split = plan->any_split || any32;
    plan->any_fast16 = plan->any_fast16 || (!simt && !(backward ? any32 : forward_fp32(f)));
    if (backward && !simt && !any32) {  // must match backward_variant (attention_backward_mma.cuh)
      const bool sr = f.s_sr || f.pv_sr;
      (sr ? plan->bf16.sr : plan->bf16.plain) = true;
      if (f.delta_dpp) (sr ? plan->bf16.sr_dpp : plan->bf16.plain_dpp) = true;
    }
    if (!backward && !simt) {
      plan->any_split = plan->any_split || forward_fp32(f);
      plan->fwd_variants |= 1u << forward_variant(f, false, simt_fp32);
      plan->fwd_variants_stats |= 1u << forward_variant(f, true, simt_fp32);
    }
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
