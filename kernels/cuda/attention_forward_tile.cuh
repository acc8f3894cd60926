// Per-tile steps of the tensor-core forward (forward_block, attention_forward_block.cuh, and the
// pipelined plain loop, attention_forward_pipe.cuh) on a warp's S tile in the mma C layout: a
// thread holds, per m16 block mt, rows r_a = 16 mt + lane/4 and r_a + 8 of its warp, columns
// 8 nb + 2 (lane%4) + {0,1} of the 64-key tile. The rounding points are those listed at the top
// of attention_forward_block.cuh.
#pragma once

#include <cmath>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/attention_sr.cuh"

namespace rwd::kernels::cuda {

// Scale, optional qk fault and BF16 rounding of S (kExtras; kSr: qk=sr's stochastic rounding
// with the bits of the qk stream), then the mask (causal and T tail) -> -inf for key tile j;
// w_row0: the warp's first query row. The mask is a separate pass, taken only by tiles that
// need it: inside the element loop a runtime test costs a branch per element even where it is
// false.
template <int kMt, bool kExtras, bool kSr = false>
__device__ __forceinline__ void finish_tile(float (&s)[kMt][8][4], const KernelArgs& a, const FlagView& f, int j,
                                            int w_row0, uint64_t qk_stream = 0) {
  const int T = a.seq, lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[mt][nb][e] = kExtras ? finish_score(s[mt][nb][e], a.scale, f) : __fmul_rn(a.scale, s[mt][nb][e]);
      }
    }
    if constexpr (kSr) {
      if (f.s_sr) sr_round_rows<8>(s[mt], qk_stream, w_row0 + mt * 16 + lane / 4, j * kBlockK + (lane % 4) * 2);
    }
  }
  const bool need_mask = (a.causal && j * kBlockK + kBlockK - 1 > w_row0) || (j + 1) * kBlockK > T;
  if (need_mask) {
    const int col0 = j * kBlockK + (lane % 4) * 2;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      const int row_a = w_row0 + mt * 16 + lane / 4;
      // Last visible column of each of the thread's two rows.
      const int last[2] = {a.causal ? min(row_a, T - 1) : T - 1, a.causal ? min(row_a + 8, T - 1) : T - 1};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = col0 + nb * 8 + (e & 1);
          s[mt][nb][e] = col > last[e / 2] ? -INFINITY : s[mt][nb][e];
        }
      }
    }
  }
}

// Row max r_m of the tile, with two partial maxima per row (even / odd n-blocks: shorter
// dependency chains), over the row's 4 threads.
template <int kMt>
__device__ __forceinline__ void tile_row_max(const float (&s)[kMt][8][4], float (&r_m)[kMt][2]) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    float mx[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};  // [row][nb parity]
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e / 2][nb & 1] = fmaxf(mx[e / 2][nb & 1], s[mt][nb][e]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      r_m[mt][r] = fmaxf(mx[r][0], mx[r][1]);
      r_m[mt][r] = fmaxf(r_m[mt][r], __shfl_xor_sync(0xffffffffu, r_m[mt][r], 1));
      r_m[mt][r] = fmaxf(r_m[mt][r], __shfl_xor_sync(0xffffffffu, r_m[mt][r], 2));
    }
  }
}

