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
// Determinism: no float atomics; every sum has one fixed order.
// Fused path (the default, a workspace given): a small kernel forms delta = rowsum(dO * O);
// then one block per key tile j loops over the query tiles i (last first) and computes dV, dK
// in registers and dQ_ij = bf16(dS_ij) K_j. The dQ partials of query tile i are added into an
// FP32 workspace in ascending j: block j waits until a per-(b, h, i) counter says j tiles have
// added theirs (j = 0 stores instead of adding; the last j writes alpha * sum to dq), then bumps
// the counter. Blocks are dispatched in index order and block j - 1 never waits on block j, so
// the chain cannot deadlock; and as every block visits the query tiles in the same order, the
// blocks of one head reach tile i at about the same time (the wait is one read-add-write).
// 5 matrix products per tile pair instead of 7.
// Heads with delta = rowsum(dP * P) (and launches without a workspace) take the two-kernel
// path: kernel 1 (one block per query tile) forms delta and dQ over the key tiles in a fixed
// order, recomputing S and dP; kernel 2 forms dK, dV. Every output element is written by one
// thread, so dQ, dK, dV are bitwise identical on every run on either path.
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

// Ordered hand-over between blocks through a GPU-scope counter (acquire / release).
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// The tensor-core heads that take the fused path (see the determinism note).
__device__ __forceinline__ bool fused_head(const KernelArgs& a, const FlagView& f) {
  return a.dq_sem != nullptr && !f.delta_dpp && !backward_needs_simt(f);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CUDA kernels

// delta = rowsum(dO * O) for the fused heads (O in FP32 for o=fp32 heads). Grid
// (ceil(T/16), B*H), 128 threads: 8 threads per row, each summing every 8th 8-column chunk,
// then a fixed shuffle tree.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_delta_kernel(KernelArgs a) {
  const int bh = blockIdx.y, T = a.seq;
  const FlagView f = decode_flags(a.flags[bh % a.heads]);
  if (!fused_head(a, f)) return;
  const int row = blockIdx.x * 16 + threadIdx.x / 8, sub = threadIdx.x % 8;
  float acc = 0.0f;
  if (row < T) {
    const size_t off = (static_cast<size_t>(bh) * T + row) * D;
    for (int c = sub * 8; c < D; c += 64) {
      const uint4 dv = *reinterpret_cast<const uint4*>(a.d_o + off + c);
      const uint32_t dw[4] = {dv.x, dv.y, dv.z, dv.w};
      float o[8];
      if (f.o_f32) {
        const float4 o0 = *reinterpret_cast<const float4*>(a.o32 + off + c);
        const float4 o1 = *reinterpret_cast<const float4*>(a.o32 + off + c + 4);
        o[0] = o0.x, o[1] = o0.y, o[2] = o0.z, o[3] = o0.w;
        o[4] = o1.x, o[5] = o1.y, o[6] = o1.z, o[7] = o1.w;
      } else {
        const uint4 ov = *reinterpret_cast<const uint4*>(a.o + off + c);
        const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          o[2 * i] = __uint_as_float(ow[i] << 16);
          o[2 * i + 1] = __uint_as_float(ow[i] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc = fmaf(__uint_as_float(dw[i] << 16), o[2 * i], acc);
        acc = fmaf(__uint_as_float(dw[i] & 0xffff0000u), o[2 * i + 1], acc);
      }
    }
  }
#pragma unroll
  for (int off = 1; off < 8; off <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < T && sub == 0) a.delta[static_cast<size_t>(bh) * T + row] = acc;
}

// delta and dQ. Grid (ceil(T/64), B*H), 128 threads; warp w owns query rows q0 + 16w ...
// For delta=dpp heads the key loop runs twice: pass 0 sums dP * P into delta, pass 1 forms dQ.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(KernelArgs a) {
  constexpr int kTile = kBlockQ * (D + 8);
  // Causal: the last query tiles (most key tiles) start first.
  const int q_tile = a.causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  const int bh = blockIdx.y, h = bh % a.heads, q0 = q_tile * kBlockQ, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_needs_simt(f) || fused_head(a, f)) return;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_q = smem;
  uint16_t* s_do = smem + kTile;
  uint16_t* s_k = smem + 2 * kTile;  // [2] tiles
  uint16_t* s_v = smem + 4 * kTile;  // [2] tiles
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
    if (!f.delta_dpp) {  // delta = rowsum(dO * O): each quad lane takes every 4th column
      float acc = 0.0f;
      if (row < T) {
        const size_t off = base + static_cast<size_t>(row) * D;
        for (int d = lane % 4; d < D; d += 4) {
          const float o = f.o_f32 ? a.o32[off + d] : bf16_bits_to_float(a.o[off + d]);
          acc = fmaf(bf16_bits_to_float(a.d_o[off + d]), o, acc);
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
    const uint16_t* k_t = s_k + (jj & 1) * kTile;
    const uint16_t* v_t = s_v + (jj & 1) * kTile;
    if (jj + 1 < n_pass * n_kt) {
      const int jn = (jj + 1) % n_kt;
      load_tile_async<D>(s_k + ((jj + 1) & 1) * kTile, a.k + base, jn * kBlockK, T);
      load_tile_async<D>(s_v + ((jj + 1) & 1) * kTile, a.v + base, jn * kBlockK, T);
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
    const bool need_mask = (a.causal && j == q_tile) || (j + 1) * kBlockK > T;
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = finish_score(s[nb][e], a.scale, f);
        bool masked = false;
        if (need_mask) {
          const int col = j * kBlockK + nb * 8 + (lane % 4) * 2 + (e & 1);
          masked = col >= T || (a.causal && col > row_a + (e / 2) * 8);
        }
        const float p = masked ? 0.0f : fast_exp(__fsub_rn(x, lse[e / 2]));  // P = exp(S - LSE)
        if (main_pass) {
          s[nb][e] = p * (dp[nb][e] - delta[e / 2]);  // dS, rounded to BF16 when packed
        } else {
          dpp_acc[e / 2] = fmaf(dp[nb][e], p, dpp_acc[e / 2]);
        }
      }
    }
    if (!main_pass && j == n_kt - 1) {
      delta[0] = quad_sum(dpp_acc[0]);
      delta[1] = quad_sum(dpp_acc[1]);
    }
    if (main_pass) mma_cfrag_b<D>(dq, s, k_t, lane);  // dQ += bf16(dS) K
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

// dK and dV, and for fused heads dQ (see the determinism note). Grid (ceil(T/64), B*H), 128
// threads; warp w owns keys k0 + 16w ... as the rows of the mma C layout (S^T = K Q^T), so dK
// and dV stay in registers for the whole query loop. Query tiles run from the last one down.
template <int D>
__global__ void __launch_bounds__(kThreads, 2) flash_dkdv_kernel(KernelArgs a) {
  constexpr int kStride = D + 8, kTile = kBlockQ * kStride, kDsStride = kBlockQ + 8;
  const int bh = blockIdx.y, h = bh % a.heads, j = blockIdx.x, k0 = j * kBlockK, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_needs_simt(f)) return;
  const bool fused = fused_head(a, f);
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_k = smem;
  uint16_t* s_v = smem + kTile;
  uint16_t* s_q = smem + 2 * kTile;   // [2] tiles
  uint16_t* s_do = smem + 4 * kTile;  // [2] tiles
  float* s_lse = reinterpret_cast<float*>(smem + 6 * kTile);  // [2][64]
  float* s_delta = s_lse + 2 * kBlockQ;                       // [2][64]
  uint16_t* s_ds = reinterpret_cast<uint16_t*>(s_delta + 2 * kBlockQ);  // [64 keys][72] bf16(dS^T)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int key_a = k0 + warp * 16 + lane / 4;
  const size_t base = static_cast<size_t>(bh) * T * D, row_base = static_cast<size_t>(bh) * T;
  const int n_qt = (T + kBlockQ - 1) / kBlockQ, i_end = a.causal ? j : 0;

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
  load_rows(n_qt - 1, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  }

  for (int i = n_qt - 1; i >= i_end; --i) {
    const int buf = (n_qt - 1 - i) & 1;
    cp_async_wait_all();
    __syncthreads();
    if (i - 1 >= i_end) {
      load_rows(i - 1, buf ^ 1);
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
    const bool need_mask = (a.causal && i == j) || (i + 1) * kBlockQ > T || k0 + kBlockK > T;
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int cq = nb * 8 + (lane % 4) * 2 + (e & 1);
        const float x = finish_score(p[nb][e], a.scale, f);
        bool masked = false;
        if (need_mask) {
          const int q = i * kBlockQ + cq, key = key_a + (e / 2) * 8;
          masked = q >= T || key >= T || (a.causal && key > q);
        }
        const float pe = masked ? 0.0f : fast_exp(__fsub_rn(x, lse[cq]));  // P^T = exp(S^T - LSE)
        p[nb][e] = pe;
        dp[nb][e] = pe * (dp[nb][e] - dlt[cq]);  // dS^T
      }
    }
    if (fused) {  // bf16(dS^T) to smem, the A operand (transposed) of dQ_ij = bf16(dS) K_j
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<uint32_t*>(s_ds + (warp * 16 + lane / 4 + 8 * r) * kDsStride + nb * 8 +
                                       (lane % 4) * 2) = pack_bf16x2(dp[nb][2 * r], dp[nb][2 * r + 1]);
        }
      }
    }
    mma_cfrag_b<D>(dv, p, do_t, lane);   // dV += bf16(P)^T dO
    mma_cfrag_b<D>(dk, dp, q_t, lane);   // dK += bf16(dS)^T Q
    if (!fused) continue;

    // dQ_ij (64 queries x D): warp w takes queries 16w..16w+15; A = dS from s_ds through
    // ldmatrix.trans, B = K_j (keys x D) as in the P̄V product of the forward.
    // D = 128 reloads the A fragments per 16-column chunk (holding them spills).
    constexpr bool kHoldA = D == 64;
    __syncthreads();
    uint32_t af[4][4];
    auto load_a = [&](int kk) {
      ldmatrix_x4_trans(af[kk], s_ds + (kk * 16 + (lane / 16) * 8 + lane % 8) * kDsStride +
                                    warp * 16 + ((lane / 8) % 2) * 8);
    };
    if constexpr (kHoldA) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) load_a(kk);
    }
    const bool first = j == 0, last = j == (a.causal ? i : n_qt - 1);
    int* sem = a.dq_sem + static_cast<size_t>(bh) * n_qt + i;
    if (!first) {  // wait until key tiles 0 .. j-1 have added their dQ partials of tile i
      if (tid == 0) {
        while (load_acquire(sem) != j) __nanosleep(64);
      }
      __syncthreads();
    }
