// Compile-time configuration of the tensor-core forward (attention_forward.cu): tile shapes and
// the stabilized kernel's strategy, overridable with -D for tuning runs
// (scripts/cuda_explore.sh VARIANTS=...).
#pragma once

#include <type_traits>

#include "kernels/cuda/attention_internal.cuh"

namespace rwd::kernels::cuda {

// Tile shape of the forward: kWarps warps, each owning kMt m16 row blocks (16 kMt query rows),
// kWarps * 16 * kMt query rows per block. Each K/V fragment loaded by ldmatrix feeds kMt mma
// instructions (kMt = 2 halves the shared-memory reads per FLOP). kQRegs keeps the Q fragments
// in registers for the whole key loop (else reloaded per tile). Register use: --resource-usage.
struct FwdTile {
  int warps = 0, m16 = 0, min_blocks = 0, q_regs = -1;  // 0 / -1: not named
};
// A tile is written as a sum of named parts, in the defaults below and in -D overrides for
// tuning runs (scripts/cuda_explore.sh VARIANTS=...), e.g.
//   -DREWIND_FWD64_TILE=warps(4)+m16(1)+min_blocks(4)+q_in_smem
// (a sum, not a list: nvcc splits -D values at commas). Every part must be named once.
namespace fwd_tile {
constexpr FwdTile warps(int n) { return {n, 0, 0, -1}; }
constexpr FwdTile m16(int n) { return {0, n, 0, -1}; }  // m16 row blocks a warp
constexpr FwdTile min_blocks(int n) { return {0, 0, n, -1}; }  // blocks an SM, at least
constexpr FwdTile q_in_regs{0, 0, 0, 1};
constexpr FwdTile q_in_smem{0, 0, 0, 0};
constexpr FwdTile operator+(FwdTile a, FwdTile b) {
  return {a.warps + b.warps, a.m16 + b.m16, a.min_blocks + b.min_blocks,
          a.q_regs < 0 ? b.q_regs : b.q_regs < 0 ? a.q_regs : 2};
}
// The tile as a template argument (C++17 has no class-type ones); a part missing or named twice
// stops the build here.
constexpr int code(FwdTile t) {
  return t.warps > 0 && t.warps <= 9 && t.m16 > 0 && t.m16 <= 9 && t.min_blocks > 0 && t.min_blocks <= 9 &&
                 (t.q_regs == 0 || t.q_regs == 1)
             ? t.warps * 1000 + t.m16 * 100 + t.min_blocks * 10 + t.q_regs
             : throw "a forward tile names warps(n), m16(n), min_blocks(n) and q_in_regs or q_in_smem, each once";
}
}  // namespace fwd_tile
template <int kCode>
struct FwdConfig {
  static constexpr int kWarps = kCode / 1000, kMt = kCode / 100 % 10, kMinBlocks = kCode / 10 % 10;
  static constexpr bool kQRegs = kCode % 10 != 0;
};
// Specializes Traits<D> (FwdTraits, FwdF32Traits, FwdWgTraits) to `tile`.
#define REWIND_FWD_TILE_OF(Traits, D, tile)              \
  namespace fwd_tile {                                   \
  constexpr int k##Traits##D = code(tile);               \
  }                                                      \
  template <>                                            \
  struct Traits<D> : FwdConfig<fwd_tile::k##Traits##D> {}
// Chosen by timing (experiments/cuda_bench/RESULTS.md): D = 64 as 4 warps x 16 rows, 4 blocks
// per SM within 128 registers (16 warps in 4 independent blocks hide the softmax latency
// better than 8 warps of 32 rows); D = 128 as 4 warps x 32 rows (each K/V fragment feeds two
// mma), 2 blocks per SM.
#ifndef REWIND_FWD64_TILE
#define REWIND_FWD64_TILE warps(4) + m16(1) + min_blocks(4) + q_in_smem
#endif
#ifndef REWIND_FWD128_TILE
#define REWIND_FWD128_TILE warps(4) + m16(2) + min_blocks(1) + q_in_smem
#endif
// 1: the stabilized kernel without monitors speculates (see forward_block); 0: it counts the
// ties first, as the monitored one does (kept for A/B timing: scripts/cuda_explore.sh).
#ifndef REWIND_STABLE_SPEC
#define REWIND_STABLE_SPEC 1
#endif
template <int D>
struct FwdTraits;
REWIND_FWD_TILE_OF(FwdTraits, 64, REWIND_FWD64_TILE);
REWIND_FWD_TILE_OF(FwdTraits, 128, REWIND_FWD128_TILE);
// The other head dims (not yet timed; chosen from ptxas's register report): 4 warps x 16 rows
// each. D = 32 as D = 64; D = 80 and 96 at 3 blocks an SM (168 registers: no spills but 24
// bytes in the monitored variant with extras at D = 96; 2 m16 blocks a warp, as D = 128 has,
// spilled in the plain kernel); D = 256 one block (165 KB of shared memory; the 128 O registers
// a thread leave no room for a second m16 block).
#ifndef REWIND_FWD32_TILE
#define REWIND_FWD32_TILE warps(4) + m16(1) + min_blocks(4) + q_in_smem
#endif
#ifndef REWIND_FWD80_TILE
#define REWIND_FWD80_TILE warps(4) + m16(1) + min_blocks(3) + q_in_smem
#endif
#ifndef REWIND_FWD96_TILE
#define REWIND_FWD96_TILE warps(4) + m16(1) + min_blocks(3) + q_in_smem
#endif
#ifndef REWIND_FWD256_TILE
#define REWIND_FWD256_TILE warps(4) + m16(1) + min_blocks(1) + q_in_smem
#endif
REWIND_FWD_TILE_OF(FwdTraits, 32, REWIND_FWD32_TILE);
REWIND_FWD_TILE_OF(FwdTraits, 80, REWIND_FWD80_TILE);
REWIND_FWD_TILE_OF(FwdTraits, 96, REWIND_FWD96_TILE);
REWIND_FWD_TILE_OF(FwdTraits, 256, REWIND_FWD256_TILE);
// The FP32 (split-operand) variant keeps three BF16 planes of Q, K and V in shared memory and
// single-buffers K/V: D = 64 as 4 warps x 16 rows with Q in registers, 2 blocks per SM (81 KB
// each); D = 128 as 8 warps x 16 rows, Q reloaded per tile, 1 block per SM (204 KB). D = 32 as
// D = 64 (46 KB); D = 80 as 4 warps x 16 rows, Q reloaded, 2 blocks (99 KB each); D = 96 as
// D = 128 (156 KB). D = 256 has no FP32 variant (split_head_dim: its heads take the SIMT kernels).
#ifndef REWIND_FWD64_F32_TILE
#define REWIND_FWD64_F32_TILE warps(4) + m16(1) + min_blocks(2) + q_in_regs
#endif
#ifndef REWIND_FWD128_F32_TILE
#define REWIND_FWD128_F32_TILE warps(8) + m16(1) + min_blocks(1) + q_in_smem
#endif
template <int D>
struct FwdF32Traits;
REWIND_FWD_TILE_OF(FwdF32Traits, 32, REWIND_FWD64_F32_TILE);
REWIND_FWD_TILE_OF(FwdF32Traits, 64, REWIND_FWD64_F32_TILE);
REWIND_FWD_TILE_OF(FwdF32Traits, 80, warps(4) + m16(1) + min_blocks(2) + q_in_smem);
REWIND_FWD_TILE_OF(FwdF32Traits, 96, REWIND_FWD128_F32_TILE);
REWIND_FWD_TILE_OF(FwdF32Traits, 128, REWIND_FWD128_F32_TILE);
// The BF16 variants on wgmma (kWg, forward_block): warpgroups of 4 warps x 16 rows, the tile
// of one wgmma. D = 64 as the mma.sync configuration (one warpgroup, cp.async loads). D = 128
// with REWIND_FWD_TMA: two warpgroups (128 query rows) share each K/V tile, which one thread
// (of a third warpgroup with REWIND_FWD_PRODUCER_WARP) loads by TMA into a ring of
// REWIND_FWD_TMA_STAGES buffers (mbarriers, no block-wide barrier in the key loop), 1 block per
// SM. Without TMA: one warpgroup, 2 blocks per SM. Only these two dims (wgmma_head_dim,
// attention_internal.cuh), and the forward of 80 and 96 on the D = 128 kernel (wgmma_fwd_dim).
#ifndef REWIND_FWD_TMA
#define REWIND_FWD_TMA 1
#endif
// 1: the TMA loads come from a warpgroup of their own (a third one, with 24 registers a thread
// to the consumers' 240: KvRing kProducerGroup; plain D128 forward 0.319 against 0.371-0.374 ms
// on the H200, experiments/cuda_bench/results/producer_warpgroup_h200.txt); 0: from the first
// thread of the second warpgroup at the top of its tiles.
#ifndef REWIND_FWD_PRODUCER_WARP
#define REWIND_FWD_PRODUCER_WARP 1
#endif
// Four stages (160 KB with Q): with the pipelined loop 1-3% faster than three on the H200
// (experiments/cuda_bench/results/bwd_lse_async_h200.txt), and a stage index without a division.
#ifndef REWIND_FWD_TMA_STAGES
#define REWIND_FWD_TMA_STAGES 4
#endif
// D = 128 holds Q in registers (Q = 1): S = Q K^T then reads only K from shared memory (with
// Q there too, the 64-key products read 128 bytes a clock, all an SM's shared memory gives).
// D = 64 keeps Q in shared memory: with Q in registers at its 128-register cap (4 blocks an
// SM) its monitored variants spilled and its results were wrong, cause not found
// (experiments/cuda_bench/RESULTS.md, run 31).
#ifndef REWIND_FWD64_WG_TILE
#define REWIND_FWD64_WG_TILE warps(4) + m16(1) + min_blocks(4) + q_in_smem
#endif
#ifndef REWIND_FWD128_WG_TILE
#define REWIND_FWD128_WG_TILE (REWIND_FWD_TMA ? warps(8) + m16(1) + min_blocks(1) + q_in_regs : warps(4) + m16(1) + min_blocks(2) + q_in_regs)
#endif
// Whether the wgmma forward of dim D loads by TMA (two warpgroups, see above).
constexpr bool fwd_tma(int dim) { return REWIND_FWD_TMA != 0 && dim == 128; }
// The dim whose wgmma forward computes a BF16 head of dim `dim` (0: none, mma.sync):
// wgmma_pad_dim's, D = 80 and 96 on the D = 128 TMA kernel. TMA fills a box's columns past the
// tensor's D with zeros, and a k-step of zero products leaves an accumulator's bits as they
// are, so S, the softmax, Ō's first D columns and the monitors are the mma.sync kernel's
// (WgmmaKernelsEqualMmaKernelsBitwise); O is written for its D columns only (Dg in
// forward_block). Without TMA (REWIND_FWD_TMA=0) only 64 and 128.
constexpr int wgmma_fwd_dim(int dim) { return wgmma_head_dim(dim) || fwd_tma(128) ? wgmma_pad_dim(dim) : 0; }
template <int D>
struct FwdWgTraits;
REWIND_FWD_TILE_OF(FwdWgTraits, 64, REWIND_FWD64_WG_TILE);
REWIND_FWD_TILE_OF(FwdWgTraits, 128, REWIND_FWD128_WG_TILE);
// Traits of the BF16 (kF32 false; on wgmma: kWg) or FP32 variant.
template <int D, bool kF32, bool kWg = false>
using FwdTr = std::conditional_t<kF32, FwdF32Traits<D>, std::conditional_t<kWg, FwdWgTraits<D>, FwdTraits<D>>>;
template <int D, bool kF32 = false, bool kWg = false>
struct FwdShape {
  using Tr = FwdTr<D, kF32, kWg>;
  static constexpr int kRows = Tr::kWarps * 16 * Tr::kMt;  // query rows
  static constexpr bool kTma = kWg && fwd_tma(D);
  static constexpr bool kProducerGroup = kTma && REWIND_FWD_PRODUCER_WARP != 0;
  static constexpr int kThreads = Tr::kWarps * 32 + (kProducerGroup ? 128 : 0);
  static constexpr int kPlanes = kF32 ? 3 : 1;  // BF16 planes per operand
  static constexpr int kStages = kF32 ? 1 : kTma ? REWIND_FWD_TMA_STAGES : 2;  // K/V buffers
  // Row stride of the tiles in elements: padded for ldmatrix, dense in the swizzled wgmma tiles
  // (which start 1024-byte aligned: the slack is allocated). TMA: 1 + 2 kStages mbarriers after
  // the tiles (Q; per stage full and empty).
  static constexpr int kStride = kWg ? D : D + 8;
  static constexpr int kSmemBytes =
      kPlanes * (kRows + 2 * kStages * 64) * kStride * static_cast<int>(sizeof(uint16_t)) + (kWg ? 1024 : 0) +
      (kTma ? 8 * (1 + 2 * kStages) : 0);
  static_assert(!kWg || (!kF32 && Tr::kWarps == (kTma ? 8 : 4) && Tr::kMt == 1),
                "wgmma: warpgroups of 16-row warps (two with TMA, else one)");
};

}  // namespace rwd::kernels::cuda
