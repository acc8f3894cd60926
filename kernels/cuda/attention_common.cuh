// Device helpers shared by the CUDA attention kernels: BF16 rounding, mma.sync / ldmatrix /
// cp.async wrappers, per-head flag decoding, the stabilized-softmax rule and monitor counters.
#pragma once

#include <cuda_bf16.h>
#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/block_order.h"

namespace rwd::kernels::cuda {

// Key tile of every kernel. The stabilized rule (paper Alg. 3) is applied per key tile, so the
// tiled GPU path is numerically defined only for AttentionParams::block_k == kBlockK (or
// tiling off); the launchers reject other tile sizes.
constexpr int kBlockK = 64;
constexpr int kBlockQ = 64;        // query rows per block in the backward kernels (forward:
                                   // FwdTraits in attention_forward.cu)
constexpr int kWarps = 4;          // backward: 16 query (or key) rows per warp
constexpr int kThreads = kWarps * 32;

// Underflow guard of the stabilized softmax: the shift d = m' - r_m is clamped to
// [2^-8, 16]. d >= 2^-8 makes the largest P̄ = exp(-d) <= 0.99610, which rounds to
// 0.99609375 < 1 in BF16 (BF16 spacing below 1 is 2^-8); d <= 16 keeps the largest
// P̄ >= exp(-16) = 1.1e-7, far above the FP32 underflow, so l never becomes 0.
constexpr float kGuardMin = 0.00390625f;
constexpr float kGuardMax = 16.0f;
constexpr float kFaultUnit = 0.00390625f;  // fault strength unit: 2^-8 relative

// ---------------------------------------------------------------------------------------------
// This block's (tile, batch-head) in the block order of a causal launch (block_order.h).
__device__ __forceinline__ BlockTile block_tile(bool causal, bool longest_last) {
  return block_tile_of(static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(gridDim.x),
                       static_cast<int>(gridDim.y), causal, longest_last);
}

// ---------------------------------------------------------------------------------------------
// BF16 helpers (round-to-nearest-even unless named otherwise)

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float round_bf16_down(float x) {
  return __bfloat162float(__float2bfloat16_rd(x));
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------------------------------------
// Per-head flags, decoded once per block into registers.

struct FlagView {
  bool qk_f32, pv_f32, o_f32, o_fault, bwd_f32, sm_f64, delta_f64, delta_fault, delta_dpp;
  bool s_bf16, acc_bf16, stable, qk_fault, sm_fault;
  bool s_sr, pv_sr, acc_sr;  // stochastic rounding (attention_sr.cuh)
  float beta, eps;
  float qk_c;      // qk fault: S += c |S|
  float sm_keep;   // softmax fault: P̄ *= 1 - c for P̄ < 1
  float pv_bias;   // pv fault: PV operand bf16(P̄ (1 + c))
  float o_strength;  // o fault: O = bf16_down(x - f * ulp_bf16(x)), f the raw strength
  float delta_c;   // delta fault: delta += c * sum |terms|
};

__device__ __forceinline__ FlagView decode_flags(const HeadFlags& hf) {
  auto prec = [&](Op op) { return hf.prec[static_cast<int>(op)]; };
  auto c = [&](Op op) { return hf.fault[static_cast<int>(op)] * kFaultUnit; };
  FlagView v;
  v.qk_f32 = prec(Op::kQk) == Prec::kFp32;
  v.qk_fault = prec(Op::kQk) == Prec::kFault;
  v.sm_f64 = prec(Op::kSoftmax) == Prec::kFp32;
  v.sm_fault = prec(Op::kSoftmax) == Prec::kFault;
  v.pv_f32 = prec(Op::kPv) == Prec::kFp32;
  v.o_f32 = prec(Op::kO) == Prec::kFp32;
  v.o_fault = prec(Op::kO) == Prec::kFault;
  v.delta_f64 = prec(Op::kDelta) == Prec::kFp32;
  v.delta_fault = prec(Op::kDelta) == Prec::kFault;
  v.bwd_f32 = prec(Op::kBwd) == Prec::kFp32;
  v.delta_dpp = hf.delta_dpp;
  v.s_bf16 = hf.s_bf16;
  v.acc_bf16 = hf.acc_bf16;
  v.s_sr = hf.s_sr;
  v.pv_sr = hf.pv_sr;
  v.acc_sr = hf.acc_sr;
  v.stable = hf.stable;
  v.beta = hf.beta;
  v.eps = hf.eps;
  v.qk_c = v.qk_fault ? c(Op::kQk) : 0.0f;
  v.sm_keep = 1.0f - (v.sm_fault ? c(Op::kSoftmax) : 0.0f);
  v.pv_bias = 1.0f + (prec(Op::kPv) == Prec::kFault ? c(Op::kPv) : 0.0f);
  v.o_strength = hf.fault[static_cast<int>(Op::kO)];
  v.delta_c = v.delta_fault ? c(Op::kDelta) : 0.0f;
  return v;
}

// Heads whose flags need FP32/FP64 operands run the split-BF16 (FP32) variants of the
// tensor-core kernels, or with simt_fp32 the SIMT reference kernels; a delta fault, and
// delta=fp32 with delta=dpp, take the SIMT kernels always, and so do FP32 heads that round S or
// P stochastically (the split variants have no SR). The choice is per head and uniform within a
// block. Must agree with forward_variant (attention_internal.cuh) and plan_launch.
__device__ __forceinline__ bool backward_fp32(const FlagView& f) {
  return f.qk_f32 || f.pv_f32 || f.sm_f64 || f.bwd_f32 || f.delta_f64;
}
__device__ __forceinline__ bool backward_needs_simt(const FlagView& f, bool simt_fp32) {
  return f.delta_fault || (f.delta_f64 && f.delta_dpp) ||
         ((simt_fp32 || f.s_sr || f.pv_sr) && backward_fp32(f));
}

// S from the FP32 dot product: alpha * acc, then the qk fault, then the s_bf16 rounding.
// Explicit _rn operations: no FMA contraction, as in the CPU emulation.
__device__ __forceinline__ float finish_score(float acc, float alpha, const FlagView& f) {
  float x = __fmul_rn(alpha, acc);
  if (f.qk_fault) x = __fadd_rn(x, __fmul_rn(f.qk_c, fabsf(x)));
  return f.s_bf16 ? round_bf16(x) : x;
}

// Softmax fault: every P̄ below 1 shrinks by (1 - c) before l and P̄V see it.
__device__ __forceinline__ float softmax_fault(float pbar, const FlagView& f) {
  return (f.sm_fault && pbar < 1.0f) ? __fmul_rn(pbar, f.sm_keep) : pbar;
}

// P̄ as it enters P̄V: bf16(P̄ (1 + c)) (c = 0 without the pv fault), or P̄ for pv=fp32.
__device__ __forceinline__ float pv_operand(float pbar, const FlagView& f) {
  return f.pv_f32 ? pbar : round_bf16(__fmul_rn(pbar, f.pv_bias));
}

// Spacing of BF16 values at bf16(x): 2^(e-7) for binary exponent e, 2^-133 for 0/subnormals.
__device__ __forceinline__ float bf16_ulp(float x) {
  const uint32_t e = (float_to_bf16_bits(x) >> 7) & 0xffu;
  if (e == 0xffu) return __int_as_float(0x7fc00000);
  if (e == 0) return ldexpf(1.0f, -133);
  return ldexpf(1.0f, static_cast<int>(e) - 127 - 7);
}

// O as written in BF16: bf16(x), or for the o fault bf16_down(x - f * ulp_bf16(x)), a
// directed rounding toward -inf (test oracle for bisect; docs/plan.md, faults).
__device__ __forceinline__ float o_output(float x, const FlagView& f) {
  if (!f.o_fault) return round_bf16(x);
  return round_bf16_down(__fsub_rn(x, __fmul_rn(f.o_strength, bf16_ulp(x))));
}

// ---------------------------------------------------------------------------------------------
// Stabilized softmax (paper Alg. 3) for one row of one key tile. r_m = max over the unmasked
// entries, r_s = #{unmasked S >= r_m - eps}. If r_s > 1: target = beta*r_m (r_m > 0) or 0
// (r_m <= 0); the shift d = target - r_m is clamped to [2^-8, 16] (see kGuardMin) and
// m' = r_m + d. Otherwise m' = r_m. A row with no unmasked entry (r_m = -inf) is left alone.
// branch: 0 none, 1 positive (beta*r_m), 2 non-positive (shift to 0).
__device__ __forceinline__ float stable_max(float r_m, int r_s, const FlagView& f, int* branch,
                                            bool* guarded) {
  *branch = 0;
  *guarded = false;
  if (!f.stable || r_s <= 1 || r_m == -INFINITY) return r_m;
  const float target = r_m > 0.0f ? f.beta * r_m : 0.0f;
  const float d = target - r_m;
  const float dc = !(d >= kGuardMin) ? kGuardMin : fminf(d, kGuardMax);
  *branch = r_m > 0.0f ? 1 : 2;
  *guarded = dc != d;
  float m = __fadd_rn(r_m, dc);
  // For |r_m| >= 2^15 the FP32 sum can round back onto r_m; step up until the shift holds.
  while (__fsub_rn(m, r_m) < kGuardMin && isfinite(m)) m = nextafterf(m, INFINITY);
  return m;
}

// P̄ = exp(S - m) as FA2 evaluates it: 2^(S log2e - m log2e), one FFMA and the hardware
// ex2.approx (rel. error ~2^-22). m_log2 = m * log2e is formed once per row and tile. Against
// the CPU twin's expf(fl(S - m)) the result differs by ~|m| 2^-24 + 2^-22 relative, far below
// one BF16 ulp (2^-8) for any realistic logit, so bf16(P̄) agrees except at rounding ties.
// For S = m the FFMA leaves only the rounding error of m_log2 (|x| <= 2^-24 |m log2e|), so P̄
// is 1 within an FP32 ulp or two and bf16(P̄) == 1 exactly, as on the CPU; S = -inf gives
// exactly 0 (m is finite from the first key tile on: key 0 is visible to every row).
// Subnormal results flush to 0 (below 2^-126 of the row max: invisible in l and O).
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_exp_shifted(float s, float m_log2) {
  return exp2_approx(__fmaf_rn(s, kLog2e, -m_log2));
}
// exp(t) for an FP32 difference t already formed (backward: t = S - LSE).
__device__ __forceinline__ float fast_exp(float t) { return exp2_approx(__fmul_rn(t, kLog2e)); }

// 1.0f when x >= y, else 0.0f (FSET.BF; its upper half is a BF16 flag: count_ties_mma).
__device__ __forceinline__ float ge_one(float x, float y) {
  float m;
  asm("set.ge.f32.f32 %0, %1, %2;\n" : "=f"(m) : "f"(x), "f"(y));
  return m;
}

// Running-max rescale factor exp(m_old - m_new); 0 when nothing was accumulated yet.
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

// ---------------------------------------------------------------------------------------------
// Monitor counters (HeadStats). Integer counts are order-independent, so atomics keep the
// forward deterministic; max_logit uses the signed-float atomicMax trick.

struct StatAcc {
  float max_logit = -INFINITY;
  unsigned long long rows = 0, repeated = 0, pbar_one = 0, pos = 0, neg = 0, guard = 0;
};

__device__ __forceinline__ void atomic_max_float(float* addr, float v) {
  if (v >= 0.0f) {
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
  }
}

__device__ __forceinline__ void add_counter(int64_t* field, unsigned long long v) {
  if (v != 0) atomicAdd(reinterpret_cast<unsigned long long*>(field), v);
}

// Reduces one thread's counters over the warp and lets lane 0 publish them.
__device__ __forceinline__ void flush_stats(StatAcc s, HeadStats* out) {
  for (int off = 16; off > 0; off >>= 1) {
    s.max_logit = fmaxf(s.max_logit, __shfl_xor_sync(0xffffffffu, s.max_logit, off));
    s.rows += __shfl_xor_sync(0xffffffffu, s.rows, off);
    s.repeated += __shfl_xor_sync(0xffffffffu, s.repeated, off);
    s.pbar_one += __shfl_xor_sync(0xffffffffu, s.pbar_one, off);
    s.pos += __shfl_xor_sync(0xffffffffu, s.pos, off);
    s.neg += __shfl_xor_sync(0xffffffffu, s.neg, off);
    s.guard += __shfl_xor_sync(0xffffffffu, s.guard, off);
  }
  if ((threadIdx.x & 31) != 0) return;
  if (s.max_logit != -INFINITY) atomic_max_float(&out->max_logit, s.max_logit);
  add_counter(&out->rows, s.rows);
  add_counter(&out->repeated_max_rows, s.repeated);
  add_counter(&out->pbar_one, s.pbar_one);
  add_counter(&out->stable_pos, s.pos);
  add_counter(&out->stable_neg, s.neg);
  add_counter(&out->stable_guard, s.guard);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core and async-copy wrappers (sm_80+ instructions, used on sm_90).

// C(16x8, f32) += A(16x16, bf16, row) * B(16x8, bf16, col). Products of BF16 values are exact;
// accumulation is FP32 (docs/design.md: accumulation order is the only CPU/GPU difference).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Transposes the 8 x 8 BF16 matrix a warp holds in the mma fragment layout (lane l: row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1, the lower column in the low half).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

// 16-byte async copy; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
               "r"(src_size));
}
// The same for one 4-byte word (cp.async.ca: 16 bytes is the only size .cg takes).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n"); }

// Loads rows [row0, row0 + kRows) of a (T, D) bf16 matrix into smem with row stride D + 8
// (16-byte pad: conflict-free ldmatrix). Rows >= T are zero-filled. All kNThreads threads call
// it. Thread t copies the 16-byte chunk t % (D/8) of rows t / (D/8) + i * step: the per-thread
// offsets are fixed, so the unrolled copies cost a compare, a select and the copy each. Where
// D/8 does not divide the thread count (D = 80, 96: 10 and 12 chunks a row), thread t copies
// chunks t, t + kNThreads, ... of the tile in row-major order instead.
template <int D, int kRows = 64, int kNThreads = kThreads>
__device__ __forceinline__ void load_tile_async(uint16_t* smem, const uint16_t* g, int row0,
                                                int T) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  if constexpr (kNThreads % kChunks != 0) {
    constexpr int kAll = kRows * kChunks;
#pragma unroll
    for (int i = 0; i < (kAll + kNThreads - 1) / kNThreads; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kNThreads;
      if (kAll % kNThreads != 0 && c >= kAll) break;
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const bool valid = row0 + r < T;
      cp_async_16(smem + r * (D + 8) + col, valid ? g + static_cast<ptrdiff_t>(row0 + r) * D + col : g, valid);
    }
  } else {
    constexpr int kRowStep = kNThreads / kChunks;
    static_assert(kRows % kRowStep == 0, "tile/thread mismatch");
    const int r = static_cast<int>(threadIdx.x) / kChunks;
    const int col = (static_cast<int>(threadIdx.x) % kChunks) * 8;
    const uint16_t* src = g + static_cast<ptrdiff_t>(row0 + r) * D + col;
    uint16_t* dst = smem + r * (D + 8) + col;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool valid = row0 + r + i * kRowStep < T;
      cp_async_16(dst + i * kRowStep * (D + 8), valid ? src + i * kRowStep * D : g, valid);
    }
  }
}

