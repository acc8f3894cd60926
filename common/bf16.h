// FP32 bit casts and the FP32 <-> BF16 conversions shared by the kernels (rounding emulation)
// and the store (export, tests). Header-only, no dependencies.
#pragma once

#include <cstdint>
#include <cstring>

namespace rwd {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even on the 16 dropped bits: add 0x7fff plus the kept LSB, then truncate.
// Overflow past the largest finite BF16 correctly becomes +-inf. NaN keeps its sign and top
// payload bits and is forced quiet so that truncation can never turn it into an infinity.
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

// Exact: the 16 BF16 bits are the top half of the FP32 bit pattern.
inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace rwd
