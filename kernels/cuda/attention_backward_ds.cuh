// The backward's dS path (attention_backward.cu launches it): the layout of the stored dS
// tiles, the delta kernel that runs before the dK/dV kernel, and the dQ kernel over the tiles.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_backward_mma.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/wgmma.cuh"

// dS tiles the dQ kernel loads ahead into registers (1: 0.05 ms slower at
// D = 128, experiments/cuda_bench/RESULTS.md).
#ifndef REWIND_DS_AHEAD
#define REWIND_DS_AHEAD 2
#endif

namespace rwd::kernels::cuda {

// dS path: the dK/dV kernel (flash_dkdv_kernel<D, false, true>) stores bf16(dS) of every
// visible (query tile i, key tile j) pair as a 64 x 64 tile in mma fragment order: the A
// fragments of dS^T (keys as rows) that its dK product packs from registers, 16 bytes per lane,
// [key warp w][k-step kk][lane], so a warp stores and loads 512 contiguous bytes at a time.
// flash_dq_ds_kernel turns them into dS's fragments with movmatrix transposes and forms dQ in
// the recompute kernel's order (same mma sequence, same bits). Tiles of one head: row-major
// over i, causal j <= i.
constexpr int kDsTileElems = kBlockQ * kBlockK;
__host__ __device__ inline int64_t ds_tiles_per_head(int T, bool causal) {
  const int64_t n = (T + kBlockQ - 1) / kBlockQ;
  return causal ? n * (n + 1) / 2 : n * n;
}
__host__ __device__ inline int64_t ds_tile_index(int i, int j, int T, bool causal) {
  return causal ? static_cast<int64_t>(i) * (i + 1) / 2 + j
                : static_cast<int64_t>(i) * ((T + kBlockK - 1) / kBlockK) + j;
}

// dS path, step 1: delta = rowsum(dO * O) of its heads, which the dK/dV kernel reads (the
// recompute dQ kernel forms it otherwise). Grid (ceil(T/32), B*H), 128 threads: a quad of
// lanes per query row, the arithmetic of flash_dq_kernel (row_delta).
template <int D>
__global__ void __launch_bounds__(kThreads) flash_delta_kernel(KernelArgs a) {
  const int bh = blockIdx.y, h = bh % a.heads, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  const int variant = backward_variant(f, a.simt_fp32);
  if ((variant != 0 && variant != 2) || f.delta_dpp) return;  // every BF16 head (sr or not)
  const int lane = threadIdx.x % 32, row = blockIdx.x * (kThreads / 4) + threadIdx.x / 4;
  const float d = row_delta<D, false>(a, f, static_cast<size_t>(bh) * T * D, row, lane);
  if (row < T && lane % 4 == 0) a.delta[static_cast<size_t>(bh) * T + row] = d;
}

// dS path, step 3: dQ_i = alpha * sum_j bf16(dS_ij) K_j over the stored tiles, j ascending with
// the mma sequence of flash_dq_kernel (same bits). Grid (ceil(T/64), heads of the chunk), 128
// threads; warp w owns query rows q0 + 16w ...; K tiles double-buffered in shared memory, the
// dS fragments loaded from global memory straight into registers, kAhead tiles ahead (the
// kernel streams dS from DRAM). Causal: the last query tiles (most key tiles) start first.
template <int D, bool kWg = false>
struct DsDqShape {
  static constexpr int kKTile = kBlockK * (kWg ? D : D + 8);  // swizzle-128 tiles for wgmma
  static constexpr int kSmem = 2 * kKTile * static_cast<int>(sizeof(uint16_t)) + (kWg ? 1024 : 0);
  static constexpr int kAhead = REWIND_DS_AHEAD;
  // D = 256: 128 dQ accumulators a thread plus the dS fragments need more than 168 registers.
  static constexpr int kMinBlocks = D > 128 ? 1 : (kAhead >= 2 ? 3 : 4);
};
// Dg: the head dim in memory where the wgmma kernel computes a padded one (wgmma_pad_dim), else D.
// kSr: serves the sr heads' group (its tiles stored by their dK/dV kernel); the code is the same.
template <int D, bool kWg = false, int Dg = D, bool kSr = false>
__global__ void __launch_bounds__(kThreads, DsDqShape<D, kWg>::kMinBlocks) flash_dq_ds_kernel(KernelArgs a) {
  using Sh = DsDqShape<D, kWg>;
  static_assert(Dg == D || kWg, "a padded dim: wgmma only");
  const int T = a.seq, n_t = (T + kBlockQ - 1) / kBlockQ;
  const BlockTile bt = block_tile(a.causal, true);  // longest first
  const int q_tile = bt.tile, bh = a.bh0 + bt.bh, h = bh % a.heads;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_variant(f, a.simt_fp32) != bf16_variant<false, kSr>() || f.delta_dpp) return;
  extern __shared__ __align__(16) uint16_t smem_raw[];
  uint16_t* s_k = kWg ? reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                    ~uintptr_t{1023})
                      : smem_raw;  // [2] tiles
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t base = static_cast<size_t>(bh) * T * Dg;
  const int n_kt = a.causal ? q_tile + 1 : n_t;
  // Tile (q_tile, j): the 16 bytes of key warp kk at k-step `warp` (this warp's query columns)
  // for each kk, transposed below.
  const uint4* ds = reinterpret_cast<const uint4*>(a.ds) +
                    (static_cast<size_t>(bt.bh) * ds_tiles_per_head(T, a.causal) +
                     ds_tile_index(q_tile, 0, T, a.causal)) * (kDsTileElems / 8) + warp * 32 + lane;
  auto load_ds = [&](int j, uint4 (&frag)[4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) frag[kk] = ds[static_cast<size_t>(j) * (kDsTileElems / 8) + kk * 128];
  };
  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  uint4 fr[Sh::kAhead + 1][4];  // dS fragments of tiles j, j + 1, ...
  auto load_k = [&](int j, uint16_t* dst) {
    if constexpr (kWg) {
      load_tile_sw128<D, kBlockK, kThreads, Dg>(dst, a.k + base, j * kBlockK, T);
    } else {
      load_tile_async<D>(dst, a.k + base, j * kBlockK, T);
    }
    cp_async_commit();
  };
  load_k(0, s_k);