// Two BF16 ones: the all-ones mma B register of the tensor-core counts below, and the flag
// value their A registers hold for a hit.
constexpr uint32_t kBf16OnePair = 0x3F803F80u;

// Tie counts of one m16 block of S (a 16 x 64 tile in the mma C layout) on the tensor cores:
// per row, #{S >= thr} with thr0 for row lane/4 and thr1 for row lane/4 + 8. set.ge gives 1.0f
// or 0.0f, whose upper half is the BF16 flag; one PRMT puts two flags of a row into one mma
// A-fragment register (a0, a2: row lane/4; a1, a3: row lane/4 + 8), and an mma against an
// all-ones B sums a row's flags exactly in FP32 with the count in every C column, so no adds
// and no quad shuffles: per score one compare and half a PRMT, an mma per 16 keys. (One flag
// per register, (0, flag) as it stands, took twice the mma and measured 1% slower; the flags
// summed on the integer pipe, 1-2% slower: experiments/cuda_bench/RESULTS.md, runs 21-22.) Two
// accumulators halve the dependent mma chain; tie_count() reads a row's total.
__device__ __forceinline__ void count_ties_mma(const float (&s)[8][4], float thr0, float thr1,
                                               float (&acc)[2][4]) {
  // The upper halves of x and y as a BF16 pair (x low).
  auto pair = [](float x, float y) {
    return __byte_perm(__float_as_uint(x), __float_as_uint(y), 0x7632);
  };
#pragma unroll
  for (int c = 0; c < 2; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;
#pragma unroll
  for (int nb = 0; nb < 8; nb += 2) {
    const uint32_t flags[4] = {
        pair(ge_one(s[nb][0], thr0), ge_one(s[nb][1], thr0)),
        pair(ge_one(s[nb][2], thr1), ge_one(s[nb][3], thr1)),
        pair(ge_one(s[nb + 1][0], thr0), ge_one(s[nb + 1][1], thr0)),
        pair(ge_one(s[nb + 1][2], thr1), ge_one(s[nb + 1][3], thr1))};
    mma_bf16(acc[(nb / 2) & 1], flags, kBf16OnePair, kBf16OnePair);
  }
}
// Adds to acc (a C fragment) each row's number of keys whose packed BF16 P̄V operand (pa: the
// four A fragments of one m16 block, 16 keys each) is exactly 1: one set.eq.bf16x2 per two
// keys gives BF16 1.0 / 0.0 flags that are mma A registers as they stand (no pack), and 4 mma
// against an all-ones B sum 64 keys exactly in FP32, the count in every column. The 4 mma
// start from zero each, not one after another (a chain of four mma latencies in the monitored
// forward's critical path); counts up to 64 add exactly in any order.
__device__ __forceinline__ void count_bf16_ones_mma(const uint32_t (&pa)[4][4], float (&acc)[4]) {
  float part[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t flags[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      asm("set.eq.bf16x2.bf16x2 %0, %1, %2;\n" : "=r"(flags[i]) : "r"(pa[kk][i]), "r"(kBf16OnePair));
      part[kk][i] = 0.0f;
    }
    mma_bf16(part[kk], flags, kBf16OnePair, kBf16OnePair);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += (part[0][i] + part[1][i]) + (part[2][i] + part[3][i]);
}
// The monitors' running max of a row and how often it occurred, after a tile whose max r_m
// occurs `ties` times, where `take` (else unchanged); written as selects (ptxas may still
// branch).
__device__ __forceinline__ void track_max(float& run_max, int& run_cnt, float r_m, int ties, bool take = true) {
  const bool gt = take && r_m > run_max, eq = take && r_m == run_max;
  run_cnt = gt ? ties : eq ? run_cnt + ties : run_cnt;
  run_max = gt ? r_m : run_max;
}
// Below this |max| the exponent residual of P̄ = ex2(fma(S, log2e, -fl(m log2e))) at S = m is at
// most 2^-10 (half an ulp of m log2e < 2^15), so P̄ rounds to BF16 1.
constexpr float kTieProxyMax = 16384.0f;
// Row r's (0: lane/4, 1: lane/4 + 8) count from count_ties_mma's accumulators (exact: <= 64).
__device__ __forceinline__ int tie_count(const float (&acc)[2][4], int r) {
  return static_cast<int>(acc[0][2 * r] + acc[1][2 * r]);
}

// The monitors of one m16 block of a head that is not stabilized, after its exponentials: the
// P̄ == 1 count of the tile (into ones_acc) and the exact ties of each row's tile max r_m (into
// run_max / run_cnt, lanes lane % 4 == 0 of live rows). There m_new = max(m_old, r_m), and the
// ties matter only where r_m = m_new, where each of them has bf16(P̄) = 1 (|r_m| <
// kTieProxyMax). So a row with at most one P̄ == 1 in the tile has exactly one tie, its max, and
// only a warp where some live row has more (rare: a near-tie within ~0.002) compares every
// score with r_m. The counts equal counting first, with fewer instructions per score.
__device__ __forceinline__ void count_ties_after_exp(const float (&s)[8][4], const float (&r_m)[2],
                                                     const uint32_t (&pa)[4][4], bool live0, bool live1,
                                                     float (&ones_acc)[4], float (&run_max)[2],
                                                     int (&run_cnt)[2]) {
  const bool live[2] = {live0, live1};
  float tile_ones[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  count_bf16_ones_mma(pa, tile_ones);
  bool ok = true;
  int ties[2] = {1, 1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ones_acc[2 * r] += tile_ones[2 * r];
    ok &= !live[r] | ((tile_ones[2 * r] <= 1.0f) & (fabsf(r_m[r]) < kTieProxyMax));  // (no branch)
  }
  if (!__all_sync(0xffffffffu, ok)) {
    float eq[2][4];
    count_ties_mma(s, r_m[0], r_m[1], eq);
#pragma unroll
    for (int r = 0; r < 2; ++r) ties[r] = r_m[r] == -INFINITY ? 0 : tie_count(eq, r);
  }
  const int lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    track_max(run_max[r], run_cnt[r], r_m[r], ties[r], ((lane % 4) == 0) & live[r]);
  }
}

}  // namespace rwd::kernels::cuda
