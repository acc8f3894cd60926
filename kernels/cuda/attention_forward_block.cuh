// The key loop of the tensor-core flash forward (flash_forward_kernel, attention_forward.cu):
// one block of query rows against all its key tiles, specialized per variant.
//
// Rounding points (docs/design.md), per query tile i and key tile j:
//   S = alpha * Q K^T            FP32 (tensor-core accumulation of exact BF16 products)
//   [qk fault] S += c |S|;  [s_bf16] S = bf16(S)
//   m_new = max(m_old, m')       m' = rowmax over unmasked S, or the stabilized m' (Alg. 3)
//   P̄ = exp(S - m_new)           FP32, ex2.approx (see fast_exp_shifted; within a few FP32
//                                ulps of expf)  [softmax fault: P̄ *= 1 - c where P̄ < 1]
//   l = exp(m_old - m_new) * l + rowsum(P̄)        FP32, from the unrounded P̄
//   Ō = exp(m_old - m_new) * Ō + bf16(P̄) V        FP32 accumulate
//   [acc_bf16] Ō = bf16(Ō), l = bf16(l) after each tile
//   [kSr: qk=sr, pv=sr, acc=sr] the S, P̄V-operand and Ō, l roundings above made stochastic, with
//   the bits of stochastic_round.h at the element's absolute (row, key) (attention_sr.cuh)
//   O = bf16(Ō / l) (written), o_f32 = Ō / l (when requested), LSE = m + log(l) (FP32).
// Heads with qk, pv or softmax promoted run the FP32 variant (kF32: split-BF16 operands).
// The CPU twin is kernels/attention_forward_cpu.cpp (same formulas; sums in other orders).
// The query tile (64 or 128 rows) does not enter the numerics: every rounding point is per row and
// per 64-key tile. Ties (stable rule, monitors) are counted only when a head is stabilized or
// stats are requested (a.stats non-null), in specializations of their own. Without monitors
// the stabilized kernel speculates that no row repeats its tile max and redoes the rare warp
// tile where one does (forward_block), with the bits of counting first.
#pragma once

#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_forward_config.cuh"
#include "kernels/cuda/attention_forward_output.cuh"
#include "kernels/cuda/attention_forward_pipe.cuh"
#include "kernels/cuda/attention_forward_tile.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/attention_sr.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace rwd::kernels::cuda {

