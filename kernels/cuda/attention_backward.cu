// FlashAttention-2 backward on tensor cores (mma.sync BF16, FP32 accumulate) and the public
// backward launcher.
//
// Rounding points (DESIGN §4), recomputing S exactly as the forward did:
//   P = exp(S - LSE)                        FP32
//   dV += bf16(P)^T dO                      FP32 accumulate
//   dP = dO V^T                             FP32
//   delta = rowsum(dO * O)  (O = bf16 output, or o_f32 for o=fp32 heads)
//         | rowsum(dP * P)  (delta=dpp: an extra pass over the keys in the dQ kernel)
//   dS = P * (dP - delta)                   FP32
//   dQ = alpha * (bf16(dS) K),  dK = alpha * (bf16(dS)^T Q)   (alpha applied once, in FP32)
// Outputs dq, dk, dv are FP32; the caller rounds them to BF16. Heads with qk, pv, softmax, bwd
// or delta promoted run the FP32 variant (kF32: split-BF16 operands, beside the BF16 heads on a
// second stream); a delta fault, or delta=fp32 with delta=dpp, the SIMT kernels. CPU twin:
// kernels/attention_backward_cpu.cpp.
//
// Determinism: no float atomics. Kernel 1 (one block per query tile) computes delta and dQ,
// looping over the key tiles in a fixed order; kernel 2 (one block per key tile) accumulates
// dK and dV in registers, looping over the query tiles in a fixed order. Every output element
// is written by exactly one thread, so dQ, dK, dV are bitwise identical on every run (dQ costs
// a recomputation of S and dP: 7 matrix products per tile pair instead of FA2's 5; a fused
// variant that added dQ partials into a workspace in a fixed key-tile order, handing over
// between blocks through counters, measured 1.6-1.9x slower: experiments/cuda_bench/RESULTS.md).
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_backward_mma.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"

namespace rwd::kernels::cuda {

// ---------------------------------------------------------------------------------------------
// CUDA kernels

// K/V buffers of the dQ kernel: 2 = double-buffered (next tile loads during this one), 1 =
// single (4 tiles of smem instead of 6, so more blocks fit an SM; loads wait behind barriers).
// D = 128 takes 1: 4 tiles of 17 KB let 3 blocks share an SM (6 tiles: 2), measured 15%
// faster (experiments/cuda_bench/RESULTS.md); D = 64 fits 3 blocks either way.
#ifndef REWIND_DQ64_KV_STAGES
#define REWIND_DQ64_KV_STAGES 2
#endif
#ifndef REWIND_DQ128_KV_STAGES
#define REWIND_DQ128_KV_STAGES 1
#endif
template <int D>
constexpr int kDqKvStages = D == 64 ? REWIND_DQ64_KV_STAGES : REWIND_DQ128_KV_STAGES;
// Blocks per SM the register allocation of each kernel must allow (__launch_bounds__).
#ifndef REWIND_DQ_MIN_BLOCKS
#define REWIND_DQ_MIN_BLOCKS 3
#endif
#ifndef REWIND_DKDV64_MIN_BLOCKS
#define REWIND_DKDV64_MIN_BLOCKS 3  // D = 128 keeps 1: at 3 blocks (168 registers) it spills
#endif

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
  static constexpr int kMinBlocksDq = kF32 ? (D == 64 ? 2 : 1) : REWIND_DQ_MIN_BLOCKS;
  static constexpr int kMinBlocksKv = kF32 ? 1 : (D == 64 ? REWIND_DKDV64_MIN_BLOCKS : 1);
};

// Variant of a head's backward kernels: 0 BF16, 1 FP32 (split operands), -1 SIMT.
__device__ __forceinline__ int backward_variant(const FlagView& f, bool simt_fp32) {
  return backward_needs_simt(f, simt_fp32) ? -1 : backward_fp32(f) ? 1 : 0;
}

