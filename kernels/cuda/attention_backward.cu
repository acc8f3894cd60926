// FlashAttention-2 backward on tensor cores (mma.sync BF16, FP32 accumulate) and the public
// backward launcher.
//
// Rounding points (docs/design.md), recomputing S exactly as the forward did (qk=sr: with the
// forward's bits):
//   P = exp(S - LSE)                        FP32
//   dV += bf16(P)^T dO                      FP32 accumulate (pv=sr: bf16 stochastic, the bits the
//                                           forward drew for P̄ of the element)
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
// Determinism: no float atomics. The dK/dV kernel (one block per key tile) accumulates dK and
// dV in registers, looping over the query tiles in a fixed order; dQ (one block per query
// tile) loops over the key tiles in a fixed order. Every output element is written by exactly
// one thread, so dQ, dK, dV are bitwise identical on every run. dQ comes one of two ways, with
// the same bits:
//   - the dS path (BackwardArgs::ds_dq, the default up to T = 16384): a delta kernel, then the
//     dK/dV kernel also stores bf16(dS) (T^2/2 BF16 per head, in chunks of heads under
//     REWIND_ATTN_DS_WORKSPACE), and a kernel forms dQ from the stored tiles: 5 matrix products
//     per tile pair, like FA2, plus the dS traffic;
//   - recomputed: the dQ kernel (first) computes delta and recomputes S, dP and dS per tile
//     pair (7 matrix products); delta=dpp heads always take it (their delta needs a pass over
//     dP * P before the dK/dV kernel runs).
// A fused variant that added dQ partials into a workspace in a fixed key-tile order, handing
// over between blocks through counters, measured 1.6-1.9x slower: experiments/cuda_bench/RESULTS.md.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/switches.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_backward_config.cuh"
#include "kernels/cuda/attention_backward_ds.cuh"
#include "kernels/cuda/attention_backward_dkdv.cuh"
#include "kernels/cuda/attention_backward_mma.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/attention_sr.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace rwd::kernels::cuda {

// ---------------------------------------------------------------------------------------------
// CUDA kernels

// delta and dQ. Grid (ceil(T/64), B*H), 128 threads; warp w owns query rows q0 + 16w ...
// For delta=dpp heads the key loop runs twice: pass 0 sums dP * P into delta, pass 1 forms dQ.
// kF32: the heads with an FP32 op (PlaneUse says which operands come in planes); delta from the
// FP32 dO for bwd=fp32, in double for delta=fp32. kSr: the BF16 heads with qk=sr or pv=sr
// (backward_variant 2), whose S this kernel rounds with the forward's bits.
template <int D, bool kF32, bool kSr = false>
__global__ void __launch_bounds__(kThreads, BwdShape<D, kF32>::kMinBlocksDq) flash_dq_kernel(KernelArgs a) {
  constexpr int kTile = kBlockQ * (D + 8);
  constexpr int kPl = BwdShape<D, kF32>::kPl, kSt = BwdShape<D, kF32>::kDqStages;
  // Causal: the last query tiles (most key tiles) start first (block_tile).
  const BlockTile bt = block_tile(a.causal, true);
  const int q_tile = bt.tile, bh = a.bh0 + bt.bh, h = bh % a.heads, q0 = q_tile * kBlockQ, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_variant(f, a.simt_fp32) != bf16_variant<kF32, kSr>()) return;
  if (!kF32 && a.ds_dq && !f.delta_dpp) return;  // dQ from the stored dS (flash_dq_ds_kernel)
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
  const uint64_t qk_stream = kSr ? sr_stream(a.sr_key, SrSite::kQk, bh / a.heads, h) : 0;

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
    if (!f.delta_dpp) delta[r] = row_delta<D, kF32>(a, f, base, row, lane);
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
    // qk=sr (kSr) rounds S as the forward did first.
    const bool s_sr = kSr && f.s_sr;
    if (s_sr) {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] = finish_score(s[nb][e], a.scale, f);
      }
      sr_round_rows<8>(s, qk_stream, row_a, j * kBlockK + (lane % 4) * 2);
    }
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = p_from_lse<kF32>(s_sr ? s[nb][e] : finish_score(s[nb][e], a.scale, f), lse[e / 2], f);
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
    if (row_a + 8 * r < T && (lane % 4) == 0) a.delta[row_base + row_a + 8 * r] = delta[r];
  }
  store_rows_scaled<D>(a.dq, dq, base, row_a, T, a.scale, lane);
}