// P̄ = exp(S - mn) of one tile (FP32, fast_exp_shifted), this thread's part of each row's sum
// of the unrounded P̄, and the P̄V operand packed as mma A fragments (4 k-blocks of 16 keys).
// FP32 variant: plane 0 of pa is bf16(P̄V operand); a pv=fp32 head also gets planes 1, 2 (the
// exact split of P̄); the row sums are double (Acc). With extras and monitors, the P̄ that round
// to 1 are counted per thread in `ones`. kSr: a pv=sr head's operand is rounded stochastically
// with the bits of the pv stream (sr) at (row, key); w_row0 is the warp's first row, col0 the
// tile's first key + 2 (lane % 4).
template <int kMt, int kPl, bool kF32, bool kExtras, bool kStats, bool kSr = false, class Acc>
__device__ __forceinline__ void exp_tile(const float (&s)[kMt][8][4], const float (&mn)[kMt][2],
                                         uint32_t (&pa)[kPl][kMt][4][4], Acc (&rowsum)[kMt][2], int (&ones)[kMt][2],
                                         const FlagView& f, bool sm64, bool pv32, uint64_t sr = 0, int w_row0 = 0,
                                         uint32_t col0 = 0) {
  static_assert(!kSr || !kF32, "stochastic rounding: the BF16 variants");
  // The words of the thread's 8 key pairs, shared by its rows (stochastic_round.h).
  uint32_t cw[kSr ? 8 : 1];
  if constexpr (kSr) {
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) cw[nb] = sr_col_word(sr, col0 + 8u * nb);
  }
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    uint32_t rw[2] = {0, 0};
    if constexpr (kSr) {
      const int row_a = w_row0 + mt * 16 + static_cast<int>(threadIdx.x % 32) / 4;
      rw[0] = sr_row_word(sr, row_a);
      rw[1] = sr_row_word(sr, row_a + 8);
    }
    rowsum[mt][0] = rowsum[mt][1] = 0.0f;
    const float m_log2[2] = {__fmul_rn(mn[mt][0], kLog2e), __fmul_rn(mn[mt][1], kLog2e)};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // The faults test P̄ < 1, which needs P̄ = 1 exactly at S = m: exact S - m there.
        float pbar = kF32 && sm64 ? exp_diff_accurate(s[mt][nb][e], mn[mt][e / 2])
                   : kF32         ? expf(__fsub_rn(s[mt][nb][e], mn[mt][e / 2]))
                   : kExtras || kSr ? fast_exp(__fsub_rn(s[mt][nb][e], mn[mt][e / 2]))
                                  : fast_exp_shifted(s[mt][nb][e], m_log2[e / 2]);
        if constexpr (kExtras) pbar = softmax_fault(pbar, f);
        rowsum[mt][e / 2] += pbar;
        p[e] = pbar;
        if constexpr (kExtras) p[e] = kSr && f.pv_sr ? __fmul_rn(pbar, f.pv_bias) : pv_operand(pbar, f);
        else if constexpr (kSr) p[e] = __fmul_rn(pbar, f.pv_bias);  // pv=sr alone (f.pv_sr)
        if (kStats && kExtras && round_bf16(pbar) == 1.0f) ++ones[mt][e / 2];
      }
      if constexpr (kSr) {  // pv=sr: one 32-bit draw per row for the pair of keys
        if (f.pv_sr) {
#pragma unroll
          for (int r = 0; r < 2; ++r) sr_round_pair(p[2 * r], p[2 * r + 1], sr_pair_bits(rw[r], cw[nb]));
        }
      }
      // pack_bf16x2 rounds to nearest even: the PV operand bf16(P̄ (1 + c)).
      pa[0][mt][nb / 2][(nb % 2) * 2 + 0] = pack_bf16x2(p[0], p[1]);
      pa[0][mt][nb / 2][(nb % 2) * 2 + 1] = pack_bf16x2(p[2], p[3]);
      if constexpr (kF32) {
        if (pv32) {
          const Split3 x[4] = {split3(p[0]), split3(p[1]), split3(p[2]), split3(p[3])};
          pa[1][mt][nb / 2][(nb % 2) * 2 + 0] = pack_bf16x2(x[0].x1, x[1].x1);
          pa[1][mt][nb / 2][(nb % 2) * 2 + 1] = pack_bf16x2(x[2].x1, x[3].x1);
          pa[2][mt][nb / 2][(nb % 2) * 2 + 0] = pack_bf16x2(x[0].x2, x[1].x2);
          pa[2][mt][nb / 2][(nb % 2) * 2 + 1] = pack_bf16x2(x[2].x2, x[3].x2);
        }
      }
    }
  }
}

// The plain BF16 heads' P̄ = exp(S - mn) of one row block in FP32 (fast_exp_shifted), and
// this thread's part of each row's sum of the unrounded P̄: exp_tile's plain case without the
// packing (the pipelined loop packs after P̄V of the tile before is waited for: pack_p_tile).
// kExact: P̄ = exp of the exact difference S - mn (fast_exp), as the extras and sr variants form
// it (pv=sr alone takes this loop with those bits).
template <bool kExact = false>
__device__ __forceinline__ void exp_tile_fp32(const float (&s)[8][4], const float (&mn)[2], float (&p)[8][4],
                                              float (&rowsum)[2]) {
  rowsum[0] = rowsum[1] = 0.0f;
  const float m_log2[2] = {__fmul_rn(mn[0], kLog2e), __fmul_rn(mn[1], kLog2e)};
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[nb][e] = kExact ? fast_exp(__fsub_rn(s[nb][e], mn[e / 2])) : fast_exp_shifted(s[nb][e], m_log2[e / 2]);
      rowsum[e / 2] += p[nb][e];
    }
  }
}
// P̄ packed as the P̄V operand (BF16, nearest even), as exp_tile packs it.
__device__ __forceinline__ void pack_p_tile(const float (&p)[8][4], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) {
    pa[nb / 2][(nb % 2) * 2 + 0] = pack_bf16x2(p[nb][0], p[nb][1]);
    pa[nb / 2][(nb % 2) * 2 + 1] = pack_bf16x2(p[nb][2], p[nb][3]);
  }
}

}  // namespace rwd::kernels::cuda