// delta and dQ. Grid (ceil(T/64), B*H), 128 threads; warp w owns query rows q0 + 16w ...
// For delta=dpp heads the key loop runs twice: pass 0 sums dP * P into delta, pass 1 forms dQ.
// kF32: the heads with an FP32 op (PlaneUse says which operands come in planes); delta from the
// FP32 dO for bwd=fp32, in double for delta=fp32.
template <int D, bool kF32>
__global__ void __launch_bounds__(kThreads, BwdShape<D, kF32>::kMinBlocksDq) flash_dq_kernel(KernelArgs a) {
  constexpr int kTile = kBlockQ * (D + 8);
  constexpr int kPl = BwdShape<D, kF32>::kPl, kSt = BwdShape<D, kF32>::kDqStages;
  // Causal: the last query tiles (most key tiles) start first.
  const int q_tile = a.causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  const int bh = blockIdx.y, h = bh % a.heads, q0 = q_tile * kBlockQ, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_variant(f, a.simt_fp32) != (kF32 ? 1 : 0)) return;
  const PlaneUse u = plane_use<kF32>(f);
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_q = smem;                      // [kPl] tiles
  uint16_t* s_do = smem + kPl * kTile;       // [kPl]
  uint16_t* s_k = smem + 2 * kPl * kTile;    // [kSt][kPl]
  uint16_t* s_v = smem + (2 + kSt) * kPl * kTile;  // [kSt][kPl]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_a = q0 + warp * 16 + lane / 4;
  const size_t base = static_cast<size_t>(bh) * T * D, row_base = static_cast<size_t>(bh) * T;
  const int n_kt = a.causal ? q_tile + 1 : (T + kBlockK - 1) / kBlockK;
  const int n_pass = f.delta_dpp ? 2 : 1;

  auto load_k = [&](uint16_t* dst, int j) {
    load_operand<D, kPl>(dst, a.k, a.k_pl, u.k_s || u.k_g, base, j * kBlockK, T);
  };
  auto load_v = [&](uint16_t* dst, int j) { load_operand<D, kPl>(dst, a.v, a.v_pl, u.v, base, j * kBlockK, T); };
  load_operand<D, kPl>(s_q, a.q, a.q_pl, u.q_s, base, q0, T);
  load_operand<D, kPl>(s_do, a.d_o, a.do_pl, u.do_, base, q0, T);
  load_k(s_k, 0);
  load_v(s_v, 0);
  cp_async_commit();

  float lse[2], delta[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    lse[r] = row < T ? a.lse_in[row_base + row] : 0.0f;
    if (!f.delta_dpp) {
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
      delta[r] = static_cast<float>(quad_sum(acc));
    }
  }

  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  float dpp_acc[2] = {0.0f, 0.0f};

  for (int jj = 0; jj < n_pass * n_kt; ++jj) {
    const int j = jj % n_kt;
    const bool main_pass = jj >= (n_pass - 1) * n_kt;
    cp_async_wait_all();
    __syncthreads();
    const int buf = kSt == 2 ? (jj & 1) : 0;
    const uint16_t* k_t = s_k + buf * kPl * kTile;
    const uint16_t* v_t = s_v + buf * kPl * kTile;
    const bool more = jj + 1 < n_pass * n_kt;
    const int jn = (jj + 1) % n_kt;
    if (kSt == 2 && more) {
      load_k(s_k + (buf ^ 1) * kPl * kTile, jn);
      load_v(s_v + (buf ^ 1) * kPl * kTile, jn);
      cp_async_commit();
    }

    float s[8][4], dp[8][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = dp[nb][e] = 0.0f;
    }
    mma_abt_planes<D, kPl>(s, s_q, warp * 16, u.q_s, k_t, u.k_s, lane);    // S = Q K^T
    mma_abt_planes<D, kPl>(dp, s_do, warp * 16, u.do_, v_t, u.v, lane);    // dP = dO V^T
    if (kSt == 1) {  // every warp is done with V_j: load V_{j+1} behind dS and dQ
      __syncthreads();
      if (more) {
        load_v(s_v, jn);
        cp_async_commit();
      }
    }
    // P = exp(S - LSE); masked entries (causal, T tail) -> 0 in a pass of their own, taken only
    // by the tiles that need it (a runtime test inside the element loop costs a branch each).
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = p_from_lse<kF32>(finish_score(s[nb][e], a.scale, f), lse[e / 2], f);
      }
    }
    const bool need_mask = (a.causal && j == q_tile) || (j + 1) * kBlockK > T;
    if (need_mask) {
      const int last[2] = {a.causal ? min(row_a, T - 1) : T - 1,  // last visible key per row
                           a.causal ? min(row_a + 8, T - 1) : T - 1};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * kBlockK + nb * 8 + (lane % 4) * 2 + (e & 1);
          s[nb][e] = col > last[e / 2] ? 0.0f : s[nb][e];
        }
      }
    }
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (main_pass) {
          s[nb][e] = s[nb][e] * (dp[nb][e] - delta[e / 2]);  // dS, rounded to BF16 when packed
        } else {
          dpp_acc[e / 2] = fmaf(dp[nb][e], s[nb][e], dpp_acc[e / 2]);
        }
      }
    }
    if (!main_pass && j == n_kt - 1) {
      delta[0] = quad_sum(dpp_acc[0]);
      delta[1] = quad_sum(dpp_acc[1]);
    }
    if (main_pass) mma_cfrag_b_planes<D, kPl>(dq, s, u.ds, k_t, u.k_g, lane);  // dQ += bf16(dS) K
    if (kSt == 1) {  // every warp is done with K_j
      __syncthreads();
      if (more) {
        load_k(s_k, jn);
        cp_async_commit();
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    if (row >= T) continue;
    if ((lane % 4) == 0) a.delta[row_base + row] = delta[r];
    const size_t off = base + static_cast<size_t>(row) * D;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      *reinterpret_cast<float2*>(a.dq + off + nb * 8 + (lane % 4) * 2) =
          make_float2(dq[nb][2 * r] * a.scale, dq[nb][2 * r + 1] * a.scale);
    }
  }
}

