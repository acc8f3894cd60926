// FP16 rounding and the compact FP16 flash / naive attention forward used by flash_deviation
// (experiment-local: kernels/ emulates BF16 only).
#include "experiments/flash_deviation/fp16_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/bf16.h"

namespace rwd::experiments {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kHalfMax = 65504.0f;
constexpr int kHalfMinQuantumExp = -24;  // spacing of FP16 subnormals: 2^-24
constexpr int kHalfMantBits = 10;

// Row r's scores against keys [0, r] in FP32: S = alpha * (sum_d q*k), d ascending.
void row_scores(const Fp16Head& h, int r, std::vector<float>& s) {
  s.assign(static_cast<size_t>(r) + 1, 0.0f);
  const float* qr = h.q + static_cast<size_t>(r) * h.dim;
  for (int j = 0; j <= r; ++j) {
    const float* kj = h.k + static_cast<size_t>(j) * h.dim;
    float acc = 0.0f;
    for (int d = 0; d < h.dim; ++d) acc += qr[d] * kj[d];
    s[j] = h.alpha * acc;
  }
}

void finish(const Fp16Head& h, const std::vector<float>& acc, float l, float* o, float* o_pre) {
  for (int d = 0; d < h.dim; ++d) {
    const float x = acc[d] / l;
    o_pre[d] = x;
    o[d] = round_fp16(x);
  }
}

// The papers' pure-PyTorch regime: the running O and l are held in FP16 after each update.
void round_accumulators(std::vector<float>& acc, float& l) {
  for (float& a : acc) a = round_fp16(a);
  l = round_fp16(l);
}

}  // namespace

float round_fp16(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  const float a = std::fabs(x);
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  // Spacing of FP16 values in a's binade: 2^(e-1-10), never below the subnormal spacing.
  const int qexp = std::max(e - 1 - kHalfMantBits, kHalfMinQuantumExp);
  // a / 2^qexp is exact (power-of-two scaling); nearbyint rounds to nearest even by default.
  const float r = std::ldexp(std::nearbyint(std::ldexp(a, -qexp)), qexp);
  if (r > kHalfMax) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return std::copysign(r, x);
}

const char* fp16_self_test() {
  struct Case {
    float in, out;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {1.0f, 1.0f},
      {0.1f, 0.0999755859375f},
      {1.0f + 0x1p-11f, 1.0f},                   // tie -> even (down)
      {1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f},     // tie -> even (up)
      {1.0f + 0x1p-11f + 0x1p-20f, 1.0f + 0x1p-10f},
      {65504.0f, 65504.0f},
      {65519.0f, 65504.0f},
      {65520.0f, inf},                           // tie above the max rounds to inf
      {-1.0e6f, -inf},
      {0x1p-14f, 0x1p-14f},                      // smallest normal
      {0x1p-24f, 0x1p-24f},                      // smallest subnormal
      {0x1p-25f, 0.0f},                          // tie -> even (0)
      {1.5f * 0x1p-25f, 0x1p-24f},
      {3 * 0x1p-25f, 2 * 0x1p-24f},              // 1.5 quanta: tie -> even (2)
      {1.0e-10f, 0.0f},
      {-5.9604645e-08f, -0x1p-24f},
      {1000.3f, 1000.5f},                        // spacing 0.5 in [512, 1024)
      {2049.0f, 2048.0f},                        // spacing 2 in [2048, 4096): tie -> even
      {2051.0f, 2052.0f},
  };
  for (const Case& c : cases)
    if (float_bits(round_fp16(c.in)) != float_bits(c.out)) return "a known FP16 value rounds wrongly";
  if (!std::isnan(round_fp16(std::nanf("")))) return "NaN does not stay NaN";
#ifdef __FLT16_MAX__
  uint64_t s = 12345;
  for (int i = 0; i < 2000000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = static_cast<uint32_t>(s >> 32);
    // Focus on the FP16 range and its edges: exponents 2^-30 .. 2^17.
    u = (u & 0x807fffffu) | ((97u + (u >> 23) % 48u) << 23);
    float x;
    std::memcpy(&x, &u, sizeof x);
    const float ref = static_cast<float>(static_cast<_Float16>(x));
    if (float_bits(round_fp16(x)) != float_bits(ref)) return "round_fp16 differs from _Float16";
  }
#endif
  return "";
}

void fp16_flash_forward(const Fp16Head& h, int tile, bool acc_fp16, float* o, float* o_pre) {
  std::vector<float> s, acc(h.dim);
  for (int r = 0; r < h.t; ++r) {
    row_scores(h, r, s);
    const int n_keys = r + 1;  // causal
    float m = kNegInf, l = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int c0 = 0; c0 < n_keys; c0 += tile) {
      const int c1 = std::min(n_keys, c0 + tile);
      float r_m = kNegInf;
      for (int j = c0; j < c1; ++j) r_m = std::max(r_m, s[j]);
      const float m_new = std::max(m, r_m);
      const float scale = m == kNegInf ? 0.0f : std::exp(m - m_new);
      m = m_new;
      float lf = scale * l;
      for (int j = c0; j < c1; ++j) lf += std::exp(s[j] - m_new);
      l = lf;
      for (int d = 0; d < h.dim; ++d) acc[d] *= scale;
      for (int j = c0; j < c1; ++j) {
        const float pj = round_fp16(std::exp(s[j] - m_new));
        const float* vr = h.v + static_cast<size_t>(j) * h.dim;
        for (int d = 0; d < h.dim; ++d) acc[d] += pj * vr[d];
      }
      if (acc_fp16) round_accumulators(acc, l);
    }
    finish(h, acc, l, o + static_cast<size_t>(r) * h.dim, o_pre + static_cast<size_t>(r) * h.dim);
  }
}

void fp16_naive_forward(const Fp16Head& h, bool acc_fp16, float* o, float* o_pre) {
  std::vector<float> s, p, acc(h.dim);
  for (int r = 0; r < h.t; ++r) {
    row_scores(h, r, s);
    const int n_keys = r + 1;
    const float m = *std::max_element(s.begin(), s.end());
    p.resize(n_keys);
    float l = 0.0f;
    for (int j = 0; j < n_keys; ++j) {
      p[j] = std::exp(s[j] - m);
      l += p[j];
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int j = 0; j < n_keys; ++j) {
      const float pj = round_fp16(p[j]);
      const float* vr = h.v + static_cast<size_t>(j) * h.dim;
      for (int d = 0; d < h.dim; ++d) acc[d] += pj * vr[d];
    }
    if (acc_fp16) round_accumulators(acc, l);
    finish(h, acc, l, o + static_cast<size_t>(r) * h.dim, o_pre + static_cast<size_t>(r) * h.dim);
  }
}

}  // namespace rwd::experiments
