// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16 BF16, FP32 accumulate): one
// kernel per variant of the per-head plan flags (its key loop in attention_forward_block.cuh,
// with the rounding points), and the public forward launcher. The BF16 variants run their
// products on Hopper's wgmma (kWg, same bits) unless REWIND_ATTN_WGMMA=0.
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_forward_block.cuh"

namespace rwd::kernels::cuda {

// ---------------------------------------------------------------------------------------------
// CUDA kernels

// Grid (ceil(T/kRows), B*H), FwdShape<D>::kThreads threads. Causal blocks with the most key tiles
// (the last query tiles) are started first, so the short ones fill the tail of the launch
// (block_tile).
// One kernel per specialization V (forward_variant): heads of other variants return at once,
// so each kernel is register-allocated for its own key loop (the plain one is not held to the
// registers of the monitor bookkeeping), and a launch runs only the variants its heads use.
// Dg: the head dim in memory, computed as D (wgmma_fwd_dim: D = 80 and 96 on the D = 128 kernel).
template <int D, int V, bool kWg, int Dg = D>
__global__ void __launch_bounds__(FwdShape<D, (V & kFwdF32) != 0, kWg>::kThreads,
                                  FwdTr<D, (V & kFwdF32) != 0, kWg>::kMinBlocks)
    flash_forward_kernel(KernelArgs a, const __grid_constant__ TmaMaps tm) {
  const BlockTile bt = block_tile(a.causal, true);
  const HeadFlags& hf = a.flags[bt.bh % a.heads];
  if (forward_variant(hf, a.stats != nullptr, a.simt_fp32) != V) return;  // SIMT heads: -1
  const FlagView f = decode_flags(hf);
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr bool kExtras = (V & kFwdExtras) != 0;
  constexpr bool kStats = (V & kFwdStats) != 0;
  constexpr bool kTies = (V & kFwdStable) != 0;
  constexpr bool kF32 = (V & kFwdF32) != 0;
  constexpr bool kSr = (V & kFwdSr) != 0;
  // The monitored plain BF16 heads (what training runs) skip their monitors where the step's
  // stats_on flag says so: the plain key loop, inlined beside the monitored one (same blocks
  // per SM: the register cap is the launch bounds'). The other monitored variants always count.
  if constexpr (V == kFwdStats) {
    if (a.stats_on != nullptr && *a.stats_on == 0) {
      forward_block<D, false, false, false, false, kWg, Dg>(a, f, smem, bt, &tm);
      return;
    }
  }
  forward_block<D, kExtras, kTies, kStats, kF32, kWg, Dg, kSr>(a, f, smem, bt, &tm);
}

// ---------------------------------------------------------------------------------------------
// kernel launchers

namespace {

template <int D, int V, bool kWg, int Dg = D>
int launch_kernel(const KernelArgs& a, cudaStream_t stream) {
  // Q tile plus the K and V buffers, per plane.
  using Shape = FwdShape<D, (V & kFwdF32) != 0, kWg>;
  cudaError_t err = cudaFuncSetAttribute(flash_forward_kernel<D, V, kWg, Dg>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  if (err != cudaSuccess) return err;
  // The TMA kernels' tensor maps (the others get them unset and never read them).
  TmaMaps tm{};
  if constexpr (Shape::kTma) {
    err = static_cast<cudaError_t>(encode_tma_maps(a, Dg, &tm));  // columns past Dg: zeros
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((a.seq + Shape::kRows - 1) / Shape::kRows, a.batch * a.heads);
  flash_forward_kernel<D, V, kWg, Dg><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(a, tm);
  return cudaGetLastError();
}

// BF16 variants on wgmma where the dim has it (wgmma_fwd_dim), else mma.sync. FP32 variants
// exist up to D = 128 (split_head_dim); plan_launch sends larger dims' FP32 heads to the SIMT
// kernels (simt_fp32), so their bit is never set here.
template <int D, int V>
int launch_variant(const KernelArgs& a, cudaStream_t stream) {
  if constexpr ((V & kFwdF32) != 0 && !split_head_dim(D)) {
    return cudaErrorNotSupported;
  } else {
    if constexpr ((V & kFwdF32) == 0 && wgmma_fwd_dim(D) != 0) {
      if (wgmma_on()) return launch_kernel<wgmma_fwd_dim(D), V, true, D>(a, stream);
    }
    return launch_kernel<D, V, false>(a, stream);
  }
}

// One launch per variant present in `variants` (bit V set: some head runs variant V).
template <int D>
int launch_flash_forward(const KernelArgs& a, unsigned variants, cudaStream_t stream) {
  using Launch = int (*)(const KernelArgs&, cudaStream_t);
  constexpr int kS = kFwdStable, kX = kFwdExtras, kM = kFwdStats | kFwdStable, kF = kFwdF32;
  constexpr int kR = kFwdSr | kFwdExtras;  // stochastic rounding: BF16 heads only (forward_variant);
                                           // kFwdSr alone: pv=sr on the plain loops
  static constexpr struct {
    int v;
    Launch fn;
  } kLaunch[] = {// FP32 heads first: their blocks are the longest.
                 {kF, launch_variant<D, kF>},           {kF | kS, launch_variant<D, kF | kS>},
                 {kF | kM, launch_variant<D, kF | kM>}, {kF | kX, launch_variant<D, kF | kX>},
                 {kF | kX | kS, launch_variant<D, kF | kX | kS>},
                 {kF | kX | kM, launch_variant<D, kF | kX | kM>},
                 {0, launch_variant<D, 0>},           {kS, launch_variant<D, kS>},
                 {kFwdStats, launch_variant<D, kFwdStats>}, {kM, launch_variant<D, kM>},         {kX, launch_variant<D, kX>},
                 {kX | kS, launch_variant<D, kX | kS>}, {kX | kM, launch_variant<D, kX | kM>},
                 {kR, launch_variant<D, kR>},           {kR | kS, launch_variant<D, kR | kS>},
                 {kR | kM, launch_variant<D, kR | kM>}, {kFwdSr, launch_variant<D, kFwdSr>}};
  for (const auto& l : kLaunch) {
    if ((variants >> l.v) & 1u) {
      const int err = l.fn(a, stream);
      if (err != 0) return err;
    }
  }
  return 0;
}

// Variants with kFwdF32 set: bits 8..15 and 24..31 of a variant mask.
constexpr unsigned kF32VariantBits = 0xff00ff00u;
static_assert(kFwdVariants == 32 && kFwdF32 == 8, "kF32VariantBits: the variants with bit 8 set");

// The launches of `variants`: the FP32 ones on the side stream, joined back into `stream`,
// when BF16 variants run too.
template <int D>
int launch_forward_variants(const KernelArgs& a, unsigned variants, cudaStream_t stream) {
  const unsigned f32 = variants & kF32VariantBits;
  if (f32 == 0 || f32 == variants) return launch_flash_forward<D>(a, variants, stream);
  return launch_beside(stream, [&](cudaStream_t s) { return launch_flash_forward<D>(a, f32, s); },
                       [&](cudaStream_t s) { return launch_flash_forward<D>(a, variants & ~kF32VariantBits, s); });
}

}  // namespace

size_t forward_workspace_bytes(const AttentionParams& p, const HeadFlags* host_flags) {
  return split_bytes(p, host_flags);
}

int attention_forward(const AttentionParams& p, const ForwardArgs& fa, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (fa.q == nullptr || fa.k == nullptr || fa.v == nullptr || fa.o == nullptr ||
      fa.lse == nullptr) {
    return cudaErrorInvalidValue;
  }
  LaunchPlan plan;
  const bool simt_fp32 = fa.simt_fp32 || !split_head_dim(p.dim);
  int err = plan_launch(p, fa.host_flags, false, fa.q_f32 != nullptr, fa.k_f32 != nullptr,
                        fa.v_f32 != nullptr, true, simt_fp32, stream, &plan);
  if (err != 0) return err;
  KernelArgs a;
  a.batch = p.batch;
  a.heads = p.heads;
  a.seq = p.seq;
  a.scale = p.scale;
  a.causal = p.causal;
  a.tiling_off = plan.tiling_off;
  a.sr_key = p.sr_key;
  a.flags = p.flags;
  a.stats = fa.stats != nullptr ? fa.stats : p.stats;
  a.stats_on = fa.stats_on;
  a.q = fa.q;
  a.k = fa.k;
  a.v = fa.v;
  a.q32 = fa.q_f32;
  a.k32 = fa.k_f32;
  a.v32 = fa.v_f32;
  a.o_out = fa.o;
  a.o32_out = fa.o_f32;
  a.lse_out = fa.lse;
  a.simt_fp32 = simt_fp32;
  if (plan.any_split && !plan.tiling_off) {
    if (fa.workspace == nullptr) return cudaErrorInvalidValue;
    err = launch_split(a, p.dim, fa.workspace, false, stream);
    if (err != 0) return err;
  }
  // Tiling off: every head takes the SIMT kernel, which makes a full pass for the row max.
  if (plan.any_fast && !plan.tiling_off) {
    const unsigned variants = a.stats != nullptr ? plan.fwd_variants_stats : plan.fwd_variants;
    err = dispatch_head_dim(p.dim, [&](auto d) { return launch_forward_variants<decltype(d)::value>(a, variants, stream); });
    if (err != 0) return err;
  }
  if (plan.any_simt || plan.tiling_off) {
    err = launch_simt_forward(a, p.dim, plan.tiling_off, stream);
    if (err != 0) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
