// Plain parameter structs shared by every attention implementation (CPU emulation, CUDA).
// No LibTorch, no STL containers: the CUDA kernels include this header through nvcc alone.
#pragma once

#include <cstdint>

namespace rwd::kernels {

// The attention ops in data-flow order (docs/design.md, rounding points). The numeric values index arrays.
enum class Op : uint8_t { kQk = 0, kSoftmax = 1, kPv = 2, kO = 3, kDelta = 4, kBwd = 5 };
constexpr int kNumOps = 6;

// Precision of one op in one head.
//   kLow   : the default, kernel-faithful low precision (BF16 operands, FP32 accumulation).
//   kFp32  : the op's operands and result kept in FP32 (the "promote to FP32" fix).
//   kFault : kLow plus a systematic, documented bias of strength fault[op] (test oracle for
//            bisect; promoting the op to kFp32 removes it).
enum class Prec : uint8_t { kLow = 0, kFp32 = 1, kFault = 2 };

// Everything one head's attention needs to know about its plan. Trivially copyable.
struct HeadFlags {
  Prec prec[kNumOps] = {Prec::kLow, Prec::kLow, Prec::kLow, Prec::kLow, Prec::kLow, Prec::kLow};
  float fault[kNumOps] = {0, 0, 0, 0, 0, 0};  // strength per op when prec[op] == kFault
  // Numeric regimes (plan modes, docs/plan.md):
  bool s_bf16 = false;     // qk=bf16: S rounded to BF16 before the softmax (eager autocast)
  bool acc_bf16 = false;   // acc=bf16: running O and l kept in BF16 (paper's pure-PyTorch flash)
  bool stable = false;     // softmax=stable: paper Alg. 3 with the underflow guard
  float beta = 2.0f;       // stable: shift multiplier for a repeated positive max
  float eps = 0.0f;        // stable: a tie is S >= r_m - eps
  bool delta_dpp = false;  // delta=dpp: delta = rowsum(dP * P) instead of rowsum(dO * O)
  // Stochastic rounding (kernels/stochastic_round.h), random bits from AttentionParams::sr_key:
  bool s_sr = false;       // qk=sr: S rounded to BF16 before the softmax, stochastically
  bool pv_sr = false;      // pv=sr: the BF16 P̄ of P̄V (and P of dV = P^T dO) stochastic
  bool acc_sr = false;     // acc=sr: running O and l in BF16 as acc=bf16, stochastically
};

// Per-head monitor counters, accumulated over all (batch, query-row, key-tile) visits of a
// forward pass. Plain integers/floats so a CUDA kernel can fill them with integer atomics.
struct HeadStats {
  float max_logit = -1e30f;      // max over unmasked S (after scaling)
  int64_t rows = 0;              // query rows visited (B * T)
  int64_t repeated_max_rows = 0; // rows whose global max occurs more than once (r_s > 1, eps 0)
  int64_t pbar_one = 0;          // entries with bf16(P̄) == 1 beyond the first per row
  int64_t stable_pos = 0;        // stable: tiles where r_s > 1 and r_m > 0 (shift beta*r_m)
  int64_t stable_neg = 0;        // stable: tiles where r_s > 1 and r_m <= 0 (shift to 0)
  int64_t stable_guard = 0;      // stable: tiles where the guard clamped the shift
};

// Head dims the CUDA kernels are compiled for (the CPU emulation takes any): GPT-2 and Pythia
// 64, Llama 128, Phi 80, NeoX 96, Gemma 256, and 32. Which kernel variant serves which dim:
// kernels/cuda/attention_internal.cuh (dispatch_head_dim and the routing helpers beside it).
constexpr int kCudaHeadDims[] = {32, 64, 80, 96, 128, 256};
inline bool cuda_head_dim_supported(int dim) {
  for (int d : kCudaHeadDims) {
    if (d == dim) return true;
  }
  return false;
}

// One attention call: (B, H, T, D) row-major contiguous tensors, causal mask optional.
struct AttentionParams {
  int batch = 0, heads = 0, seq = 0, dim = 0;
  float scale = 0.0f;          // alpha, usually 1/sqrt(D)
  bool causal = true;
  bool naive = false;          // materialized S and softmax with the same rounding points
  int block_q = 64;            // query tile (CPU emulation); <= 0 or >= seq: one tile
  int block_k = 64;            // key tile; <= 0 or >= seq: tiling off
  const HeadFlags* flags = nullptr;  // `heads` entries, one per head
  HeadStats* stats = nullptr;        // optional, `heads` entries
  // Stochastic rounding's per-call key, sr_call_key(seed, step, micro-batch, layer)
  // (kernels/stochastic_round.h): read only by heads with an sr flag. Whoever replays a call
  // passes the same key and gets the same bits.
  uint64_t sr_key = 0;
};

}  // namespace rwd::kernels
