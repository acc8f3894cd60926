// Device helpers of the backward kernels (attention_backward.cu): the tile matmuls on the
// tensor cores (BF16, and the split-BF16 variants of FP32 heads), how an FP32 head forms P and
// loads its planes, the head's kernel variant, delta = rowsum(dO * O) of a row, and the rows'
// FP32 gradient stores.
#pragma once

#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"

namespace rwd::kernels::cuda {

// Computes (16 rows x 64 cols) += A(16 x D rows of `a_s` at row a_row0) * B^T where B is the
// 64 x D tile `b_s` (both row-major smem with stride D + 8): the S = Q K^T pattern.
template <int D>
__device__ __forceinline__ void mma_abt(float c[8][4], const uint16_t* a_s, int a_row0,
                                        const uint16_t* b_s, int lane) {
  constexpr int kStride = D + 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4(af, a_s + (a_row0 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride + kk * 16 +
                        (lane / 16) * 8);
#pragma unroll
    for (int nb2 = 0; nb2 < 4; ++nb2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_s + (nb2 * 16 + (lane % 8) + (lane / 16) * 8) * kStride + kk * 16 +
                         ((lane / 8) % 2) * 8);
      mma_bf16(c[2 * nb2], af, b[0], b[1]);
      mma_bf16(c[2 * nb2 + 1], af, b[2], b[3]);
    }
  }
}

// acc (16 x kN) += A_kk (16 x 16, fragment af) * rows kk*16 ... +15 of the 64 x D tile `b_s`
// (row-major smem; its first kN columns, from wherever b_s points): one k-step of the A * B
// products below.
template <int D, int kN = D>
__device__ __forceinline__ void mma_afrag_b(float acc[kN / 8][4], const uint32_t af[4], int kk,
                                            const uint16_t* b_s, int lane) {
  constexpr int kStride = D + 8;
#pragma unroll
  for (int nb2 = 0; nb2 < kN / 16; ++nb2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, b_s + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                             nb2 * 16 + (lane / 16) * 8);
    mma_bf16(acc[2 * nb2], af, b[0], b[1]);
    mma_bf16(acc[2 * nb2 + 1], af, b[2], b[3]);
  }
}

// The A fragment (16 x 16, rounded to BF16) of k-step kk of a 16 x 64 operand held in the C
// layout: its columns 16 kk ... 16 kk + 15.
__device__ __forceinline__ uint4 afrag_from_cfrag(const float c[8][4], int kk) {
  return make_uint4(pack_bf16x2(c[2 * kk][0], c[2 * kk][1]), pack_bf16x2(c[2 * kk][2], c[2 * kk][3]),
                    pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]),
                    pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]));
}

// acc (16 x kN) += A (16 x 64, fragments from the C layout, rounded to BF16) * B, where B is
// the 64 x D tile `b_s` (row-major smem; kN of its columns): the Ō += P V pattern.
template <int D, int kN = D>
__device__ __forceinline__ void mma_cfrag_b(float acc[kN / 8][4], const float c[8][4],
                                            const uint16_t* b_s, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint4 f = afrag_from_cfrag(c, kk);
    const uint32_t af[4] = {f.x, f.y, f.z, f.w};
    mma_afrag_b<D, kN>(acc, af, kk, b_s, lane);
  }
}

