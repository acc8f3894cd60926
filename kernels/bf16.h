// BF16 helpers for the CPU emulation: round-to-nearest-even FP32 -> BF16 (NaN preserved),
// BF16 -> FP32, directed rounding toward -inf (fault injection) and the BF16 ulp. Header-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/bf16.h"

namespace rwd::kernels {

using rwd::bf16_bits_to_float;
using rwd::bits_float;
using rwd::float_bits;
using rwd::float_to_bf16_bits;

// The FP32 value of bf16(x): what a BF16 tensor stores, kept in FP32 storage.
inline float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

// Directed rounding toward -inf: positive values truncate, negative values with dropped bits
// step one BF16 ulp away from zero (-max_bf16 minus anything steps to -inf, as IEEE rounding
// down does). Used only by Prec::kFault of the `o` op.
inline uint16_t float_to_bf16_bits_down(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint16_t hi = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return hi;
  return (u >> 31) ? static_cast<uint16_t>(hi + 1) : hi;
}

inline float round_bf16_down(float x) { return bf16_bits_to_float(float_to_bf16_bits_down(x)); }

// Spacing of BF16 values at bf16(x) (7 fraction bits): 2^(e-7) for a normal value of binary
// exponent e, 2^-133 for zero and subnormals. Infinite/NaN inputs return NaN.
inline float bf16_ulp(float x) {
  uint32_t e = (float_to_bf16_bits(x) >> 7) & 0xffu;
  if (e == 0xffu) return std::nanf("");
  if (e == 0) return std::ldexp(1.0f, -133);
  return std::ldexp(1.0f, static_cast<int>(e) - 127 - 7);
}

}  // namespace rwd::kernels