// dK and dV. Grid (ceil(T/64), B*H), 128 threads; warp w owns keys k0 + 16w ... as the rows
// of the mma C layout (S^T = K Q^T), so dK and dV stay in registers for the whole query loop.
// kF32: as in flash_dq_kernel; Q and dO single-buffered.
template <int D, bool kF32>
__global__ void __launch_bounds__(kThreads, BwdShape<D, kF32>::kMinBlocksKv) flash_dkdv_kernel(KernelArgs a) {
  constexpr int kTile = kBlockQ * (D + 8);
  constexpr int kPl = BwdShape<D, kF32>::kPl, kSt = BwdShape<D, kF32>::kKvStages;
  // Causal: the first key tiles (most query tiles) come first in the grid.
  const int j = blockIdx.x;
  const int bh = blockIdx.y, h = bh % a.heads, k0 = j * kBlockK, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_variant(f, a.simt_fp32) != (kF32 ? 1 : 0)) return;
  const PlaneUse u = plane_use<kF32>(f);
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_k = smem;                          // [kPl] tiles
  uint16_t* s_v = smem + kPl * kTile;            // [kPl]
  uint16_t* s_q = smem + 2 * kPl * kTile;        // [kSt][kPl]
  uint16_t* s_do = s_q + kSt * kPl * kTile;      // [kSt][kPl]
  float* s_lse = reinterpret_cast<float*>(s_do + kSt * kPl * kTile);  // [kSt][64]
  float* s_delta = s_lse + kSt * kBlockQ;                             // [kSt][64]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int key_a = k0 + warp * 16 + lane / 4;
  const size_t base = static_cast<size_t>(bh) * T * D, row_base = static_cast<size_t>(bh) * T;
  const int n_qt = (T + kBlockQ - 1) / kBlockQ, i0 = a.causal ? j : 0;

  auto load_rows = [&](int i, int buf) {
    load_operand<D, kPl>(s_q + buf * kPl * kTile, a.q, a.q_pl, u.q_s || u.q_g, base, i * kBlockQ, T);
    load_operand<D, kPl>(s_do + buf * kPl * kTile, a.d_o, a.do_pl, u.do_, base, i * kBlockQ, T);
    if (tid < kBlockQ) {
      const int q = i * kBlockQ + tid;
      s_lse[buf * kBlockQ + tid] = q < T ? a.lse_in[row_base + q] : 0.0f;
      s_delta[buf * kBlockQ + tid] = q < T ? a.delta[row_base + q] : 0.0f;
    }
  };
  load_operand<D, kPl>(s_k, a.k, a.k_pl, u.k_s, base, k0, T);
  load_operand<D, kPl>(s_v, a.v, a.v_pl, u.v, base, k0, T);
  load_rows(i0, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  }

  for (int i = i0; i < n_qt; ++i) {
    if (kSt == 1 && i > i0) {  // one buffer: every warp is done with query tile i - 1
      __syncthreads();
      load_rows(i, 0);
      cp_async_commit();
    }
    const int buf = kSt == 2 ? (i - i0) & 1 : 0;
    cp_async_wait_all();
    __syncthreads();
    if (kSt == 2 && i + 1 < n_qt) {
      load_rows(i + 1, buf ^ 1);
      cp_async_commit();
    }
    const uint16_t* q_t = s_q + buf * kPl * kTile;
    const uint16_t* do_t = s_do + buf * kPl * kTile;
    const float* lse = s_lse + buf * kBlockQ;
    const float* dlt = s_delta + buf * kBlockQ;

    float p[8][4], dp[8][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[nb][e] = dp[nb][e] = 0.0f;
    }
    mma_abt_planes<D, kPl>(p, s_k, warp * 16, u.k_s, q_t, u.q_s, lane);    // S^T = K Q^T
    mma_abt_planes<D, kPl>(dp, s_v, warp * 16, u.v, do_t, u.do_, lane);    // dP^T = V dO^T
    // P^T = exp(S^T - LSE) and dS^T = P^T (dP^T - delta); LSE and delta per query column, two
    // adjacent columns per float2. Masked entries (causal, T tails) -> 0 in a pass of their own.
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const int cq = nb * 8 + (lane % 4) * 2;
      const float2 l2 = *reinterpret_cast<const float2*>(lse + cq);
      const float lq[2] = {l2.x, l2.y};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[nb][e] = p_from_lse<kF32>(finish_score(p[nb][e], a.scale, f), lq[e & 1], f);
      }
    }
    const bool need_mask = (a.causal && i == j) || (i + 1) * kBlockQ > T || k0 + kBlockK > T;
    if (need_mask) {
      // Query q is visible to key row r iff first[r] <= q < T (no q for a key row >= T).
      const int first[2] = {key_a >= T ? T : (a.causal ? key_a : 0),
                            key_a + 8 >= T ? T : (a.causal ? key_a + 8 : 0)};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = i * kBlockQ + nb * 8 + (lane % 4) * 2 + (e & 1);
          p[nb][e] = (q < first[e / 2] || q >= T) ? 0.0f : p[nb][e];
        }
      }
    }
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const float2 d2 = *reinterpret_cast<const float2*>(dlt + nb * 8 + (lane % 4) * 2);
      const float dq2[2] = {d2.x, d2.y};
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nb][e] = p[nb][e] * (dp[nb][e] - dq2[e & 1]);  // dS^T
    }
    mma_cfrag_b_planes<D, kPl>(dv, p, u.p, do_t, u.do_, lane);    // dV += bf16(P)^T dO
    mma_cfrag_b_planes<D, kPl>(dk, dp, u.ds, q_t, u.q_g, lane);   // dK += bf16(dS)^T Q
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_a + 8 * r;
    if (key >= T) continue;
    const size_t off = base + static_cast<size_t>(key) * D;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      const int col = nb * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(a.dk + off + col) =
          make_float2(dk[nb][2 * r] * a.scale, dk[nb][2 * r + 1] * a.scale);
      *reinterpret_cast<float2*>(a.dv + off + col) = make_float2(dv[nb][2 * r], dv[nb][2 * r + 1]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// kernel launchers

namespace {

template <int D, bool kF32>
int launch_flash_backward(const KernelArgs& a, cudaStream_t stream) {
  using Shape = BwdShape<D, kF32>;
  cudaError_t err = cudaFuncSetAttribute(flash_dq_kernel<D, kF32>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemDq);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(flash_dkdv_kernel<D, kF32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Shape::kSmemKv);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.seq + kBlockQ - 1) / kBlockQ, a.batch * a.heads);
  flash_dq_kernel<D, kF32><<<grid, kThreads, Shape::kSmemDq, stream>>>(a);  // writes delta, read below
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  flash_dkdv_kernel<D, kF32><<<grid, kThreads, Shape::kSmemKv, stream>>>(a);
  return cudaGetLastError();
}