template <class T>
__device__ __forceinline__ T quad_sum(T x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// FP32 variant of mma_abt: A and B as kPl BF16 planes each kTile apart in shared memory, all
// three read where the operand is FP32 (a3, b3), else plane 0. The terms a_i b_j with
// 1 <= i + j <= 2 go into an accumulator of their own per 16 columns, added once in FP32 at
// the end (the tensor cores' FP32 sums truncate; six truncating adds per k-step into one
// accumulator cost 2-7x the CPU twin's error). kPl == 1 is mma_abt.
template <int D, int kPl>
__device__ __forceinline__ void mma_abt_planes(float c[8][4], const uint16_t* a_s, int a_row0, bool a3,
                                               const uint16_t* b_s, bool b3, int lane) {
  if constexpr (kPl == 1) {
    mma_abt<D>(c, a_s, a_row0, b_s, lane);
  } else {
    constexpr int kStride = D + 8, kTile = kBlockQ * kStride;
#pragma unroll
    for (int nb2 = 0; nb2 < 4; ++nb2) {
      float lo[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t af[3][4], b[3][4];
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          if (i == 0 || a3) {
            ldmatrix_x4(af[i], a_s + i * kTile + (a_row0 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                                   kk * 16 + (lane / 16) * 8);
          }
          if (i == 0 || b3) {
            ldmatrix_x4(b[i], b_s + i * kTile + (nb2 * 16 + (lane % 8) + (lane / 16) * 8) * kStride +
                                  kk * 16 + ((lane / 8) % 2) * 8);
          }
        }
        mma_planes_lo(lo, af, b, a3, b3);
        mma_bf16(c[2 * nb2], af[0], b[0][0], b[0][1]);
        mma_bf16(c[2 * nb2 + 1], af[0], b[0][2], b[0][3]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        c[2 * nb2][e] = __fadd_rn(c[2 * nb2][e], lo[0][e]);
        c[2 * nb2 + 1][e] = __fadd_rn(c[2 * nb2 + 1][e], lo[1][e]);
      }
    }
  }
}

// FP32 variant of mma_cfrag_b: A (P or dS in the C layout) split into three planes in registers
// where a_split (unrounded operand), else rounded to BF16; B as kPl planes (b3: all three). Per
// 16 output columns the tile's large (a0 b0) and small terms are summed apart over its 64 rows
// and join acc in one rounded add: truncation then scales with the tile's share, not with the
// running gradient (dK, dV over all query tiles). kN: as mma_cfrag_b.
template <int D, int kPl, int kN = D>
__device__ __forceinline__ void mma_cfrag_b_planes(float acc[kN / 8][4], const float c[8][4],
                                                   bool a_split, const uint16_t* b_s, bool b3,
                                                   int lane) {
  if constexpr (kPl == 1) {
    mma_cfrag_b<D, kN>(acc, c, b_s, lane);
  } else {
    constexpr int kStride = D + 8, kTile = kBlockQ * kStride;
    uint32_t af[4][3][4];  // [k-block][plane]
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float* src = c[2 * kk + r / 2] + (r % 2) * 2;  // registers r of the A fragment
        if (a_split) {
          const Split3 x0 = split3(src[0]), x1 = split3(src[1]);
          af[kk][0][r] = pack_bf16x2(x0.x0, x1.x0);
          af[kk][1][r] = pack_bf16x2(x0.x1, x1.x1);
          af[kk][2][r] = pack_bf16x2(x0.x2, x1.x2);
        } else {
          af[kk][0][r] = pack_bf16x2(src[0], src[1]);
        }
      }
    }
#pragma unroll
    for (int nb2 = 0; nb2 < kN / 16; ++nb2) {
      float hi[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      float lo[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t b[3][4];
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          if (i > 0 && !b3) continue;
          ldmatrix_x4_trans(b[i], b_s + i * kTile + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                                      nb2 * 16 + (lane / 16) * 8);
        }
        mma_planes_lo(lo, af[kk], b, a_split, b3);
        mma_bf16(hi[0], af[kk][0], b[0][0], b[0][1]);
        mma_bf16(hi[1], af[kk][0], b[0][2], b[0][3]);
      }
      // This tile's sum joins the running gradient in one rounded FP32 add per element.
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * nb2][e] = __fadd_rn(acc[2 * nb2][e], __fadd_rn(hi[0][e], lo[0][e]));
        acc[2 * nb2 + 1][e] = __fadd_rn(acc[2 * nb2 + 1][e], __fadd_rn(hi[1][e], lo[1][e]));
      }
    }
  }
}

// P = exp(S - LSE) as the head's variant forms it: the BF16 kernels' ex2.approx, or for FP32
// heads expf, from the exact difference for softmax=fp32 (the CPU twin's double exp).
template <bool kF32>
__device__ __forceinline__ float p_from_lse(float s, float lse, const FlagView& f) {
  if constexpr (kF32) {
    return f.sm_f64 ? exp_diff_accurate(s, lse) : expf(__fsub_rn(s, lse));
  } else {
    return fast_exp(__fsub_rn(s, lse));
  }
}

// Which operands of an FP32 head are read in three planes (the split of their FP32 twin).
struct PlaneUse {
  bool q_s, k_s;  // S = Q K^T: qk=fp32
  bool do_, v;    // dP = dO V^T: dO for bwd=fp32, V for pv or bwd
  bool q_g, k_g;  // dK += dS^T Q, dQ += dS K: qk or bwd
  bool ds, p;     // dS, P unrounded (bwd=fp32)
};
template <bool kF32>
__device__ __forceinline__ PlaneUse plane_use(const FlagView& f) {
  PlaneUse u{};
  if constexpr (kF32) {
    u.q_s = u.k_s = f.qk_f32;
    u.do_ = u.ds = u.p = f.bwd_f32;
    u.v = f.pv_f32 || f.bwd_f32;
    u.q_g = u.k_g = f.qk_f32 || f.bwd_f32;
  }
  return u;
}

