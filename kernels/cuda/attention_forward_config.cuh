// Compile-time configuration of the tensor-core forward (attention_forward.cu): tile shapes and
// the stabilized kernel's strategy, overridable with -D for tuning runs
// (scripts/cuda_explore.sh VARIANTS=...).
#pragma once

namespace rwd::kernels::cuda {

// Tile shape of the forward: kWarps warps, each owning kMt m16 row blocks (16 kMt query rows),
// kWarps * 16 * kMt query rows per block. Each K/V fragment loaded by ldmatrix feeds kMt mma
// instructions (kMt = 2 halves the shared-memory reads per FLOP). kQRegs keeps the Q fragments
// in registers for the whole key loop (else reloaded per tile). Register use: --resource-usage.
// Tuning knobs as a 4-digit code WMBQ: W warps, M m16 blocks per warp, at least B blocks per
// SM, Q = 1 keeps Q in registers. Overridable at compile time for experiments
// (scripts/cuda_device.sh VARIANTS=...; one number because nvcc splits -D values at commas).
template <int kCode>
struct FwdConfig {
  static constexpr int kWarps = kCode / 1000, kMt = kCode / 100 % 10, kMinBlocks = kCode / 10 % 10;
  static constexpr bool kQRegs = kCode % 10 != 0;
};
// Chosen by timing (experiments/cuda_bench/RESULTS.md): D = 64 as 4 warps x 16 rows, 4 blocks
// per SM within 128 registers (16 warps in 4 independent blocks hide the softmax latency
// better than 8 warps of 32 rows); D = 128 as 4 warps x 32 rows (each K/V fragment feeds two
// mma), 2 blocks per SM.
#ifndef REWIND_FWD64_CONFIG
#define REWIND_FWD64_CONFIG 4140
#endif
#ifndef REWIND_FWD128_CONFIG
#define REWIND_FWD128_CONFIG 4210
#endif
// 1: the stabilized kernel without monitors speculates (see forward_block); 0: it counts the
// ties first, as the monitored one does (kept for A/B timing: scripts/cuda_explore.sh).
#ifndef REWIND_STABLE_SPEC
#define REWIND_STABLE_SPEC 1
#endif
template <int D>
struct FwdTraits;
template <>
struct FwdTraits<64> : FwdConfig<REWIND_FWD64_CONFIG> {};
template <>
struct FwdTraits<128> : FwdConfig<REWIND_FWD128_CONFIG> {};
template <int D>
struct FwdShape {
  static constexpr int kRows = FwdTraits<D>::kWarps * 16 * FwdTraits<D>::kMt;  // query rows
  static constexpr int kThreads = FwdTraits<D>::kWarps * 32;
};

}  // namespace rwd::kernels::cuda