// ---------------------------------------------------------------------------------------------
// kernel launchers

namespace {

template <class Kernel>
int set_smem(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Dynamic shared memory of the dK/dV kernel.
template <int D, bool kF32, bool kWg>
constexpr int kv_smem() {
  return kWg ? BwdShape<D, kF32>::kSmemKvWg : BwdShape<D, kF32>::kSmemKv;
}

// Dc: the dim the dK/dV kernel computes (wgmma_pad_dim: 128 for a head of dim 80 or 96); the dQ
// kernel (mma.sync) computes D. kSr: the kernels of the BF16 heads that round stochastically.
template <int D, bool kF32, bool kWg, int Dc = D, bool kSr = false>
int launch_flash_backward_on(const KernelArgs& a, cudaStream_t stream) {
  using Shape = BwdShape<D, kF32>;
  constexpr int kKv = kv_smem<Dc, kF32, kWg>();
  int err = set_smem(flash_dq_kernel<D, kF32, kSr>, Shape::kSmemDq);
  if (err == 0) err = set_smem(flash_dkdv_kernel<Dc, kF32, false, kWg, D, kSr>, kKv);
  if (err != 0) return err;
  const dim3 grid((a.seq + kBlockQ - 1) / kBlockQ, a.batch * a.heads);
  flash_dq_kernel<D, kF32, kSr><<<grid, kThreads, Shape::kSmemDq, stream>>>(a);  // writes delta, read below
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 grid_kv(grid.x, grid.y, Dc / kDkdvCols<Dc>);
  flash_dkdv_kernel<Dc, kF32, false, kWg, D, kSr><<<grid_kv, kThreads, kKv, stream>>>(a);
  return cudaGetLastError();
}

// The recompute path: the BF16 heads' dK/dV kernel on wgmma unless REWIND_ATTN_WGMMA=0 or
// the dim has no wgmma kernels (wgmma_pad_dim). FP32 heads exist here only up to D = 128
// (split_head_dim; attention_backward sends larger dims' FP32 heads to the SIMT kernels).
template <int D, bool kF32, bool kSr = false>
int launch_flash_backward(const KernelArgs& a, cudaStream_t stream) {
  if constexpr (kF32 && !split_head_dim(D)) {
    return cudaErrorNotSupported;
  } else {
    if constexpr (!kF32 && wgmma_pad_dim(D) != 0) {
      if (wgmma_on()) return launch_flash_backward_on<D, false, true, wgmma_pad_dim(D), kSr>(a, stream);
    }
    return launch_flash_backward_on<D, kF32, false, D, kSr>(a, stream);
  }
}

// The recompute path's BF16 groups: the plain heads' kernels, then the sr heads' own.
template <int D>
int launch_flash_backward16(const KernelArgs& a, const Bf16Groups& g, cudaStream_t stream) {
  int err = g.plain ? launch_flash_backward<D, false, false>(a, stream) : 0;
  if (err == 0 && g.sr) err = launch_flash_backward<D, false, true>(a, stream);
  return err;
}

// Most dS workspace one backward holds (REWIND_ATTN_DS_WORKSPACE bytes, default 1 GiB): heads
// are taken in chunks that fit it, at least one head per chunk.
int64_t ds_workspace_max() { return rwd::switches::integer(rwd::switches::Switch::kAttnDsWorkspace); }

// (Batch, head) rows per chunk of the dS path: as few chunks as the cap allows, evened out.
int64_t ds_chunk_heads(const AttentionParams& p) {
  const int64_t bh = static_cast<int64_t>(p.batch) * p.heads;
  const int64_t per_head = ds_tiles_per_head(p.seq, p.causal) * kDsTileElems * 2;
  const int64_t fit = std::max<int64_t>(1, ds_workspace_max() / per_head);
  const int64_t chunks = (bh + fit - 1) / fit;
  return (bh + chunks - 1) / chunks;
}

// One BF16 group (kSr: the sr heads, else the plain ones) through the dS path, after the delta
// kernel: the recompute kernels for its delta=dpp heads (dpp; their dQ kernel writes their
// delta); then per chunk of heads the dK/dV kernel storing dS and the dQ kernel over the stored
// tiles (the workspace holds one group's chunk at a time). kWg: on wgmma, those two computing
// dim Dc (as launch_flash_backward_on).
template <int D, bool kWg, int Dc, bool kSr>
int launch_ds_group(KernelArgs a, bool dpp, cudaStream_t stream) {
  using Shape = BwdShape<D, false>;
  constexpr int kKv = kv_smem<Dc, false, kWg>(), kDq = DsDqShape<Dc, kWg>::kSmem;
  int err = set_smem(flash_dq_kernel<D, false, kSr>, Shape::kSmemDq);
  if (err == 0) err = set_smem(flash_dkdv_kernel<Dc, false, false, kWg, D, kSr>, kKv);
  if (err == 0) err = set_smem(flash_dkdv_kernel<Dc, false, true, kWg, D, kSr>, kKv);
  if (err == 0) err = set_smem(flash_dq_ds_kernel<Dc, kWg, D, kSr>, kDq);
  if (err != 0) return err;
  const int bh = a.batch * a.heads, n_t = (a.seq + kBlockQ - 1) / kBlockQ;
  constexpr unsigned kCols = Dc / kDkdvCols<Dc>;  // dK/dV column blocks (grid z)
  if (dpp) {
    flash_dq_kernel<D, false, kSr><<<dim3(n_t, bh), kThreads, Shape::kSmemDq, stream>>>(a);
    flash_dkdv_kernel<Dc, false, false, kWg, D, kSr><<<dim3(n_t, bh, kCols), kThreads, kKv, stream>>>(a);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  AttentionParams shape;
  shape.batch = a.batch, shape.heads = a.heads, shape.seq = a.seq, shape.causal = a.causal;
  const int64_t chunk = ds_chunk_heads(shape);
  for (int64_t h0 = 0; h0 < bh; h0 += chunk) {
    a.bh0 = static_cast<int>(h0);
    const dim3 grid(n_t, static_cast<unsigned>(std::min<int64_t>(chunk, bh - h0)));
    flash_dkdv_kernel<Dc, false, true, kWg, D, kSr><<<dim3(grid.x, grid.y, kCols), kThreads, kKv, stream>>>(a);
    flash_dq_ds_kernel<Dc, kWg, D, kSr><<<grid, kThreads, kDq, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The BF16 heads through the dS path: delta for every one of them (a delta=dpp head's comes
// from its dQ kernel), then each group present.
template <int D, bool kWg, int Dc = D>
int launch_ds_backward_on(KernelArgs a, const Bf16Groups& g, cudaStream_t stream) {
  a.ds_dq = true;
  flash_delta_kernel<D><<<dim3((a.seq + kThreads / 4 - 1) / (kThreads / 4), a.batch * a.heads), kThreads, 0, stream>>>(a);
  int err = cudaGetLastError();
  if (err == 0 && g.plain) err = launch_ds_group<D, kWg, Dc, false>(a, g.plain_dpp, stream);
  if (err == 0 && g.sr) err = launch_ds_group<D, kWg, Dc, true>(a, g.sr_dpp, stream);
  return err;
}

template <int D>
int launch_ds_backward(const KernelArgs& a, const Bf16Groups& g, cudaStream_t stream) {
  if constexpr (wgmma_pad_dim(D) != 0) {
    if (wgmma_on()) return launch_ds_backward_on<D, true, wgmma_pad_dim(D)>(a, g, stream);
  }
  return launch_ds_backward_on<D, false>(a, g, stream);
}

// The BF16 heads' kernels (through the dS path when a.ds is set), and those of the FP32 heads
// (split operands) beside them on the side stream when both kinds are present.
template <int D>
int launch_backward_variants(const KernelArgs& a, const Bf16Groups& g, bool any_f32, cudaStream_t stream) {
  auto bf16 = [&](cudaStream_t s) {
    return a.ds != nullptr ? launch_ds_backward<D>(a, g, s) : launch_flash_backward16<D>(a, g, s);
  };
  if (!any_f32) return bf16(stream);
  if (!g.plain && !g.sr) return launch_flash_backward<D, true>(a, stream);
  return launch_beside(stream, [&](cudaStream_t s) { return launch_flash_backward<D, true>(a, s); }, bf16);
}

bool ds_dq_on(const AttentionParams& p, int ds_dq) {
  return ds_dq < 0 ? ds_dq_default(p) : ds_dq != 0;
}

// Bytes of the dS tiles (one chunk of heads) when the dS path runs, else 0.
size_t ds_bytes(const AttentionParams& p, int ds_dq) {
  if (!ds_dq_on(p, ds_dq)) return 0;
  return static_cast<size_t>(ds_chunk_heads(p) * ds_tiles_per_head(p.seq, p.causal) * kDsTileElems * 2);
}

}  // namespace

bool ds_dq_default(const AttentionParams& p) {
  return p.seq <= 16384 && rwd::switches::on(rwd::switches::Switch::kAttnDsDq);
}

// Workspace: the dS tiles first (when the dS path runs), then the split planes of FP32 heads'
// operands.
size_t backward_workspace_bytes(const AttentionParams& p, const HeadFlags* host_flags, int ds_dq) {
  return ds_bytes(p, ds_dq) + split_bytes(p, host_flags);
}

int attention_backward(const AttentionParams& p, const BackwardArgs& ba, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (ba.q == nullptr || ba.k == nullptr || ba.v == nullptr || ba.o == nullptr ||
      ba.d_o == nullptr || ba.lse == nullptr || ba.delta == nullptr || ba.dq == nullptr ||
      ba.dk == nullptr || ba.dv == nullptr) {
    return cudaErrorInvalidValue;
  }
  LaunchPlan plan;
  const bool simt_fp32 = ba.simt_fp32 || !split_head_dim(p.dim);
  int err = plan_launch(p, ba.host_flags, true, ba.q_f32 != nullptr, ba.k_f32 != nullptr, ba.v_f32 != nullptr,
                        ba.o_f32 != nullptr, simt_fp32, stream, &plan);
  if (err != 0) return err;
  KernelArgs a;
  a.batch = p.batch;
  a.heads = p.heads;
  a.seq = p.seq;
  a.scale = p.scale;
  a.causal = p.causal;
  a.sr_key = p.sr_key;
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
  a.simt_fp32 = simt_fp32;
  const size_t ds_size = plan.any_fast16 ? ds_bytes(p, ba.ds_dq) : 0;
  if ((plan.any_split || ds_size > 0) && ba.workspace == nullptr) return cudaErrorInvalidValue;
  if (ds_size > 0) a.ds = static_cast<uint16_t*>(ba.workspace);
  if (plan.any_split) {
    err = launch_split(a, p.dim, static_cast<char*>(ba.workspace) + ds_bytes(p, ba.ds_dq), true, stream);
    if (err != 0) return err;
  }
  // The backward does not depend on the forward's tiling: P comes from the stored LSE.
  if (plan.any_fast) {
    err = dispatch_head_dim(p.dim, [&](auto d) {
      return launch_backward_variants<decltype(d)::value>(a, plan.bf16, plan.any_split, stream);
    });
    if (err != 0) return err;
  }
  if (plan.any_simt) {
    err = launch_simt_backward(a, p.dim, stream);
    if (err != 0) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
