// Compile-time configuration of the tensor-core backward (attention_backward.cu): K/V buffering
// of the dQ kernel, blocks per SM, the dK/dV column split, and each kernel's shared memory.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace rwd::kernels::cuda {

// K/V buffers of the dQ kernel: 2 = double-buffered (next tile loads during this one), 1 =
// single (4 tiles of smem instead of 6, so more blocks fit an SM; loads wait behind barriers).
// D = 128 takes 1: 4 tiles of 17 KB let 3 blocks share an SM (6 tiles: 2), measured 15%
// faster (experiments/cuda_bench/RESULTS.md); D = 64 fits 3 blocks either way. The other dims
// (not yet timed): 32 and 80 as 64 (80: 6 tiles of 11 KB, 3 blocks), 96 and 256 as 128 (256:
// 4 tiles of 33 KB, one block).
#ifndef REWIND_DQ64_KV_STAGES
#define REWIND_DQ64_KV_STAGES 2
#endif
#ifndef REWIND_DQ128_KV_STAGES
#define REWIND_DQ128_KV_STAGES 1
#endif
template <int D>
constexpr int kDqKvStages = D == 64    ? REWIND_DQ64_KV_STAGES
                            : D == 128 ? REWIND_DQ128_KV_STAGES
                                       : (D <= 80 ? 2 : 1);
// Blocks per SM the register allocation of each kernel must allow (__launch_bounds__).
#ifndef REWIND_DQ_MIN_BLOCKS
#define REWIND_DQ_MIN_BLOCKS 3
#endif
#ifndef REWIND_DKDV64_MIN_BLOCKS
#define REWIND_DKDV64_MIN_BLOCKS 3  // D = 128 keeps 1: at 3 blocks (168 registers) it spills
#endif
// dK and dV columns one dK/dV block forms: all D, except at D = 256, where a thread's dK and dV
// accumulators alone (256 registers) would spill: there each block forms half the columns
// (grid z = 2) and both halves compute S and dP again. Each output element sees the same
// products in the same order as in a full-width block, so the bits are those of one.
template <int D>
constexpr int kDkdvCols = D > 128 ? 128 : D;

// Shared memory of the backward kernels: the BF16 ones as tuned above; the FP32 variant holds
// three planes per operand, single-buffered.
template <int D, bool kF32>
struct BwdShape {
  static constexpr int kPl = kF32 ? 3 : 1;
  static constexpr int kDqStages = kF32 ? 1 : kDqKvStages<D>;
  static constexpr int kKvStages = kF32 ? 1 : 2;  // Q/dO buffers of the dK/dV kernel
  static constexpr int kTileBytes = kBlockQ * (D + 8) * static_cast<int>(sizeof(uint16_t));
  static constexpr int kSmemDq = kPl * (2 + 2 * kDqStages) * kTileBytes;
  static constexpr int kSmemKv = kPl * (2 + 2 * kKvStages) * kTileBytes +
                                 2 * kKvStages * kBlockQ * static_cast<int>(sizeof(float));
  // The BF16 dK/dV kernel on wgmma: dense swizzle-128 tiles from a 1024-byte aligned base.
  static constexpr int kSmemKvWg = (2 + 2 * kKvStages) * kBlockQ * D * static_cast<int>(sizeof(uint16_t)) +
                                   2 * kKvStages * kBlockQ * static_cast<int>(sizeof(float)) + 1024;
  // D = 256: dQ's 128 accumulator registers a thread need more than 3 blocks allow (168).
  static constexpr int kMinBlocksDq = kF32 ? (D <= 64 ? 2 : 1) : (D > 128 ? 1 : REWIND_DQ_MIN_BLOCKS);
  static constexpr int kMinBlocksKv = kF32 ? 1 : (D == 64 ? REWIND_DKDV64_MIN_BLOCKS : D < 64 ? 3 : 1);
};

}  // namespace rwd::kernels::cuda
