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
// or delta promoted (or a delta fault) run in the SIMT kernels. CPU twin:
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
#include "kernels/cuda/attention_internal.cuh"

namespace rwd::kernels::cuda {

namespace {

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

// acc (16 x D) += A (16 x 64, fragments from the C layout, rounded to BF16) * B, where B is
// the 64 x D tile `b_s` (row-major smem): the Ō += P V pattern.
template <int D>
__device__ __forceinline__ void mma_cfrag_b(float acc[D / 8][4], const float c[8][4],
                                            const uint16_t* b_s, int lane) {
  constexpr int kStride = D + 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t af[4] = {pack_bf16x2(c[2 * kk][0], c[2 * kk][1]),
                            pack_bf16x2(c[2 * kk][2], c[2 * kk][3]),
                            pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]),
                            pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3])};
#pragma unroll
    for (int nb2 = 0; nb2 < D / 16; ++nb2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_s + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                               nb2 * 16 + (lane / 16) * 8);
      mma_bf16(acc[2 * nb2], af, b[0], b[1]);
      mma_bf16(acc[2 * nb2 + 1], af, b[2], b[3]);
    }
  }
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace

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

// delta and dQ. Grid (ceil(T/64), B*H), 128 threads; warp w owns query rows q0 + 16w ...
// For delta=dpp heads the key loop runs twice: pass 0 sums dP * P into delta, pass 1 forms dQ.
template <int D>
__global__ void __launch_bounds__(kThreads, REWIND_DQ_MIN_BLOCKS) flash_dq_kernel(KernelArgs a) {
  constexpr int kTile = kBlockQ * (D + 8);
  // Causal: the last query tiles (most key tiles) start first.
  const int q_tile = a.causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  const int bh = blockIdx.y, h = bh % a.heads, q0 = q_tile * kBlockQ, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_needs_simt(f)) return;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_q = smem;
  uint16_t* s_do = smem + kTile;
  uint16_t* s_k = smem + 2 * kTile;                // [kDqKvStages<D>] tiles
  uint16_t* s_v = smem + (2 + kDqKvStages<D>) * kTile;  // [kDqKvStages<D>] tiles
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_a = q0 + warp * 16 + lane / 4;
  const size_t base = static_cast<size_t>(bh) * T * D, row_base = static_cast<size_t>(bh) * T;
  const int n_kt = a.causal ? q_tile + 1 : (T + kBlockK - 1) / kBlockK;
  const int n_pass = f.delta_dpp ? 2 : 1;

  load_tile_async<D>(s_q, a.q + base, q0, T);
  load_tile_async<D>(s_do, a.d_o + base, q0, T);
  load_tile_async<D>(s_k, a.k + base, 0, T);
  load_tile_async<D>(s_v, a.v + base, 0, T);
  cp_async_commit();

  float lse[2], delta[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    lse[r] = row < T ? a.lse_in[row_base + row] : 0.0f;
    if (!f.delta_dpp) {
      // delta = rowsum(dO * O): quad lane l takes the 8-element chunks l, l + 4, ... (16-byte
      // loads), FMAs in column order within its chunks, then the quad sum.
      float acc = 0.0f;
      if (row < T) {
        const size_t off = base + static_cast<size_t>(row) * D;
#pragma unroll
        for (int c = (lane % 4) * 8; c < D; c += 32) {
          const uint4 dov = *reinterpret_cast<const uint4*>(a.d_o + off + c);
          const uint32_t dw[4] = {dov.x, dov.y, dov.z, dov.w};
          float o[8];
          if (f.o_f32) {
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
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc = fmaf(bf16_bits_to_float(static_cast<uint16_t>(dw[i] & 0xffffu)), o[2 * i], acc);
            acc = fmaf(bf16_bits_to_float(static_cast<uint16_t>(dw[i] >> 16)), o[2 * i + 1], acc);
          }
        }
      }
      delta[r] = quad_sum(acc);
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
    const int buf = kDqKvStages<D> == 2 ? (jj & 1) : 0;
    const uint16_t* k_t = s_k + buf * kTile;
    const uint16_t* v_t = s_v + buf * kTile;
    const bool more = jj + 1 < n_pass * n_kt;
    const int jn = (jj + 1) % n_kt;
    if (kDqKvStages<D> == 2 && more) {
      load_tile_async<D>(s_k + (buf ^ 1) * kTile, a.k + base, jn * kBlockK, T);
      load_tile_async<D>(s_v + (buf ^ 1) * kTile, a.v + base, jn * kBlockK, T);
      cp_async_commit();
    }

    float s[8][4], dp[8][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = dp[nb][e] = 0.0f;
    }
    mma_abt<D>(s, s_q, warp * 16, k_t, lane);   // S = Q K^T
    mma_abt<D>(dp, s_do, warp * 16, v_t, lane); // dP = dO V^T
    if (kDqKvStages<D> == 1) {  // every warp is done with V_j: load V_{j+1} behind dS and dQ
      __syncthreads();
      if (more) {
        load_tile_async<D>(s_v, a.v + base, jn * kBlockK, T);
        cp_async_commit();
      }
    }
    // P = exp(S - LSE); masked entries (causal, T tail) -> 0 in a pass of their own, taken only
    // by the tiles that need it (a runtime test inside the element loop costs a branch each).
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = fast_exp(__fsub_rn(finish_score(s[nb][e], a.scale, f), lse[e / 2]));
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
    if (main_pass) mma_cfrag_b<D>(dq, s, k_t, lane);  // dQ += bf16(dS) K
    if (kDqKvStages<D> == 1) {  // every warp is done with K_j
      __syncthreads();
      if (more) {
        load_tile_async<D>(s_k, a.k + base, jn * kBlockK, T);
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
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? REWIND_DKDV64_MIN_BLOCKS : 1) flash_dkdv_kernel(KernelArgs a) {
  constexpr int kTile = kBlockQ * (D + 8);
  // Causal: the first key tiles (most query tiles) come first in the grid.
  const int j = blockIdx.x;
  const int bh = blockIdx.y, h = bh % a.heads, k0 = j * kBlockK, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_needs_simt(f)) return;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_k = smem;
  uint16_t* s_v = smem + kTile;
  uint16_t* s_q = smem + 2 * kTile;   // [2] tiles
  uint16_t* s_do = smem + 4 * kTile;  // [2] tiles
  float* s_lse = reinterpret_cast<float*>(smem + 6 * kTile);  // [2][64]
  float* s_delta = s_lse + 2 * kBlockQ;                       // [2][64]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int key_a = k0 + warp * 16 + lane / 4;
  const size_t base = static_cast<size_t>(bh) * T * D, row_base = static_cast<size_t>(bh) * T;
  const int n_qt = (T + kBlockQ - 1) / kBlockQ, i0 = a.causal ? j : 0;

  auto load_rows = [&](int i, int buf) {
    load_tile_async<D>(s_q + buf * kTile, a.q + base, i * kBlockQ, T);
    load_tile_async<D>(s_do + buf * kTile, a.d_o + base, i * kBlockQ, T);
    if (tid < kBlockQ) {
      const int q = i * kBlockQ + tid;
      s_lse[buf * kBlockQ + tid] = q < T ? a.lse_in[row_base + q] : 0.0f;
      s_delta[buf * kBlockQ + tid] = q < T ? a.delta[row_base + q] : 0.0f;
    }
  };
  load_tile_async<D>(s_k, a.k + base, k0, T);
  load_tile_async<D>(s_v, a.v + base, k0, T);
  load_rows(i0, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  }

  for (int i = i0; i < n_qt; ++i) {
    const int buf = (i - i0) & 1;
    cp_async_wait_all();
    __syncthreads();
    if (i + 1 < n_qt) {
      load_rows(i + 1, buf ^ 1);
      cp_async_commit();
    }
    const uint16_t* q_t = s_q + buf * kTile;
    const uint16_t* do_t = s_do + buf * kTile;
    const float* lse = s_lse + buf * kBlockQ;
    const float* dlt = s_delta + buf * kBlockQ;

    float p[8][4], dp[8][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[nb][e] = dp[nb][e] = 0.0f;
    }
    mma_abt<D>(p, s_k, warp * 16, q_t, lane);    // S^T = K Q^T
    mma_abt<D>(dp, s_v, warp * 16, do_t, lane);  // dP^T = V dO^T
    // P^T = exp(S^T - LSE) and dS^T = P^T (dP^T - delta); LSE and delta per query column, two
    // adjacent columns per float2. Masked entries (causal, T tails) -> 0 in a pass of their own.
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const int cq = nb * 8 + (lane % 4) * 2;
      const float2 l2 = *reinterpret_cast<const float2*>(lse + cq);
      const float lq[2] = {l2.x, l2.y};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[nb][e] = fast_exp(__fsub_rn(finish_score(p[nb][e], a.scale, f), lq[e & 1]));
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
    mma_cfrag_b<D>(dv, p, do_t, lane);   // dV += bf16(P)^T dO
    mma_cfrag_b<D>(dk, dp, q_t, lane);   // dK += bf16(dS)^T Q
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

template <int D>
int launch_flash_backward(const KernelArgs& a, cudaStream_t stream) {
  constexpr int kTileBytes = kBlockQ * (D + 8) * static_cast<int>(sizeof(uint16_t));
  constexpr int kSmemDq = (2 + 2 * kDqKvStages<D>) * kTileBytes;
  constexpr int kSmemKv = 6 * kTileBytes + 4 * kBlockQ * static_cast<int>(sizeof(float));
  cudaError_t err = cudaFuncSetAttribute(flash_dq_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemDq);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(flash_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemKv);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.seq + kBlockQ - 1) / kBlockQ, a.batch * a.heads);
  flash_dq_kernel<D><<<grid, kThreads, kSmemDq, stream>>>(a);  // writes delta, read below
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  flash_dkdv_kernel<D><<<grid, kThreads, kSmemKv, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

size_t backward_workspace_bytes(const AttentionParams&) {
  return 0;  // dQ is computed by its own kernel (see the determinism note above)
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
                        ba.o_f32 != nullptr, false, stream, &plan);
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
  // The backward does not depend on the forward's tiling: P comes from the stored LSE.
  if (plan.any_fast) {
    err = p.dim == 64 ? launch_flash_backward<64>(a, stream) : launch_flash_backward<128>(a, stream);
    if (err != 0) return err;
  }
  if (plan.any_simt) {
    err = launch_simt_backward(a, p.dim, stream);
    if (err != 0) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
