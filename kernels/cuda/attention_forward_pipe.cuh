// The plain BF16 forward of the TMA kernels (D = 128: two warpgroups, K/V through the KvRing)
// with FlashAttention-3's overlap within a warpgroup: S of key tile j + 1 and Ō += P̄ V of
// tile j are issued together, and the softmax of tile j + 1 (FP32) runs while P̄V of tile j is
// on the tensor cores; P̄ is packed into the P̄V operand after that product is waited for.
// forward_block takes this loop for plain heads (no extras or ties), with or without the
// monitors (kStats: what training runs; counted after the exponentials, as there), unless
// REWIND_FWD_PIPE=0. Same bits as the unpipelined loop: every row sees the same tiles in the
// same order, and Ō is rescaled by tile j + 1's factor after P̄V of tile j is added and before
// P̄V of tile j + 1 is, as there (AttentionCuda.WgmmaKernelsEqualMmaKernelsBitwise); the
// monitors count the same tiles (AttentionCuda.MonitorsCountExactlyOnIntegerLogits).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_forward_config.cuh"
#include "kernels/cuda/attention_forward_output.cuh"
#include "kernels/cuda/attention_forward_tile.cuh"
#include "kernels/cuda/attention_sr.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

#ifndef REWIND_FWD_PIPE
#define REWIND_FWD_PIPE 1
#endif