// Loads tile rows [row0, row0 + 64) of one operand: plane 0 (the BF16 input, or plane 0 of the
// split when `planes`) and, when `planes`, planes 1 and 2, each kTile apart.
template <int D, int kPl>
__device__ __forceinline__ void load_operand(uint16_t* dst, const uint16_t* b16,
                                             const uint16_t* const (&pl)[3], bool planes,
                                             size_t base, int row0, int T) {
  constexpr int kTile = kBlockQ * (D + 8);
#pragma unroll
  for (int i = 0; i < kPl; ++i) {
    if (i == 0 || planes) load_tile_async<D>(dst + i * kTile, (planes ? pl[i] : b16) + base, row0, T);
  }
}

// Variant of a head's backward kernels: 0 BF16, 1 FP32 (split operands), 2 BF16 rounding S or
// P stochastically (qk=sr, pv=sr: kernels of their own, kSr), -1 SIMT.
__device__ __forceinline__ int backward_variant(const FlagView& f, bool simt_fp32) {
  return backward_needs_simt(f, simt_fp32) ? -1 : backward_fp32(f) ? 1 : (f.s_sr || f.pv_sr) ? 2 : 0;
}
// The variant a kernel specialized for kF32 / kSr serves.
template <bool kF32, bool kSr>
__host__ __device__ constexpr int bf16_variant() {
  static_assert(!(kF32 && kSr), "stochastic rounding: BF16 heads");
  return kF32 ? 1 : kSr ? 2 : 0;
}

// delta = rowsum(dO * O) of query row `row` (< T, else 0), shared by the four lanes of a quad:
// every lane of the warp must call it (quad shuffles).
template <int D, bool kF32>
__device__ __forceinline__ float row_delta(const KernelArgs& a, const FlagView& f, size_t base,
                                           int row, int lane) {
  const int T = a.seq;
  // delta = rowsum(dO * O): quad lane l takes the 8-element chunks l, l + 4, ... (16-byte
  // loads), FMAs in column order within its chunks, then the quad sum.
  // FP32 heads: dO from its FP32 copy for bwd=fp32 / delta=fp32 (when given), and for
  // delta=fp32 O = o_f32 and the sum in double.
  using DeltaAcc = std::conditional_t<kF32, double, float>;
  const bool do32 = kF32 && (f.bwd_f32 || f.delta_f64) && a.do32 != nullptr;
  DeltaAcc acc = 0.0f;
  if (row < T) {
    const size_t off = base + static_cast<size_t>(row) * D;
#pragma unroll
    for (int c = (lane % 4) * 8; c < D; c += 32) {
      const uint4 dov = *reinterpret_cast<const uint4*>(a.d_o + off + c);
      const uint32_t dw[4] = {dov.x, dov.y, dov.z, dov.w};
      float o[8], g[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        g[2 * i] = bf16_bits_to_float(static_cast<uint16_t>(dw[i] & 0xffffu));
        g[2 * i + 1] = bf16_bits_to_float(static_cast<uint16_t>(dw[i] >> 16));
      }
      if (do32) {
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] = a.do32[off + c + i];
      }
      if (f.o_f32 || (kF32 && f.delta_f64)) {
        const float4 lo = *reinterpret_cast<const float4*>(a.o32 + off + c);
        const float4 hi = *reinterpret_cast<const float4*>(a.o32 + off + c + 4);
        o[0] = lo.x, o[1] = lo.y, o[2] = lo.z, o[3] = lo.w;
        o[4] = hi.x, o[5] = hi.y, o[6] = hi.z, o[7] = hi.w;
      } else {
        const uint4 ov = *reinterpret_cast<const uint4*>(a.o + off + c);
        const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          o[2 * i] = bf16_bits_to_float(static_cast<uint16_t>(ow[i] & 0xffffu));
          o[2 * i + 1] = bf16_bits_to_float(static_cast<uint16_t>(ow[i] >> 16));
        }
      }
      if (kF32 && f.delta_f64) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += static_cast<double>(g[i]) * o[i];
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc = fmaf(g[i], o[i], static_cast<float>(acc));
      }
    }
  }
  return static_cast<float>(quad_sum(acc));
}

// out[rows row_a, row_a + 8 of this thread] = alpha * acc (FP32, the mma C layout, D columns),
// rows >= T skipped: the dQ (and dK) stores. Dg < D: out has Dg columns, the rest is padding.
template <int D, int Dg = D>
__device__ __forceinline__ void store_rows_scaled(float* out, const float (&acc)[D / 8][4], size_t base,
                                                  int row_a, int T, float alpha, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    if (row >= T) continue;
    const size_t off = base + static_cast<size_t>(row) * Dg;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      if (nb * 8 >= Dg) break;
      *reinterpret_cast<float2*>(out + off + nb * 8 + (lane % 4) * 2) =
          make_float2(acc[nb][2 * r] * alpha, acc[nb][2 * r + 1] * alpha);
    }
  }
}

}  // namespace rwd::kernels::cuda
