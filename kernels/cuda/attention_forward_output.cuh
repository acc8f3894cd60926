// The forward's row state and outputs (forward_block, attention_forward_block.cuh): the rescale
// after each key tile (rescale_rows), the monitors' totals (finish_monitors), and per query
// row of a warp O = bf16(Ō / l) (o_output: optionally faulted), o_f32 = Ō / l where
// requested, and LSE = m + log(l). FP32 variant: Ō / l divided as the CPU twin divides (in double for
// softmax=fp32), l summed in double (Acc).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"

namespace rwd::kernels::cuda {

// o, m, l: the warp's kMt m16 row blocks in the mma C layout, first row w_row0; rows >= T
// are skipped. bh: the (batch, head) of the block; base: its offset in (B, H, T, Dg). Dg: the
// head dim in memory, D the one computed (Dg < D: the columns past Dg are padding, not written).
template <int D, int kMt, bool kF32, int Dg, class Acc>
__device__ __forceinline__ void write_forward_rows(const KernelArgs& a, const FlagView& f,
                                                   const float (&o)[kMt][D / 8][4], const float (&m)[kMt][2],
                                                   const Acc (&l)[kMt][2], int w_row0, size_t base, int bh,
                                                   bool sm64) {
  const int T = a.seq, lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = w_row0 + mt * 16 + lane / 4 + 8 * r;
      if (row >= T) continue;
      const size_t off = base + static_cast<size_t>(row) * Dg;
      const float inv_l = 1.0f / static_cast<float>(l[mt][r]);
      // FP32 variant: Ō / l divided as the CPU twin divides (in double for softmax=fp32).
      auto div_l = [&](float x) {
        if constexpr (kF32) {
          return sm64 ? static_cast<float>(x / l[mt][r]) : __fdiv_rn(x, static_cast<float>(l[mt][r]));
        } else {
          return x * inv_l;
        }
      };
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
        if (nb * 8 >= Dg) break;  // padding columns (Dg is a multiple of 8)
        const int col = nb * 8 + (lane % 4) * 2;
        const float x0 = div_l(o[mt][nb][2 * r]), x1 = div_l(o[mt][nb][2 * r + 1]);
        const uint32_t packed =
            static_cast<uint32_t>(float_to_bf16_bits(o_output(x0, f))) |
            (static_cast<uint32_t>(float_to_bf16_bits(o_output(x1, f))) << 16);
        *reinterpret_cast<uint32_t*>(a.o_out + off + col) = packed;
        if (a.o32_out != nullptr) {
          *reinterpret_cast<float2*>(a.o32_out + off + col) = make_float2(x0, x1);
        }
      }
      if ((lane % 4) == 0) {
        a.lse_out[static_cast<size_t>(bh) * T + row] =
            sm64 ? static_cast<float>(m[mt][r] + log(static_cast<double>(l[mt][r])))
                 : m[mt][r] + logf(static_cast<float>(l[mt][r]));
      }
    }
  }
}

// After key tile j: l = exp(m_old - m_new) l + rowsum(P̄) (rowsum: this thread's columns,
// summed over the row's 4 threads here), m = m_new; corr: the factor Ō takes (scale_rows).
// softmax=fp32 (sm64): l's rescale in double, Ō's factor in FP32 (CPU twin). Returns whether
// some row of the warp changed its max (corr != 1).
template <int kMt, bool kF32, bool kExtras, class Acc>
__device__ __forceinline__ bool update_rows(const FlagView& f, float (&m)[kMt][2], Acc (&l)[kMt][2],
                                            const float (&m_new)[kMt][2], const Acc (&rowsum)[kMt][2], bool sm64,
                                            float (&corr)[kMt][2]) {
  bool changed = false;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      Acc corr_l;
      if (kF32 && sm64) {
        corr_l = m[mt][r] == -INFINITY ? 0.0 : exp(static_cast<double>(m[mt][r]) - m_new[mt][r]);
        corr[mt][r] = static_cast<float>(corr_l);
      } else {
        corr[mt][r] = rescale_factor(m[mt][r], m_new[mt][r]);
        corr_l = corr[mt][r];
      }
      m[mt][r] = m_new[mt][r];
      Acc sum = rowsum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[mt][r] = l[mt][r] * corr_l + sum;
      if (kExtras && f.acc_bf16) l[mt][r] = round_bf16(static_cast<float>(l[mt][r]));
      changed |= corr[mt][r] != 1.0f;
    }
  }
  return __any_sync(0xffffffffu, changed);
}
// Ō *= corr, row by row.
template <int D, int kMt>
__device__ __forceinline__ void scale_rows(float (&o)[kMt][D / 8][4], const float (&corr)[kMt][2]) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[mt][i][0] *= corr[mt][0];
      o[mt][i][1] *= corr[mt][0];
      o[mt][i][2] *= corr[mt][1];
      o[mt][i][3] *= corr[mt][1];
    }
  }
}
// update_rows, then Ō rescaled where some row of the warp changed its max: multiplying by
// exactly 1 is the identity, so skipping it changes no bit.
template <int D, int kMt, bool kF32, bool kExtras, class Acc>
__device__ __forceinline__ void rescale_rows(const FlagView& f, float (&m)[kMt][2], Acc (&l)[kMt][2],
                                             float (&o)[kMt][D / 8][4], const float (&m_new)[kMt][2],
                                             const Acc (&rowsum)[kMt][2], bool sm64) {
  float corr[kMt][2];
  if (update_rows<kMt, kF32, kExtras>(f, m, l, m_new, rowsum, sm64, corr)) scale_rows<D, kMt>(o, corr);
}

// The monitors of a warp's rows after its key loop, added to the head's stats (flush_stats):
// rows, rows whose max repeated (run_cnt > 1) and P̄ == 1 beyond the first per row (counted
// per thread in `ones` with extras, else on the tensor cores in every C column of ones_acc).
template <int kMt, bool kExtras>
__device__ __forceinline__ void finish_monitors(const KernelArgs& a, StatAcc st, int (&ones)[kMt][2],
                                                const float (&ones_acc)[kMt][4], const int (&run_cnt)[kMt][2],
                                                int w_row0, int h) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (kExtras) {
        ones[mt][r] += __shfl_xor_sync(0xffffffffu, ones[mt][r], 1);
        ones[mt][r] += __shfl_xor_sync(0xffffffffu, ones[mt][r], 2);
      } else {
        ones[mt][r] = static_cast<int>(ones_acc[mt][2 * r]);
      }
      if ((lane % 4) == 0 && w_row0 + mt * 16 + lane / 4 + 8 * r < a.seq) {
        st.rows += 1;
        st.repeated += run_cnt[mt][r] > 1;
        st.pbar_one += ones[mt][r] > 1 ? ones[mt][r] - 1 : 0;
      }
    }
  }
  flush_stats(st, a.stats + h);
}

}  // namespace rwd::kernels::cuda