#pragma unroll
  for (int p = 0; p < Sh::kAhead; ++p) {
    if (p < n_kt) load_ds(p, fr[p]);
  }
  for (int j = 0; j < n_kt; ++j) {
    cp_async_wait_all();
    if constexpr (kWg) fence_proxy_async();
    __syncthreads();  // K_j landed; every warp is done with K_{j-1}'s buffer
    const int buf = j & 1;
    if (j + 1 < n_kt) load_k(j + 1, s_k + (buf ^ 1) * Sh::kKTile);
    if (j + Sh::kAhead < n_kt) load_ds(j + Sh::kAhead, fr[Sh::kAhead]);
    // The 8 x 8 blocks of dS^T (keys 0-7 | 8-15 x queries 0-7 | 8-15), transposed into dS's
    // fragment: queries 0-7 x keys 0-7, queries 8-15 x keys 0-7, queries 0-7 x keys 8-15, ...
    uint32_t af[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      af[kk][0] = movmatrix_trans(fr[0][kk].x), af[kk][1] = movmatrix_trans(fr[0][kk].z);
      af[kk][2] = movmatrix_trans(fr[0][kk].y), af[kk][3] = movmatrix_trans(fr[0][kk].w);
    }
    if constexpr (kWg) {
      wgmma_pv<D>(reinterpret_cast<float(&)[D / 2]>(dq), af, s_k + buf * Sh::kKTile);  // dQ += bf16(dS) K
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) mma_afrag_b<D>(dq, af[kk], kk, s_k + buf * Sh::kKTile, lane);
    }
#pragma unroll
    for (int p = 0; p < Sh::kAhead; ++p) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) fr[p][kk] = fr[p + 1][kk];
    }
  }
  store_rows_scaled<D, Dg>(a.dq, dq, base, q_tile * kBlockQ + warp * 16 + lane / 4, T, a.scale, lane);
}

}  // namespace rwd::kernels::cuda
