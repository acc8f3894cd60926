// Exact split-BF16 arithmetic for FP32-faithful heads on the tensor cores: an FP32 value is the
// sum of three BF16 terms, and a product of two such sums keeps the six terms above 2^-24.
#pragma once

#include "kernels/cuda/attention_common.cuh"

namespace rwd::kernels::cuda {

// x = x0 + x1 + x2 exactly, each term BF16 (rounded to nearest): x - x0 and x - x0 - x1 are
// exact in FP32 (RN residuals of an 8-bit rounding), and the last residual has at most 8
// significant bits, so x2 loses nothing unless it falls below 2^-126 (x below ~2^-110).
// |x1| <= 2^-8 |x|, |x2| <= 2^-16 |x|.
struct Split3 {
  float x0, x1, x2;
};
__device__ __forceinline__ Split3 split3(float x) {
  const float x0 = round_bf16(x);
  const float r = __fsub_rn(x, x0);
  const float x1 = round_bf16(r);
  return {x0, x1, round_bf16(__fsub_rn(r, x1))};
}

// exp(s - m) for softmax=fp32 as accurate as the CPU twin's float(exp(double(s) - m)) to an
// ulp or two, on the FP32 pipe: s - m = t + e exactly (TwoSum), exp(t + e) = expf(t) (1 + e)
// (|e| <= 2^-24 |t|, so the dropped e^2 / 2 is far below an ulp). A double exp per score cost
// as much as the six tensor-core products.
__device__ __forceinline__ float exp_diff_accurate(float s, float m) {
  // TwoSum(s, -m): t = fl(s - m), e = (s - m) - t exactly.
  const float t = __fsub_rn(s, m);
  const float bv = __fsub_rn(t, s);   // the part of t that came from -m
  const float av = __fsub_rn(t, bv);  // the part that came from s
  const float e = __fsub_rn(__fsub_rn(s, av), __fadd_rn(m, bv));
  const float x = expf(t);
  return s == -INFINITY ? 0.0f : __fmaf_rn(x, e, x);
}

// lo[n] += the five small terms of (a0 + a1 + a2)(b0 + b1 + b2): a_i b_j with 1 <= i + j <= 2,
// smallest first (the caller adds a0 b0 into its own accumulator). The dropped terms a1 b2,
// a2 b1, a2 b2 are below 2^-23 |a||b| together, an FP32 product's rounding. b[i] holds plane i
// of two n8 blocks as one ldmatrix_x4 loads them: registers (0, 1) feed lo[0], (2, 3) lo[1].
__device__ __forceinline__ void mma_split_lo(float (&lo)[2][4], const uint32_t (&a0)[4],
                                             const uint32_t (&a1)[4], const uint32_t (&a2)[4],
                                             const uint32_t (&b)[3][4]) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    mma_bf16(lo[n], a2, b[0][2 * n], b[0][2 * n + 1]);
    mma_bf16(lo[n], a0, b[2][2 * n], b[2][2 * n + 1]);
    mma_bf16(lo[n], a1, b[1][2 * n], b[1][2 * n + 1]);
    mma_bf16(lo[n], a1, b[0][2 * n], b[0][2 * n + 1]);
    mma_bf16(lo[n], a0, b[1][2 * n], b[1][2 * n + 1]);
  }
}

// lo[n] += the small terms of (a0 + a1 + a2)(b0 + b1 + b2) where an operand without planes
// (a3 / b3 false) is its plane 0 alone: the terms a_i b_j with 1 <= i + j <= 2 that exist,
// smallest first (mma_split_lo with optional planes; the caller adds a0 b0).
__device__ __forceinline__ void mma_planes_lo(float (&lo)[2][4], const uint32_t (&a)[3][4],
                                              const uint32_t (&b)[3][4], bool a3, bool b3) {
  if (a3 && b3) {
    mma_split_lo(lo, a[0], a[1], a[2], b);
    return;
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    if (a3) mma_bf16(lo[n], a[2], b[0][2 * n], b[0][2 * n + 1]);
    if (b3) mma_bf16(lo[n], a[0], b[2][2 * n], b[2][2 * n + 1]);
    if (a3) mma_bf16(lo[n], a[1], b[0][2 * n], b[0][2 * n + 1]);
    if (b3) mma_bf16(lo[n], a[0], b[1][2 * n], b[1][2 * n + 1]);
  }
}

}  // namespace rwd::kernels::cuda