namespace rwd::kernels::cuda {

// kSr: pv=sr alone (forward_variant): P̄ = exp of the exact difference S - m, as the extras and
// sr variants form it, and the P̄V operand rounded stochastically in FP32 registers while P̄V of
// the tile before is on the tensor cores (pack_p_tile then packs BF16 values exactly): the bits
// of the same head in forward_block's sr variant.
template <int D, bool kStats, int Dg = D, bool kSr = false>
__device__ __forceinline__ void forward_block_pipelined(const KernelArgs& a, const FlagView& f,
                                                        uint16_t* smem_in, BlockTile bt, const TmaMaps* tm) {
  using Tr = FwdWgTraits<D>;
  using Shape = FwdShape<D, false, true>;
  static_assert(Shape::kTma && Tr::kQRegs && Tr::kMt == 1 && Shape::kStages >= 2,
                "pipelined loop: TMA kernels with Q in registers, a ring of two stages or more");
  static_assert(!(kSr && kStats), "pv=sr with monitors: the extras variant (forward_variant)");
  constexpr int kRows = Shape::kRows, kStages = Shape::kStages, kTile = kBlockK * D;
  uint16_t* smem = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(smem_in) + 1023) & ~uintptr_t{1023});
  uint16_t* s_q = smem;              // [kRows][D], swizzle-128
  uint16_t* s_k = smem + kRows * D;  // [kStages][64][D]
  uint16_t* s_v = s_k + kStages * kTile;
  const KvRing<D, kStages, Tr::kWarps, Shape::kProducerGroup> ring{
      reinterpret_cast<uint64_t*>(s_v + kStages * kTile), s_k, s_v};
  const int bh = bt.bh, q0 = bt.tile * kRows, T = a.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t base = static_cast<size_t>(bh) * T * Dg;  // Dg: forward_block
  const int n_all = (T + kBlockK - 1) / kBlockK;
  const int n_kt = a.causal ? min(n_all, (q0 + kRows - 1) / kBlockK + 1) : n_all;
  const int w_row0 = q0 + warp * 16;
  // This warpgroup's tiles: causal tiles right of its last row are skipped (the same count for
  // its 4 warps: warpgroups are 64-row aligned). The warpgroup index comes through a shuffle,
  // which ptxas knows to be warp-uniform: so is the loop's bound, and the wgmma descriptors
  // stay in uniform registers (from a per-thread bound: two R2UR and a move per wgmma; the
  // plain forward 0.305-0.310 ms against 0.320-0.331 on the H200).
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int n_mine = a.causal ? min(n_kt, (q0 + wg * 64) / kBlockK + 1) : n_kt;

  ring.template start<kRows>(s_q, tm, q0, bh, n_kt);
  if (ring.run_producer(tm, n_kt, bh)) return;  // the producer warpgroup's loads

  float o[1][D / 8][4];
  float(&o_flat)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o[0]);
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o_flat[i] = 0.0f;
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}};
  int ones[1][2] = {{0, 0}};  // unused: no extras
  // Monitors (kStats): as forward_block's plain monitored heads (count_ties_after_exp).
  float run_max[1][2] = {{-INFINITY, -INFINITY}}, ones_acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  int run_cnt[1][2] = {{0, 0}};
  StatAcc st;
  uint32_t qf[D / 16][4];
  uint32_t pa[1][1][4][4];  // P̄ as the A operand of P̄V (one buffer: packed after the wait)
  float s[1][8][4], pf[8][4];  // S of the tile; P̄ in FP32
  float(&s32)[32] = reinterpret_cast<float(&)[32]>(s[0]);

  // The softmax of tile j on s (waited for), in FP32: the running max after it, P̄ in pf, the
  // row sums of the unrounded P̄ (as exp_tile: same order).
  // pv=sr: the pv stream of this head and the words of the thread's two rows (stochastic_round.h).
  const uint64_t pv_stream = kSr ? sr_streams(a.sr_key, bh, a.heads).pv : 0;
  const uint32_t sr_rows[2] = {kSr ? sr_row_word(pv_stream, w_row0 + lane / 4) : 0u,
                               kSr ? sr_row_word(pv_stream, w_row0 + lane / 4 + 8) : 0u};
  auto softmax = [&](int j, float (&m_new)[1][2], float (&rowsum)[1][2], float (&r_m)[1][2]) {
    finish_tile<1, false>(s, a, f, j, w_row0);
    tile_row_max(s, r_m);
    m_new[0][0] = fmaxf(m[0][0], r_m[0][0]);
    m_new[0][1] = fmaxf(m[0][1], r_m[0][1]);
    exp_tile_fp32<kSr>(s[0], m_new[0], pf, rowsum[0]);
    if constexpr (kSr) sr_round_p_tile(pf, f.pv_bias, pv_stream, sr_rows, j * kBlockK + (lane % 4) * 2);
  };
  // The tile's monitors on P̄ packed (pt: the P̄V operand's bits).
  auto monitors = [&](const float (&r_m)[1][2], const uint32_t (&pt)[4][4]) {
    const int row_a = w_row0 + lane / 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if ((lane % 4) == 0 && row_a + 8 * r < T) st.max_logit = fmaxf(st.max_logit, r_m[0][r]);
    }
    count_ties_after_exp(s[0], r_m[0], pt, row_a < T, row_a + 8 < T, ones_acc[0], run_max[0], run_cnt[0]);
  };

  // Tile 0: Q into registers (mma A fragments from the swizzled tile), S, softmax.
  ring.wait_q();
  ring.wait(0);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int row = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8, col = kk * 16 + (lane / 16) * 8;
    ldmatrix_x4(qf[kk], s_q + sw128_offset(row, col, kRows) / 2);
  }
  wgmma_scores_rs_issue<D>(s32, qf, wgmma_desc(s_k, 16, 1024));  // S = Q K^T (s not read)
  wgmma_scores_wait(s32);
  {
    float m_new[1][2], rowsum[1][2], r_m[1][2];
    softmax(0, m_new, rowsum, r_m);
    pack_p_tile(pf, pa[0][0]);
    if constexpr (kStats) monitors(r_m, pa[0][0]);
    rescale_rows<D, 1, false, false>(f, m, l, o, m_new, rowsum, false);
  }
  // One step, tile j < n_mine - 1: S of tile j + 1 and P̄V of tile j in flight together,
  // behind one wgmma.fence with every register operand fenced before it; the FP32 softmax of
  // tile j + 1 runs meanwhile, and P̄ is packed into the operand registers after P̄V of tile j
  // is waited for (as FlashAttention-3). No accumulator or operand register is written between
  // the two issues and no branch sits around them (ptxas would serialize them: C7513, C7514,
  // C7520).
  auto step = [&](int j) {
    ring.produce_ahead(tm, j, n_kt, bh);
    ring.wait(j + 1);
    const uint64_t dk = wgmma_desc(s_k + ((j + 1) % kStages) * kTile, 16, 1024);
    const uint64_t dv = wgmma_desc(s_v + (j % kStages) * kTile, 64 * 128, 1024);
    wgmma_fence_operand(s32);
    wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[D / 4]>(qf));
    wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(pa[0][0]));
    wgmma_fence_operand(o_flat);
    wgmma_fence();
    wgmma_scores_rs_issue<D, false>(s32, qf, dk);
    wgmma_pv_issue<D, false>(o_flat, pa[0][0], dv);
    wgmma_wait<1>();  // S of tile j + 1 (committed first); P̄V of tile j may still run
    wgmma_fence_operand(s32);
    float m_new[1][2], rowsum[1][2], r_m[1][2];
    softmax(j + 1, m_new, rowsum, r_m);
    // The wait for P̄V of tile j sits in the branches after the vote: ptxas places a wgmma
    // wait at the top of its basic block, and in the softmax's block (where it was) that put it
    // ahead of the exponentials, out of the overlap. Plain forward unchanged by this, monitored
    // 0.413-0.429 ms against 0.439-0.454 (H200, same calls).
    float corr[1][2];
    if (update_rows<1, false, false>(f, m, l, m_new, rowsum, false, corr)) {
      wgmma_wait<0>();
      wgmma_fence_operand(o_flat);
      scale_rows<D, 1>(o, corr);
    } else {
      wgmma_wait<0>();
      wgmma_fence_operand(o_flat);
    }
    wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(pa[0][0]));  // read until here
    ring.release(j);
    // P̄ into the operand, then the monitors on its bits (counted before the wait, into a
    // buffer of their own, the monitored forward was slower: 0.444-0.454 ms against 0.417-0.423).
    pack_p_tile(pf, pa[0][0]);
    if constexpr (kStats) monitors(r_m, pa[0][0]);
  };
  for (int j = 0; j + 1 < n_mine; ++j) step(j);
  // The last tile's P̄V.
  wgmma_pv<D>(o_flat, pa[0][0], s_v + ((n_mine - 1) % kStages) * kTile);
  ring.release(n_mine - 1);
  // The other warpgroup's last tile, skipped here: released in order (after it arrived).
  for (int t = n_mine; t < n_kt; ++t) {
    ring.wait(t);
    ring.release(t);
  }
  write_forward_rows<D, 1, false, Dg>(a, f, o, m, l, w_row0, base, bh, false);
  if constexpr (kStats) finish_monitors<1, false>(a, st, ones, ones_acc, run_cnt, w_row0, bh % a.heads);
}

}  // namespace rwd::kernels::cuda