// The BF16 heads' kernels, and those of the FP32 heads (split operands) beside them on the
// side stream when both kinds are present.
template <int D>
int launch_backward_variants(const KernelArgs& a, bool any_bf16, bool any_f32, cudaStream_t stream) {
  if (!any_f32) return launch_flash_backward<D, false>(a, stream);
  if (!any_bf16) return launch_flash_backward<D, true>(a, stream);
  return launch_beside(stream, [&](cudaStream_t s) { return launch_flash_backward<D, true>(a, s); },
                       [&](cudaStream_t s) { return launch_flash_backward<D, false>(a, s); });
}

}  // namespace

size_t backward_workspace_bytes(const AttentionParams& p, const HeadFlags* host_flags) {
  return split_bytes(p, host_flags);  // the split planes of FP32 heads' operands
}

int attention_backward(const AttentionParams& p, const BackwardArgs& ba, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (ba.q == nullptr || ba.k == nullptr || ba.v == nullptr || ba.o == nullptr ||
      ba.d_o == nullptr || ba.lse == nullptr || ba.delta == nullptr || ba.dq == nullptr ||
      ba.dk == nullptr || ba.dv == nullptr) {
    return cudaErrorInvalidValue;
  }
  LaunchPlan plan;
  int err = plan_launch(p, ba.host_flags, true, ba.q_f32 != nullptr, ba.k_f32 != nullptr, ba.v_f32 != nullptr,
                        ba.o_f32 != nullptr, ba.simt_fp32, stream, &plan);
  if (err != 0) return err;
  KernelArgs a;
  a.batch = p.batch;
  a.heads = p.heads;
  a.seq = p.seq;
  a.scale = p.scale;
  a.causal = p.causal;
  a.flags = p.flags;
  a.q = ba.q;
  a.k = ba.k;
  a.v = ba.v;
  a.o = ba.o;
  a.d_o = ba.d_o;
  a.do32 = ba.d_o_f32;
  a.q32 = ba.q_f32;
  a.k32 = ba.k_f32;
  a.v32 = ba.v_f32;
  a.o32 = ba.o_f32;
  a.lse_in = ba.lse;
  a.delta = ba.delta;
  a.dq = ba.dq;
  a.dk = ba.dk;
  a.dv = ba.dv;
  a.simt_fp32 = ba.simt_fp32;
  if (plan.any_split) {
    if (ba.workspace == nullptr) return cudaErrorInvalidValue;
    err = launch_split(a, p.dim, ba.workspace, true, stream);
    if (err != 0) return err;
  }
  // The backward does not depend on the forward's tiling: P comes from the stored LSE.
  if (plan.any_fast) {
    err = p.dim == 64 ? launch_backward_variants<64>(a, plan.any_fast16, plan.any_split, stream)
                      : launch_backward_variants<128>(a, plan.any_fast16, plan.any_split, stream);
    if (err != 0) return err;
  }
  if (plan.any_simt) {
    err = launch_simt_backward(a, p.dim, stream);
    if (err != 0) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
