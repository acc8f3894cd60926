// The FP32 GEMMs of promoted linears and LM head (plan `qkv`/`proj`/`mlp`/`head=fp32`, and a
// low linear fed FP32 values by a promoted producer) on a GPU: 3xTF32, three TF32 tensor-core
// GEMMs of exactly split operands, or cuBLAS's FP32 (SIMT) GEMM as before numerics 4.
#pragma once

#include <torch/types.h>

#include <utility>

namespace rwd::train {

// kSplitTf32: a = a_hi + a_lo, b = b_hi + b_lo (kernels/cuda/tf32_split.h), C = a_hi b_hi +
// (a_hi b_lo + a_lo b_hi), each a TF32 GEMM with FP32 accumulation; the two small products are
// summed into one tensor first and added to the big one once, in its epilogue (beta = 1).
// kSimt: cuBLAS's FP32 GEMM with TF32 off (numerics 3 and before). The CPU always runs
// LibTorch's FP32 GEMM; this only chooses the GPU's.
enum class Fp32Gemm { kSplitTf32, kSimt };

// Process-wide. Starts as REWIND_FP32_GEMM says (`simt` or `3xtf32`; unset: simt). 3xTF32 is
// opt-in: on an H200 its tensor-core sums of cancelling inputs err up to 28x more than the FP32
// GEMM (fp32_gemm_test prints it), outside the FP32 accuracy contract; it cuts an `all=fp32`
// step from 165 ms to 121 ms on an H200, where the default step takes 20-22 ms
// (experiments/gpu_bench/README.md).
Fp32Gemm fp32_gemm();
void set_fp32_gemm(Fp32Gemm g);
// Whether REWIND_FP32_GEMM is set: then a replay keeps it even where the recorded numerics
// name the other GEMM (a run whose meta records the other is refused before: run_spec.h).
bool fp32_gemm_from_env();

// Whether an FP32 GEMM over tensors on t's device runs split: CUDA and kSplitTf32.
bool split_fp32_gemm(const torch::Tensor& t);

// {hi, lo} of a FP32 tensor, both exact in TF32, hi + lo = x up to 2^-22 |x| (the GPU kernel, or
// its CPU twin on the CPU); contiguous, x's shape.
std::pair<torch::Tensor, torch::Tensor> split_tf32(const torch::Tensor& x);

// An operand of split_tf32_mm: hi and lo of split_tf32, or (x, undefined) for an operand the
// caller knows to hold TF32-exact values (BF16 values are): its low part is zero and the
// products with it are skipped. Split once, it serves several GEMMs (dX and dW share g).
struct Tf32Parts {
  torch::Tensor hi, lo;
  Tf32Parts t() const { return {hi.t(), lo.defined() ? lo.t() : lo}; }
};
// x 2-D FP32; a transposed view stays one (split in memory order).
Tf32Parts tf32_parts(const torch::Tensor& x, bool exact);

// a (M, K) x b (K, N) -> (M, N) FP32 by the split products above (any device: on the CPU the
// same products in LibTorch's FP32 GEMM, for tests; both exact: one GEMM). Deterministic: a
// fixed split and sequence of GEMMs, each in cuBLAS's fixed reduction order for a fixed shape
// and device (setup_device fixes the workspace; cuBLAS uses no atomics here).
torch::Tensor split_tf32_mm(const Tf32Parts& a, const Tf32Parts& b);
torch::Tensor split_tf32_mm(const torch::Tensor& a, const torch::Tensor& b, bool a_exact, bool b_exact);

}  // namespace rwd::train
