// The exact split of FP32 values into two TF32 terms for the 3xTF32 GEMMs of the promoted
// linears (train/fp32_gemm.cpp): x = hi + lo + r, hi = x rounded to TF32 (10 mantissa bits,
// nearest, ties to even, by bit arithmetic), lo = x - hi (exact in FP32) rounded to TF32 the
// same way, |r| <= 2^-11 |lo| <= 2^-22 |x|. Both terms are exact in TF32, so a TF32 GEMM reads
// them unchanged whether the hardware truncates or rounds its inputs. Plain C++ header, no
// LibTorch; tf32_round / tf32_split_one are the kernel's own code, compiled for the CPU too
// (its twin, bit for bit).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hash.h"  // RWD_HOST_DEVICE

namespace rwd::kernels::cuda {

// x rounded to the nearest TF32 value (ties to even), returned as FP32. Inf and NaN pass
// through; a value that would round past the largest finite FP32 is truncated instead (it
// stays finite, and lo keeps the rest exactly).
RWD_HOST_DEVICE inline float tf32_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  uint32_t r = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  if ((r & 0x7f800000u) == 0x7f800000u) r = u & ~0x1fffu;
  float y;
  std::memcpy(&y, &r, 4);
  return y;
}

// hi = tf32_round(x), lo = tf32_round(x - hi); an infinite or NaN x gives (x, 0).
RWD_HOST_DEVICE inline void tf32_split_one(float x, float& hi, float& lo) {
  hi = tf32_round(x);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  lo = (u & 0x7f800000u) == 0x7f800000u ? 0.f : tf32_round(x - hi);
}

// hi[i], lo[i] of x[i] for i < n (device pointers; hi and lo must not overlap x). One read and
// two writes per element; no reduction, so trivially deterministic. Returns 0 or a cudaError_t.
int tf32_split(const float* x, int64_t n, float* hi, float* lo, void* stream);

}  // namespace rwd::kernels::cuda
