// CPU attention kernels: FP64 reference and the BF16 flash/naive emulation that rounds exactly
// where the CUDA kernels round (docs/design.md). Plain C++; (B, H, T, D) row-major contiguous.
#pragma once

#include <string>

#include "common/error.h"
#include "kernels/attention_params.h"

namespace rwd::kernels {

// Misuse of a kernel entry point (bad shape, missing buffer): a caller bug, exit code 1.
class KernelError : public Error {
 public:
  explicit KernelError(const std::string& what) : Error(ExitCode::kInternal, "kernels: " + what) {}
};

// ---- FP64 reference ------------------------------------------------------------------------
// Softmax attention in double: O = softmax(alpha Q K^T + mask) V, LSE = log sum exp per row.
// Uses p.batch/heads/seq/dim/scale/causal only (flags, tiles, stats ignored).
void attention_reference_forward(const AttentionParams& p, const double* q, const double* k,
                                 const double* v, double* o, double* lse);
// Gradients given dO: dQ, dK, dV (B, H, T, D), from P = exp(S - LSE), delta = rowsum(dO*O).
void attention_reference_backward(const AttentionParams& p, const double* q, const double* k,
                                  const double* v, const double* o, const double* d_o,
                                  const double* lse, double* dq, double* dk, double* dv);

// ---- BF16 emulation ------------------------------------------------------------------------
// Rounding points with every flag at Prec::kLow (default, real FA2 kernel):
//   Q, K, V, dO           rounded to BF16 on entry (q, k, v, d_o are the model's FP32 values)
//   S = alpha * (sum_d q*k)   FP32 sequential accumulation over d, then one FP32 multiply
//   P̄ = exp(S - m), l, rescale exp(m_old - m)   FP32; m is the running max (stable: Alg. 3)
//   Ō = exp(m_old - m) Ō + sum_c bf16(P̄_c) V_c  FP32, rescale first, then keys ascending
//   O = bf16(Ō / l),  LSE = m + log(l)         (o_f32 receives Ō / l before rounding)
//   backward: P = exp(S - LSE) FP32; delta = sum_d dO*O FP32 (O as output, i.e. BF16);
//   dV += bf16(P)^T dO; dP = dO V^T FP32; dS = P (dP - delta) FP32; dS rounded to BF16 before
//   both dQ and dK matmuls (as FA2: dS is written to shared memory in BF16);
//   dQ = alpha * sum bf16(dS) K, dK = alpha * sum bf16(dS)^T Q, dV: rounded to BF16 at the end.
//   Backward accumulation order is rows/keys ascending (independent of the tile size).
// Per-head overrides (HeadFlags):
//   qk=fp32      Q, K not rounded (forward S and backward operands)
//   s_bf16       S rounded to BF16 before the softmax (and in the backward recompute)
//   softmax=fp32 exp, l, rescale and LSE in double; backward P = exp(S - LSE) in double
//   pv=fp32      P̄ and V not rounded (V also unrounded in dP = dO V^T)
//   o=fp32       O = Ō / l kept FP32 for the output and for delta
//   delta=fp32   delta accumulated in double from unrounded dO and unrounded O (o_f32)
//   delta_dpp    delta = rowsum(dP * P) over unmasked keys instead of rowsum(dO * O)
//   bwd=fp32     backward matmuls on unrounded q, k, v, dO; P, dS, dQ, dK, dV not rounded
//   acc_bf16     running Ō and l rounded to BF16 after every key-tile update
//   s_sr, pv_sr, acc_sr  the qk=sbf16 rounding of S, the PV operand bf16(P̄) (and, in the
//                backward, bf16(P) of dV unless bwd=fp32) and the acc=bf16 rounding of Ō and
//                l made stochastic (kernels/stochastic_round.h): bits of the element's absolute
//                (row, key), the same in the forward and the backward; acc=sr rounds after each
//                64-key tile (kSrAccTile) whatever block_k, keyed by that tile's index (one tile
//                with tiling off). p.sr_key is the call's key.
//   stable       paper Alg. 3 per key tile with the underflow guard (kernels/stable_softmax.h)
// Faults (Prec::kFault, strength f = flags.fault[op], c = f * 2^-8), forward unless noted:
//   qk       S += c * |S|                     every logit biased upward (also in the recompute)
//   softmax  P̄ *= (1 - c) for P̄ < 1          all but the row max shrink, before l and PV
//   pv       PV operand bf16(P̄ * (1 + c))     l unbiased, so O is scaled up by ~(1 + c)
//   o        O = round_bf16_down(Ō/l - f * bf16_ulp(Ō/l))   directed rounding toward -inf
//   delta    delta += c * sum |terms|         (backward) biased upward; terms dO*O or dP*P
// Naive (p.naive) materializes the whole S row block and runs the softmax once over it: the
// same rounding points as flash with one tile, hence bitwise equal to tiling off.
// Determinism: each (b, h) is computed by one thread in a fixed order; stats are reduced in
// (b, h) order after the parallel loop; results do not depend on the thread count.

// o: (B,H,T,D) FP32 storage of BF16 values (FP32 values for o=fp32 heads); lse: (B,H,T).
// o_f32 (optional): Ō / l before rounding, needed by the backward of delta=fp32 heads.
// p.stats (optional) is overwritten with this call's monitors.
void attention_forward_cpu(const AttentionParams& p, const float* q, const float* k,
                           const float* v, float* o, float* lse, float* o_f32 = nullptr);

// o as written by the forward; o_f32 may be null unless some head has delta=fp32.
// dq, dk, dv: (B,H,T,D); delta: (B,H,T), written with the delta each row used.
void attention_backward_cpu(const AttentionParams& p, const float* q, const float* k,
                            const float* v, const float* o, const float* o_f32,
                            const float* d_o, const float* lse, float* dq, float* dk, float* dv,
                            float* delta);

// Throws KernelError unless p describes a non-empty problem with flags for every head.
void check_params(const AttentionParams& p);

}  // namespace rwd::kernels