// The key loop of one block. kExtras: the head uses s_bf16, acc_bf16 or a qk / softmax / pv
// fault (else those branches compile away). kTies: the head is stabilized or stats are
// collected with extras or FP32 operands (else no tie counting before the exponentials). kStats:
// the monitors are collected (a.stats set); without kTies (a plain BF16 head, what training
// runs) the ties are counted after the exponentials (count_ties_after_exp). Each is a separate
// specialization: a runtime test inside the unrolled loops still costs instructions per element. In the mma C layout a thread holds, per m16
// block mt, rows r_a = 16 mt + lane/4 and r_a + 8 of its warp, columns 8 nb + 2 (lane%4) + {0,1}.
// kF32: the head promotes qk, pv or softmax (FP32 variant). Its FP32 operands enter as three
// BF16 planes each (a.q_pl, a.k_pl, a.v_pl: x = x0 + x1 + x2 exactly), in shared memory side by
// side; S = Q K^T and Ō += P̄ V take the six products of split_lo + a0 b0, the small ones in
// an accumulator of their own (lo), added once per tile in FP32 (the tensor cores' FP32 sums
// truncate; kept apart, their error scales with the small terms only). P̄ of a pv=fp32 head is
// split in registers. softmax=fp32: the rescale, l and LSE in double, as the CPU twin, and
// P̄ = exp(S - m) from the exact difference (exp_diff_accurate); otherwise P̄ = expf(S - m)
// (accurate FP32, not ex2.approx). l is summed in double for every FP32 head.
// kWg (BF16 variants, sm_90a): S = Q K^T and Ō += P̄ V on Hopper's warpgroup MMA from
// 128-byte-swizzled tiles (wgmma.cuh) instead of ldmatrix + mma.sync, everything else as is.
// The bits are the same: wgmma's k16 products and FP32 accumulation equal mma.sync's
// (experiments/cuda_bench/wgmma_probe.cu), each accumulator sees the same k-steps in the same
// order, and every row the same key tiles (AttentionCuda.WgmmaKernelsEqualMmaKernelsBitwise).
// Shape::kTma (D = 128): two warpgroups, K/V by TMA through a ring of mbarrier-guarded stages
// (tm: the tensor maps); each warpgroup skips, votes and releases on its own.
// Dg: the head dim in memory where the TMA kernel computes a smaller one padded to D
// (wgmma_fwd_dim), else D.
// kSr (BF16 heads): the head has an sr flag; only this variant draws bits. Without kExtras the
// head is pv=sr alone: the plain loop with the P̄V operand rounded stochastically (exp_tile; at
// D = 128 the pipelined loop), P̄ formed as the extras variant forms it, so the bits are those of
// the same head run with kExtras.
template <int D, bool kExtras, bool kTies, bool kStats, bool kF32, bool kWg = false, int Dg = D, bool kSr = false>
__device__ __forceinline__ void forward_block(const KernelArgs& a, const FlagView& f,
                                              uint16_t* smem_in, BlockTile bt, const TmaMaps* tm = nullptr) {
  using Tr = FwdTr<D, kF32, kWg>;
  using Shape = FwdShape<D, kF32, kWg>;
  using Acc = std::conditional_t<kF32, double, float>;  // l and the row sums
  static_assert(Dg == D || (Shape::kTma && Dg < D && Dg % 16 == 0), "a padded dim: TMA kernels only");
  if constexpr (Shape::kTma && Tr::kQRegs && REWIND_FWD_PIPE && !kExtras && !kTies) {
    // plain heads, and pv=sr alone (kSr without kExtras): attention_forward_pipe.cuh
    forward_block_pipelined<D, kStats, Dg, kSr>(a, f, smem_in, bt, tm);
    return;
  }
  // kSr without kExtras: pv=sr alone (forward_variant); qk=sr and acc=sr only with kExtras.
  constexpr bool kSrQkAcc = kSr && kExtras;
  constexpr int kMt = Tr::kMt, kRows = Shape::kRows, kNThr = Tr::kWarps * 32;  // (not the producer warpgroup)
  constexpr int kPl = Shape::kPlanes, kStages = Shape::kStages;
  constexpr int kStride = Shape::kStride, kKvTile = kBlockK * kStride;
  uint16_t* smem = kWg ? reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(smem_in) + 1023) &
                                                     ~uintptr_t{1023})
                       : smem_in;
  const int bh = bt.bh, h = bh % a.heads, q0 = bt.tile * kRows;
  const bool qk32 = kF32 && f.qk_f32, pv32 = kF32 && f.pv_f32, sm64 = kF32 && f.sm_f64;
  const SrStreams sr = kSr ? sr_streams(a.sr_key, bh, a.heads) : SrStreams{};
  uint16_t* s_q = smem;                          // [kPl][kRows][kStride]
  uint16_t* s_k = smem + kPl * kRows * kStride;  // [kStages][kPl][64][kStride]
  uint16_t* s_v = s_k + kStages * kPl * kKvTile; // [kStages][kPl][64][kStride]
  constexpr bool kTma = Shape::kTma;
  const KvRing<D, kStages, Tr::kWarps, Shape::kProducerGroup> ring{
      reinterpret_cast<uint64_t*>(s_v + kStages * kPl * kKvTile), s_k, s_v};

  const int T = a.seq, warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  const size_t base = static_cast<size_t>(bh) * T * Dg;
  const int n_all = (T + kBlockK - 1) / kBlockK;
  const int n_kt = a.causal ? min(n_all, (q0 + kRows - 1) / kBlockK + 1) : n_all;
  const int w_row0 = q0 + warp * 16 * kMt;  // first query row of this warp
  // (through a shuffle: warp-uniform to ptxas, so the tile skip below keeps the wgmma
  // descriptors in uniform registers)
  const int w_row_last = __shfl_sync(0xffffffffu, w_row0 + 16 * kMt - 1, 0);

  // Plane pl of an operand: the BF16 input, or for an FP32 operand its split planes.
  auto plane = [&](const uint16_t* b16, const uint16_t* const (&pl)[3], bool f32, int i) {
    return (f32 ? pl[i] : b16) + base;
  };
  // K and V tile j into buffer `stage` (planes 1, 2 only for FP32 operands).
  auto load_kv = [&](int stage, int j) {
    if constexpr (kWg) {
      load_tile_sw128<D, kBlockK, kNThr>(s_k + stage * kKvTile, a.k + base, j * kBlockK, T);
      load_tile_sw128<D, kBlockK, kNThr>(s_v + stage * kKvTile, a.v + base, j * kBlockK, T);
    } else {
#pragma unroll
      for (int i = 0; i < kPl; ++i) {
        if (i == 0 || qk32) {
          load_tile_async<D, kBlockK, kNThr>(s_k + (stage * kPl + i) * kKvTile,
                                             plane(a.k, a.k_pl, qk32, i), j * kBlockK, T);
        }
        if (i == 0 || pv32) {
          load_tile_async<D, kBlockK, kNThr>(s_v + (stage * kPl + i) * kKvTile,
                                             plane(a.v, a.v_pl, pv32, i), j * kBlockK, T);
        }
      }
    }
  };
  // TMA: KvRing::start, then the producer warpgroup's loads (run_producer), or the producer thread's
  // of tile j + kStages - 1 at the top of iteration j (produce_ahead).
  if constexpr (kTma) {
    static_assert(kKvTile == kBlockK * D && kPl == 1, "TMA ring: dense BF16 tiles");
    ring.template start<kRows>(s_q, tm, q0, bh, n_kt);
    if (ring.run_producer(tm, n_kt, bh)) return;
  } else {
    if constexpr (kWg) {
      load_tile_sw128<D, kRows, kNThr>(s_q, a.q + base, q0, T);
    } else {
#pragma unroll
      for (int i = 0; i < kPl; ++i) {
        if (i == 0 || qk32) {
          load_tile_async<D, kRows, kNThr>(s_q + i * kRows * kStride, plane(a.q, a.q_pl, qk32, i), q0, T);
        }
      }
    }
    load_kv(0, 0);
    cp_async_commit();
  }

  uint32_t qf[Tr::kQRegs ? kPl : 1][Tr::kQRegs ? kMt : 1][Tr::kQRegs ? D / 16 : 1][4];
  float o[kMt][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  }
  float m[kMt][2];
  Acc l[kMt][2];
  // Monitor state per row: running max of S and how often it occurs (eps 0), and the P̄ == 1
  // count: per thread in `ones` with extras (their P̄V operand is not bf16(P̄)); otherwise on
  // the tensor cores from the operand (count_bf16_ones_mma), each row's count in every C column
  // of ones_acc.
  float run_max[kMt][2];
  int run_cnt[kMt][2], ones[kMt][2];
  float ones_acc[kMt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[mt][r] = run_max[mt][r] = -INFINITY;
      l[mt][r] = 0.0f;
      run_cnt[mt][r] = ones[mt][r] = 0;
    }
    ones_acc[mt][0] = ones_acc[mt][1] = ones_acc[mt][2] = ones_acc[mt][3] = 0.0f;
  }
  StatAcc st;

  // S of key tile j for this warp (K tile in k_t): Q K^T on the tensor cores, then scale,
  // optional qk fault and BF16 rounding, mask. Also called again, on the same tile, by the
  // stabilized kernel's rare redo (see below), so both passes give the same bits.
  auto scores = [&](float (&s)[kMt][8][4], const uint16_t* k_t, int j) {
    // S = Q K^T: (16 kMt rows x 64 keys) per warp; each K fragment feeds kMt mma. FP32 qk:
    // the five small products in s_lo, added to s at the end.
    float s_lo[kF32 ? kMt : 1][4][2][4];
#pragma unroll
    for (int mt = 0; mt < (kWg ? 0 : kMt); ++mt) {  // (wgmma writes s without reading it)
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][nb][e] = 0.0f;
          if constexpr (kF32) s_lo[mt][nb / 2][nb % 2][e] = 0.0f;
        }
      }
    }
    if constexpr (kWg) {
      float(&s32)[32] = reinterpret_cast<float(&)[32]>(s[0]);
      if constexpr (Tr::kQRegs) {  // Q from registers: half the shared-memory reads of S
        wgmma_scores_rs_issue<D>(s32, qf[0][0], wgmma_desc(k_t, 16, 1024));
      } else {
        wgmma_scores_issue<D, kRows>(s32, s_q + wg * 64 * 64, k_t);  // this warpgroup's 64 rows
      }
      wgmma_scores_wait(s32);
    }
