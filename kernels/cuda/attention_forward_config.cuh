// Compile-time configuration of the tensor-core forward (attention_forward.cu): tile shapes and
// the stabilized kernel's strategy, overridable with -D for tuning runs
// (scripts/cuda_explore.sh VARIANTS=...).
#pragma once

#include <type_traits>

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
// The FP32 (split-operand) variant keeps three BF16 planes of Q, K and V in shared memory and
// single-buffers K/V: D = 64 as 4 warps x 16 rows with Q in registers, 2 blocks per SM (81 KB
// each); D = 128 as 8 warps x 16 rows, Q reloaded per tile, 1 block per SM (204 KB).
#ifndef REWIND_FWD64_F32_CONFIG
#define REWIND_FWD64_F32_CONFIG 4121
#endif
#ifndef REWIND_FWD128_F32_CONFIG
#define REWIND_FWD128_F32_CONFIG 8110
#endif
template <int D>
using FwdF32Traits =
    FwdConfig<D == 64 ? REWIND_FWD64_F32_CONFIG : REWIND_FWD128_F32_CONFIG>;
// The BF16 variants on wgmma (kWg, forward_block): one warpgroup of 4 warps x 16 rows, the
// tile of one wgmma; D = 64 as the mma.sync configuration, D = 128 at 2 blocks per SM.
#ifndef REWIND_FWD64_WG_CONFIG
#define REWIND_FWD64_WG_CONFIG 4140
#endif
#ifndef REWIND_FWD128_WG_CONFIG
#define REWIND_FWD128_WG_CONFIG 4120
#endif
template <int D>
using FwdWgTraits = FwdConfig<D == 64 ? REWIND_FWD64_WG_CONFIG : REWIND_FWD128_WG_CONFIG>;
// Traits of the BF16 (kF32 false; on wgmma: kWg) or FP32 variant.
template <int D, bool kF32, bool kWg = false>
using FwdTr = std::conditional_t<kF32, FwdF32Traits<D>, std::conditional_t<kWg, FwdWgTraits<D>, FwdTraits<D>>>;
template <int D, bool kF32 = false, bool kWg = false>
struct FwdShape {
  using Tr = FwdTr<D, kF32, kWg>;
  static constexpr int kRows = Tr::kWarps * 16 * Tr::kMt;  // query rows
  static constexpr int kThreads = Tr::kWarps * 32;
  static constexpr int kPlanes = kF32 ? 3 : 1;  // BF16 planes per operand
  static constexpr int kStages = kF32 ? 1 : 2;  // K/V buffers
  // Row stride of the tiles in elements: padded for ldmatrix, dense in the swizzled wgmma tiles
  // (which start 1024-byte aligned: the slack is allocated).
  static constexpr int kStride = kWg ? D : D + 8;
  static constexpr int kSmemBytes =
      kPlanes * (kRows + 2 * kStages * 64) * kStride * static_cast<int>(sizeof(uint16_t)) + (kWg ? 1024 : 0);
  static_assert(!kWg || (!kF32 && Tr::kWarps == 4 && Tr::kMt == 1 && !Tr::kQRegs),
                "wgmma: one warpgroup of 16-row warps, Q from shared memory");
};

}  // namespace rwd::kernels::cuda
