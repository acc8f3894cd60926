// The dK/dV kernel of the tensor-core backward (attention_backward.cu, which has the rounding
// points and the determinism argument): one block per key tile, dK and dV in registers over the
// query loop; on the dS path it also stores bf16(dS) for the dQ-from-dS kernel
// (attention_backward_ds.cuh).
#pragma once

#include "kernels/cuda/attention_backward_config.cuh"
#include "kernels/cuda/attention_backward_ds.cuh"
#include "kernels/cuda/attention_backward_mma.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/attention_sr.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace rwd::kernels::cuda {

// dK and dV. Grid (ceil(T/64), B*H, D / kDkdvCols), 128 threads; warp w owns keys k0 + 16w ...
// as the rows of the mma C layout (S^T = K Q^T), so dK and dV stay in registers for the whole
// query loop (columns c0 ... c0 + kDkdvCols - 1 of them, c0 from blockIdx.z).
// kF32: as in flash_dq_kernel; Q and dO single-buffered.
// kStoreDs (the dS path): runs the BF16 heads without delta=dpp and stores their bf16(dS)
// tiles; without it on the dS path (a.ds_dq), only the delta=dpp heads. kWg (BF16, sm_90a):
// the four products on wgmma from swizzle-128 tiles (wgmma.cuh), the same mma sequence per
// accumulator and so the same bits (AttentionCuda.WgmmaKernelsEqualMmaKernelsBitwise).
// Dg: the head dim in memory where the wgmma kernel computes a padded one (wgmma_pad_dim), else D.
// kSr: the BF16 heads with qk=sr or pv=sr (backward_variant 2): S and dV's P rounded with the
// forward's bits; the other kernels draw none.
template <int D, bool kF32, bool kStoreDs = false, bool kWg = false, int Dg = D, bool kSr = false>
__global__ void __launch_bounds__(kThreads, BwdShape<D, kF32>::kMinBlocksKv) flash_dkdv_kernel(KernelArgs a) {
  static_assert(!(kF32 && kStoreDs), "the dS path is for BF16 heads");
  static_assert(Dg == D || kWg, "a padded dim: wgmma only");
  static_assert(!(kF32 && kWg), "wgmma: BF16 heads");
  constexpr int kN = kDkdvCols<D>;
  static_assert(!kWg || kN == D, "wgmma: whole rows");
  constexpr int kTile = kBlockQ * (kWg ? D : D + 8);
  const int c0 = kN == D ? 0 : static_cast<int>(blockIdx.z) * kN;  // first dK / dV column here
  constexpr int kPl = BwdShape<D, kF32>::kPl, kSt = BwdShape<D, kF32>::kKvStages;
  // Causal: the first key tiles (most query tiles) start first (block_tile).
  const BlockTile bt = block_tile(a.causal, false);
  const int j = bt.tile, bh = a.bh0 + bt.bh, h = bh % a.heads, k0 = j * kBlockK, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (backward_variant(f, a.simt_fp32) != bf16_variant<kF32, kSr>()) return;
  if (!kF32 && (kStoreDs || a.ds_dq) && kStoreDs == f.delta_dpp) return;  // the other kernel's head
  const PlaneUse u = plane_use<kF32>(f);
  // dS path: this head's tiles, [query tile i][key tile j] in ds_tile_index order.
  uint16_t* const ds_out =
      kStoreDs ? a.ds + static_cast<size_t>(bt.bh) * ds_tiles_per_head(T, a.causal) * kDsTileElems
               : nullptr;
  extern __shared__ __align__(16) uint16_t smem_raw[];
  uint16_t* smem = kWg ? reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                     ~uintptr_t{1023})
                       : smem_raw;
  uint16_t* s_k = smem;                          // [kPl] tiles
  uint16_t* s_v = smem + kPl * kTile;            // [kPl]
  uint16_t* s_q = smem + 2 * kPl * kTile;        // [kSt][kPl]
  uint16_t* s_do = s_q + kSt * kPl * kTile;      // [kSt][kPl]
  float* s_lse = reinterpret_cast<float*>(s_do + kSt * kPl * kTile);  // [kSt][64]
  float* s_delta = s_lse + kSt * kBlockQ;                             // [kSt][64]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int key_a = k0 + warp * 16 + lane / 4;
  const size_t base = static_cast<size_t>(bh) * T * Dg, row_base = static_cast<size_t>(bh) * T;
  const int n_qt = (T + kBlockQ - 1) / kBlockQ, i0 = a.causal ? j : 0;
  // qk=sr, pv=sr (kSr): the forward's bits.
  const bool s_sr = kSr && f.s_sr, pv_sr = kSr && f.pv_sr;
  const SrStreams sr = kSr ? sr_streams(a.sr_key, bh, a.heads) : SrStreams{};

  auto load_rows = [&](int i, int buf) {
    if constexpr (kWg) {
      load_tile_sw128<D, kBlockQ, kThreads, Dg>(s_q + buf * kTile, a.q + base, i * kBlockQ, T);
      load_tile_sw128<D, kBlockQ, kThreads, Dg>(s_do + buf * kTile, a.d_o + base, i * kBlockQ, T);
    } else {
      load_operand<D, kPl>(s_q + buf * kPl * kTile, a.q, a.q_pl, u.q_s || u.q_g, base, i * kBlockQ, T);
      load_operand<D, kPl>(s_do + buf * kPl * kTile, a.d_o, a.do_pl, u.do_, base, i * kBlockQ, T);
    }
    if (tid < kBlockQ) {  // LSE and delta of the tile's rows, 0 past T, by cp.async too (a load
                          // waited for here held the loading warps for its latency every tile)
      const int q = i * kBlockQ + tid;
      const size_t at = row_base + (q < T ? q : 0);
      cp_async_4(s_lse + buf * kBlockQ + tid, a.lse_in + at, q < T);
      cp_async_4(s_delta + buf * kBlockQ + tid, a.delta + at, q < T);
    }
  };
  if constexpr (kWg) {
    load_tile_sw128<D, kBlockK, kThreads, Dg>(s_k, a.k + base, k0, T);
    load_tile_sw128<D, kBlockK, kThreads, Dg>(s_v, a.v + base, k0, T);
  } else {
    load_operand<D, kPl>(s_k, a.k, a.k_pl, u.k_s, base, k0, T);
    load_operand<D, kPl>(s_v, a.v, a.v_pl, u.v, base, k0, T);
  }
  load_rows(i0, 0);
  cp_async_commit();

  float dk[kN / 8][4], dv[kN / 8][4];
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
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
    if constexpr (kWg) fence_proxy_async();  // the tiles, to wgmma's (async) proxy
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
    if constexpr (kWg) {  // S^T = K Q^T and dP^T = V dO^T, issued together (p, dp not read)
      float(&p32)[32] = reinterpret_cast<float(&)[32]>(p);
      float(&dp32)[32] = reinterpret_cast<float(&)[32]>(dp);
      wgmma_fence_operand(p32);
      wgmma_fence_operand(dp32);
      wgmma_fence();
      wgmma_scores_issue<D, kBlockK, false>(p32, s_k, q_t);
      wgmma_scores_issue<D, kBlockK, false>(dp32, s_v, do_t);
      wgmma_wait<0>();
      wgmma_fence_operand(p32);
      wgmma_fence_operand(dp32);
    } else {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[nb][e] = dp[nb][e] = 0.0f;
      }
      mma_abt_planes<D, kPl>(p, s_k, warp * 16, u.k_s, q_t, u.q_s, lane);    // S^T = K Q^T
      mma_abt_planes<D, kPl>(dp, s_v, warp * 16, u.v, do_t, u.do_, lane);    // dP^T = V dO^T
    }
    // P^T = exp(S^T - LSE) and dS^T = P^T (dP^T - delta); LSE and delta per query column, two
    // adjacent columns per float2. Masked entries (causal, T tails) -> 0 in a pass of their own.
    // finish_score's fault and rounding tests only in heads that have them: the element loop
    // of the others is alpha S alone.
    auto exp_tile_t = [&](auto finish) {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse + nb * 8 + (lane % 4) * 2);
        const float lq[2] = {l2.x, l2.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) p[nb][e] = p_from_lse<kF32>(finish(p[nb][e]), lq[e & 1], f);
      }
    };
    const int q0 = i * kBlockQ + (lane % 4) * 2;  // this thread's first query column
    if (s_sr) {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[nb][e] = finish_score(p[nb][e], a.scale, f);
      }
      sr_round_cols(p, sr.qk, key_a, q0);
      exp_tile_t([](float x) { return x; });
    } else if (f.qk_fault || f.s_bf16) {
      exp_tile_t([&](float x) { return finish_score(x, a.scale, f); });
    } else {
      exp_tile_t([&](float x) { return __fmul_rn(a.scale, x); });
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
    // dV's bf16(P): pv=sr rounds P^T here (dS above read it unrounded) with the bits of (query,
    // key) the forward drew for P̄; the packing below then rounds nothing.
    if (pv_sr) sr_round_cols(p, sr.pv, key_a, q0);
    if (kStoreDs && c0 == 0) {  // bf16(dS^T) as the dK product rounds it, in fragment order
      uint4* t = reinterpret_cast<uint4*>(ds_out + ds_tile_index(i, j, T, a.causal) * kDsTileElems) +
                 warp * 4 * 32 + lane;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) t[kk * 32] = afrag_from_cfrag(dp, kk);
    }
    if constexpr (kWg) {
      uint32_t pa[4][4], da[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint4 x = afrag_from_cfrag(p, kk), y = afrag_from_cfrag(dp, kk);
        pa[kk][0] = x.x, pa[kk][1] = x.y, pa[kk][2] = x.z, pa[kk][3] = x.w;
        da[kk][0] = y.x, da[kk][1] = y.y, da[kk][2] = y.z, da[kk][3] = y.w;
      }
      // dV += bf16(P)^T dO and dK += bf16(dS)^T Q, issued together.
      float(&dv32)[kN / 2] = reinterpret_cast<float(&)[kN / 2]>(dv);
      float(&dk32)[kN / 2] = reinterpret_cast<float(&)[kN / 2]>(dk);
      wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(pa));
      wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(da));
      wgmma_fence_operand(dv32);
      wgmma_fence_operand(dk32);
      wgmma_fence();
      wgmma_pv_issue<D, false>(dv32, pa, wgmma_desc(do_t, 64 * 128, 1024));
      wgmma_pv_issue<D, false>(dk32, da, wgmma_desc(q_t, 64 * 128, 1024));
      wgmma_wait<0>();
      wgmma_fence_operand(dv32);
      wgmma_fence_operand(dk32);
      wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(pa));
      wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(da));
    } else {
      mma_cfrag_b_planes<D, kPl, kN>(dv, p, u.p, do_t + c0, u.do_, lane);   // dV += bf16(P)^T dO
      mma_cfrag_b_planes<D, kPl, kN>(dk, dp, u.ds, q_t + c0, u.q_g, lane);  // dK += bf16(dS)^T Q
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_a + 8 * r;
    if (key >= T) continue;
    const size_t off = base + static_cast<size_t>(key) * Dg;
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb) {
      if (c0 + nb * 8 >= Dg) break;  // padding columns
      const int col = c0 + nb * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(a.dk + off + col) =
          make_float2(dk[nb][2 * r] * a.scale, dk[nb][2 * r + 1] * a.scale);
      *reinterpret_cast<float2*>(a.dv + off + col) = make_float2(dv[nb][2 * r], dv[nb][2 * r + 1]);
    }
  }
}

}  // namespace rwd::kernels::cuda