#pragma unroll
    for (int kk = 0; kk < (kWg ? 0 : D / 16); ++kk) {
      uint32_t qa[kPl][kMt][4];
#pragma unroll
      for (int i = 0; i < kPl; ++i) {
        if (i > 0 && !qk32) continue;
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          if constexpr (Tr::kQRegs) {
#pragma unroll
            for (int r = 0; r < 4; ++r) qa[i][mt][r] = qf[i][mt][kk][r];
          } else {
            ldmatrix_x4(qa[i][mt], s_q + i * kRows * kStride +
                                       (warp * 16 * kMt + mt * 16 + (lane % 8) +
                                        ((lane / 8) % 2) * 8) * kStride +
                                       kk * 16 + (lane / 16) * 8);
          }
        }
      }
#pragma unroll
      for (int nb2 = 0; nb2 < 4; ++nb2) {
        uint32_t b[kPl][4];
#pragma unroll
        for (int i = 0; i < kPl; ++i) {
          if (i > 0 && !qk32) continue;
          ldmatrix_x4(b[i], k_t + i * kKvTile + (nb2 * 16 + (lane % 8) + (lane / 16) * 8) * kStride +
                                kk * 16 + ((lane / 8) % 2) * 8);
        }
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          if constexpr (kF32) {
            if (qk32) mma_split_lo(s_lo[mt][nb2], qa[0][mt], qa[1][mt], qa[2][mt], b);
          }
          mma_bf16(s[mt][2 * nb2], qa[0][mt], b[0][0], b[0][1]);
          mma_bf16(s[mt][2 * nb2 + 1], qa[0][mt], b[0][2], b[0][3]);
        }
      }
    }
    if constexpr (kF32) {
      if (qk32) {
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nb][e] = __fadd_rn(s[mt][nb][e], s_lo[mt][nb / 2][nb % 2][e]);
          }
        }
      }
    }

    finish_tile<kMt, kExtras, kSrQkAcc>(s, a, f, j, w_row0, sr.qk);
  };

  auto exp_pass = [&](const float (&s)[kMt][8][4], const float (&mn)[kMt][2],
                      uint32_t (&pa)[kPl][kMt][4][4], Acc (&rowsum)[kMt][2], int j) {
    exp_tile<kMt, kPl, kF32, kExtras, kStats, kSr>(s, mn, pa, rowsum, ones, f, sm64, pv32, sr.pv, w_row0,
                                                    static_cast<uint32_t>(j * kBlockK + (lane % 4) * 2));
  };

  for (int j = 0; j < n_kt; ++j) {
    const int stage = j % kStages;
    if constexpr (kTma) {
      ring.produce_ahead(tm, j, n_kt, bh);
      if (j == 0) ring.wait_q();
      ring.wait(j);
    } else {
      if (kStages == 1 && j > 0) {  // one buffer: every warp is done with tile j - 1
        __syncthreads();
        load_kv(0, j);
        cp_async_commit();
      }
      cp_async_wait_all();
      if constexpr (kWg) fence_proxy_async();  // the tiles, to wgmma's (async) proxy
      __syncthreads();
      if (kStages == 2 && j + 1 < n_kt) {  // prefetch the next K, V tile into the other buffer
        load_kv((j + 1) & 1, j + 1);
        cp_async_commit();
      }
    }
    const uint16_t* k_t = s_k + stage * kPl * kKvTile;
    const uint16_t* v_t = s_v + stage * kPl * kKvTile;
    if constexpr (Tr::kQRegs) {
      if (j == 0) {
#pragma unroll
        for (int i = 0; i < kPl; ++i) {
          if (i > 0 && !qk32) continue;
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
              const int row = warp * 16 * kMt + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
              const int col = kk * 16 + (lane / 16) * 8;
              ldmatrix_x4(qf[i][mt][kk], s_q + i * kRows * kStride +
                                             (kWg ? sw128_offset(row, col, kRows) / 2 : row * kStride + col));
            }
          }
        }
      }
    }
    // Causal: a key tile entirely right of this warp's last row is masked for all its rows;
    // skipping it changes nothing (m, l, Ō and the monitors are unchanged by an empty tile).
    if (a.causal && j * kBlockK > w_row_last) {
      if constexpr (kTma) ring.release(j);
      continue;
    }

    float s[kMt][8][4];
    scores(s, k_t, j);

    float r_m[kMt][2];
    tile_row_max(s, r_m);

    // Running max of each row after this tile (m_new), stabilized per tile when the head asks
    // for it, and the monitors. Ties are counted on the tensor cores (count_ties_mma): r_s =
    // #{S >= r_m - eps} for the stable rule and, for the monitors, the exact ties of the tile
    // max (#{S >= r_m} with eps 0, as no S exceeds r_m). The stabilized kernel without monitors
    // (kSpec) speculates that no row of the tile repeats its max (m' = r_m) and forms P̄ with
    // that max while the count completes; a warp where a repeated max changes some row's
    // running max redoes the tile (below). The other variants read the count first. Masked
    // (-inf) entries count only in a row with no visible key in this tile (r_m = -inf), which
    // stable_max leaves alone and the monitors skip.
    constexpr bool kSpec = REWIND_STABLE_SPEC && kTies && !kStats && !kExtras;
    constexpr bool kTiesAfterExp = kStats && !kTies;
    static_assert(!kTiesAfterExp || (!kExtras && !kF32), "ties after the exponentials: plain BF16 heads");
    float m_new[kMt][2];
    float tie_cnt[kMt][2][4];  // C fragments of two tie-count accumulators per m16 block
    // With monitors the exact ties (eps 0) are counted anyway; they are r_s too unless the head
    // is stabilized with eps > 0 (a head that is not stabilized never reads r_s). The variant
    // with extras keeps its own count (sharing it there costs registers at D128).
    const bool own_r_s = !kStats || kExtras || (f.stable && f.eps != 0.0f);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      if (kTies && own_r_s) {
        count_ties_mma(s[mt], r_m[mt][0] - f.eps, r_m[mt][1] - f.eps, tie_cnt[mt]);
      }
      if constexpr (kSpec) {
#pragma unroll
        for (int r = 0; r < 2; ++r) m_new[mt][r] = fmaxf(m[mt][r], r_m[mt][r]);
      } else {
        int r_s[2] = {0, 0}, ties[2] = {0, 0};
        if constexpr (kTies) {
          float eq_cnt[2][4];
          if constexpr (kStats) count_ties_mma(s[mt], r_m[mt][0], r_m[mt][1], eq_cnt);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            r_s[r] = kStats && !own_r_s ? tie_count(eq_cnt, r) : tie_count(tie_cnt[mt], r);
            if constexpr (kStats) ties[r] = r_m[mt][r] == -INFINITY ? 0 : tie_count(eq_cnt, r);
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float m_tile = r_m[mt][r];
          int branch = 0;
          bool guarded = false;
          if constexpr (kTies) {
            // The shift code runs only in warps where some row has a repeated max (rare).
            if (__any_sync(0xffffffffu, r_s[r] > 1)) {
              m_tile = stable_max(r_m[mt][r], r_s[r], f, &branch, &guarded);
            }
          }
          m_new[mt][r] = fmaxf(m[mt][r], m_tile);
          const int row = w_row0 + mt * 16 + lane / 4 + 8 * r;
          if (kStats && (lane % 4) == 0 && row < T) {
            st.pos += branch == 1;
            st.neg += branch == 2;
            st.guard += guarded;
            st.max_logit = fmaxf(st.max_logit, r_m[mt][r]);
            if constexpr (!kTiesAfterExp) track_max(run_max[mt][r], run_cnt[mt][r], r_m[mt][r], ties[r]);
          }
        }
      }
    }

    // P̄ = exp(S - m_new) (FP32, fast_exp_shifted), row sums of the unrounded P̄ (this thread's
    // columns), P operand for P̄V.
    uint32_t pa[kPl][kMt][4][4];  // A fragments of P (per plane): 4 k-blocks of 16 keys
    Acc rowsum[kMt][2];
    exp_pass(s, m_new, pa, rowsum, j);
    if constexpr (kStats && !kExtras) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        const int row_a = w_row0 + mt * 16 + lane / 4;
        if constexpr (kTiesAfterExp) {
          count_ties_after_exp(s[mt], r_m[mt], pa[0][mt], row_a < T, row_a + 8 < T, ones_acc[mt], run_max[mt],
                               run_cnt[mt]);
        } else {
          count_bf16_ones_mma(pa[0][mt], ones_acc[mt]);
        }
      }
    }

    if constexpr (kSpec) {
      // Rows whose max repeats (r_s > 1) take the stabilized max. Where that changes a row's
      // running max, the warp computes S of this tile again (the K tile is still in shared
      // memory; the same mma in the same order give the same bits) and P̄ with the final max,
      // so the result is bit for bit that of counting first (the monitored kernel's).
      bool any_tie = false;
      int r_s[kMt][2];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          r_s[mt][r] = tie_count(tie_cnt[mt], r);
          any_tie |= r_s[mt][r] > 1;
        }
      }
      // wgmma runs per warpgroup: with kWg the redo is decided for the warpgroup, and
      // warps whose max did not change recompute the same S and P̄ (same bits).
      if (kWg ? warpgroup_any(any_tie, 1 + wg) : __any_sync(0xffffffffu, any_tie)) {
        bool changed = false;
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            int branch;
            bool guarded;
            const float m_fix =
                fmaxf(m[mt][r], stable_max(r_m[mt][r], r_s[mt][r], f, &branch, &guarded));
            changed |= m_fix != m_new[mt][r];
            m_new[mt][r] = m_fix;
          }
        }
        if (kWg ? warpgroup_any(changed, 1 + wg) : __any_sync(0xffffffffu, changed)) {
          float s2[kMt][8][4];
          scores(s2, k_t, j);
          exp_pass(s2, m_new, pa, rowsum, j);
        }
      }
    }

    rescale_rows<D, kMt, kF32, kExtras>(f, m, l, o, m_new, rowsum, sm64);

    // Ō += bf16(P̄) V: A = P from registers, B = V (keys x D) through ldmatrix.trans; each V
    // fragment feeds kMt mma. FP32 pv: the five small products of the tile in o_lo, added to
    // Ō after the tile.
    float o_lo[kF32 ? kMt : 1][kF32 ? D / 16 : 1][2][4];
    if constexpr (kF32) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o_lo[mt][i / 2][i % 2][e] = 0.0f;
        }
      }
    }
    if constexpr (kWg) wgmma_pv<D>(reinterpret_cast<float(&)[D / 2]>(o[0]), pa[0][0], v_t);
    if constexpr (kTma) ring.release(j);  // K and V of this tile read (the products waited for)
