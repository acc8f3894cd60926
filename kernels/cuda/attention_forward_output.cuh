// The forward's outputs (forward_block, attention_forward_block.cuh): per query row of a warp,
// O = bf16(Ō / l) (o_output: optionally faulted), o_f32 = Ō / l where requested, and
// LSE = m + log(l). FP32 variant: Ō / l divided as the CPU twin divides (in double for
// softmax=fp32), l summed in double (Acc).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"

namespace rwd::kernels::cuda {

// o, m, l: the warp's kMt m16 row blocks in the mma C layout, first row w_row0; rows >= T
// are skipped. bh: the (batch, head) of the block; base: its offset in (B, H, T, D).
template <int D, int kMt, bool kF32, class Acc>
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
      const size_t off = base + static_cast<size_t>(row) * D;
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

}  // namespace rwd::kernels::cuda
