// Paper Alg. 3 (stabilized softmax) per key tile, with rewind's underflow guard. Header-only
// and templated on the logit type so tests can check the rule in double arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace rwd::kernels {

// Guard rule (docs/design.md, the stabilized softmax's underflow guard). When a tile row has a repeated max (r_s > 1)
// Alg. 3 picks m' = beta * r_m (r_m > 0) or m' = 0 (r_m <= 0); the shift d = m' - r_m is then
// clamped into [kStableMinShift, kStableMaxShift] and m' = r_m + d.
//  - d >= 2^-8: the tied entries get P̄ = exp(-d) <= exp(-2^-8) = 0.99610 in FP32, below the
//    BF16 rounding midpoint 1 - 2^-9 between 1 - 2^-8 and 1.0, so bf16(P̄) = 1 - 2^-8 < 1.
//    (Without it r_m = 0 or r_m just below 0 would give d ~ 0 and P̄ = 1 again.)
//  - d <= 16: the row's largest P̄ is >= exp(-16) = 1.1e-7, far above the FP32 normal range
//    limit exp(-87), so l >= exp(-16) > 0 and neither O = Ō / l nor LSE = m + log l can become
//    NaN/Inf (the literal rule gives m' = 0 for r_m = -100, every exp underflows and l = 0).
// Exact-arithmetic results are unchanged by any m, so the guard only changes rounding.
constexpr float kStableMinShift = 1.0f / 256.0f;
constexpr float kStableMaxShift = 16.0f;

struct StableShift {
  float m = 0.0f;      // the tile's contribution to the running max
  bool pos = false;    // r_s > 1 and r_m > 0
  bool neg = false;    // r_s > 1 and r_m <= 0
  bool guard = false;  // the shift was clamped
};

// r_m: max over the tile row's unmasked logits; r_s: how many unmasked logits are >= r_m - eps.
// Only unmasked entries may be counted by the caller, so fully masked rows never get here.
template <class T>
StableShift stable_shift(T r_m, int64_t r_s, float beta) {
  StableShift s;
  s.m = static_cast<float>(r_m);
  if (r_s <= 1) return s;
  T target;
  if (r_m > 0) {
    s.pos = true;
    target = static_cast<T>(beta) * r_m;
  } else {
    s.neg = true;
    target = 0;
  }
  T d = target - r_m;
  if (!(d >= static_cast<T>(kStableMinShift))) {  // also catches beta <= 1 and NaN
    d = static_cast<T>(kStableMinShift);
    s.guard = true;
  } else if (d > static_cast<T>(kStableMaxShift)) {
    d = static_cast<T>(kStableMaxShift);
    s.guard = true;
  }
  float m = static_cast<float>(r_m + d);
  // For |r_m| >= 2^15 the FP32 sum can round back onto r_m; step up until the shift holds.
  while (static_cast<T>(m) - r_m < static_cast<T>(kStableMinShift) && std::isfinite(m))
    m = std::nextafter(m, std::numeric_limits<float>::infinity());
  s.m = m;
  return s;
}

}  // namespace rwd::kernels