#pragma unroll 1
    for (int nb2 = 0; nb2 < D / 16; ++nb2) {
      float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if constexpr (!kHoldA) load_a(kk);
        uint32_t b[4];
        ldmatrix_x4_trans(b, s_k + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                                 nb2 * 16 + (lane / 16) * 8);
        mma_bf16(c[0], af[kk], b[0], b[1]);
        mma_bf16(c[1], af[kk], b[2], b[3]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = i * kBlockQ + warp * 16 + lane / 4 + 8 * r;
        if (row >= T) continue;
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          const size_t idx = base + static_cast<size_t>(row) * D + nb2 * 16 + sub * 8 + (lane % 4) * 2;
          float2 v = make_float2(c[sub][2 * r], c[sub][2 * r + 1]);
          if (!first) {  // L2 copy (the writer was another block): bypass L1
            const float2 old = __ldcg(reinterpret_cast<const float2*>(a.dq_accum + idx));
            v = make_float2(old.x + v.x, old.y + v.y);
          }
          if (last) {
            *reinterpret_cast<float2*>(a.dq + idx) = make_float2(v.x * a.scale, v.y * a.scale);
          } else {
            __stcg(reinterpret_cast<float2*>(a.dq_accum + idx), v);
          }
        }
      }
    }
    if (!last) {  // publish: every thread's stores, then the counter
      __threadfence();
      __syncthreads();
      if (tid == 0) store_release(sem, j + 1);
    }
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
int launch_flash_backward(const KernelArgs& a, bool any_dpp, cudaStream_t stream) {
  constexpr int kTileBytes = kBlockQ * (D + 8) * static_cast<int>(sizeof(uint16_t));
  constexpr int kSmemDq = 6 * kTileBytes;
  constexpr int kSmemKv = 6 * kTileBytes + 4 * kBlockQ * static_cast<int>(sizeof(float)) +
                          kBlockK * (kBlockQ + 8) * static_cast<int>(sizeof(uint16_t));
  cudaError_t err = cudaFuncSetAttribute(flash_dq_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemDq);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(flash_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemKv);
  if (err != cudaSuccess) return err;
  const int n_qt = (a.seq + kBlockQ - 1) / kBlockQ;
  const dim3 grid(n_qt, a.batch * a.heads);
  if (a.dq_sem != nullptr) {  // fused heads: counters to 0, then delta
    err = cudaMemsetAsync(a.dq_sem, 0, sizeof(int) * n_qt * a.batch * a.heads, stream);
    if (err != cudaSuccess) return err;
    flash_delta_kernel<D><<<dim3((a.seq + 15) / 16, a.batch * a.heads), kThreads, 0, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (a.dq_sem == nullptr || any_dpp) {  // two-kernel heads: writes delta, read below
    flash_dq_kernel<D><<<grid, kThreads, kSmemDq, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  flash_dkdv_kernel<D><<<grid, kThreads, kSmemKv, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

// FP32 dQ partial sums (B, H, T, D), then one int counter per (b, h, query tile).
size_t backward_workspace_bytes(const AttentionParams& p) {
  const size_t rows = static_cast<size_t>(p.batch) * p.heads * p.seq;
  const size_t tiles = static_cast<size_t>(p.batch) * p.heads * ((p.seq + kBlockQ - 1) / kBlockQ);
  return rows * p.dim * sizeof(float) + tiles * sizeof(int);
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
                        ba.o_f32 != nullptr, stream, &plan);
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
  a.q32 = ba.q_f32;
  a.k32 = ba.k_f32;
  a.v32 = ba.v_f32;
  a.o32 = ba.o_f32;
  a.lse_in = ba.lse;
  a.delta = ba.delta;
  a.dq = ba.dq;
  a.dk = ba.dk;
  a.dv = ba.dv;
  if (ba.workspace != nullptr) {  // fused dQ (else the two-kernel path for every head)
    const size_t rows = static_cast<size_t>(p.batch) * p.heads * p.seq;
    a.dq_accum = static_cast<float*>(ba.workspace);
    a.dq_sem = reinterpret_cast<int*>(a.dq_accum + rows * p.dim);
  }
  // The backward does not depend on the forward's tiling: P comes from the stored LSE.
  if (plan.any_fast) {
    err = p.dim == 64 ? launch_flash_backward<64>(a, plan.any_fast_dpp, stream)
                      : launch_flash_backward<128>(a, plan.any_fast_dpp, stream);
    if (err != 0) return err;
  }
  if (plan.any_simt) {
    err = launch_simt_backward(a, p.dim, stream);
    if (err != 0) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