#pragma unroll
    for (int kk = 0; kk < (kWg ? 0 : 4); ++kk) {
#pragma unroll
      for (int nb2 = 0; nb2 < D / 16; ++nb2) {
        uint32_t b[kPl][4];
#pragma unroll
        for (int i = 0; i < kPl; ++i) {
          if (i > 0 && !pv32) continue;
          ldmatrix_x4_trans(b[i], v_t + i * kKvTile + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                                      nb2 * 16 + (lane / 16) * 8);
        }
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          if constexpr (kF32) {
            if (pv32) mma_split_lo(o_lo[mt][nb2], pa[0][mt][kk], pa[1][mt][kk], pa[2][mt][kk], b);
          }
          mma_bf16(o[mt][2 * nb2], pa[0][mt][kk], b[0][0], b[0][1]);
          mma_bf16(o[mt][2 * nb2 + 1], pa[0][mt][kk], b[0][2], b[0][3]);
        }
      }
    }
    if constexpr (kF32) {
      if (pv32) {
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
          for (int i = 0; i < D / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][i][e] = __fadd_rn(o[mt][i][e], o_lo[mt][i / 2][i % 2][e]);
          }
        }
      }
    }
    if (kExtras && f.acc_bf16) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][i][e] = round_bf16(o[mt][i][e]);
        }
      }
    }
    if constexpr (kSrQkAcc) {
      if (f.acc_sr) sr_round_acc<D, kMt>(o, l, sr.acc, w_row0, j);
    }
  }

  write_forward_rows<D, kMt, kF32, Dg>(a, f, o, m, l, w_row0, base, bh, sm64);
  if constexpr (kStats) finish_monitors<kMt, kExtras>(a, st, ones, ones_acc, run_cnt, w_row0, h);
}

}  // namespace rwd::kernels::cuda
