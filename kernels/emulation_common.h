// Internals shared by the CPU forward and backward emulation: per-head operand copies with the
// head's rounding applied, the S tile computation (qk op), fault constants, parallel loop.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/bf16.h"
#include "kernels/stochastic_round.h"

namespace rwd::kernels::detail {

// Faults are relative biases of c = strength * 2^-8 (one BF16 ulp at 1.0 per unit strength).
constexpr float kFaultUnit = 1.0f / 256.0f;

inline bool is(const HeadFlags& f, Op op, Prec pr) { return f.prec[static_cast<int>(op)] == pr; }
inline float fault_c(const HeadFlags& f, Op op) {
  return f.fault[static_cast<int>(op)] * kFaultUnit;
}

// Number of tiles / tile extent; <= 0 or >= seq means one tile (tiling off).
inline int tile_size(int block, int seq) { return (block <= 0 || block >= seq) ? seq : block; }

// Copy one (T, D) slice, rounding to BF16 unless `keep` (the op is promoted to FP32).
inline void load_rounded(const float* src, int t, int d, bool keep, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(t) * d);
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = keep ? src[i] : round_bf16(src[i]);
}

// (T, D) -> (D, T), so that dot products over d vectorize over the key index while every
// output element still accumulates in d-ascending order (identical numerics to a plain dot).
inline std::vector<float> transpose(const std::vector<float>& x, int t, int d) {
  std::vector<float> y(static_cast<size_t>(t) * d);
  for (int r = 0; r < t; ++r)
    for (int c = 0; c < d; ++c) y[static_cast<size_t>(c) * t + r] = x[static_cast<size_t>(r) * d + c];
  return y;
}

// The S operands of one (b, h): Q (T, D) and K^T (D, T), rounded per the qk op.
struct ScoreOperands {
  std::vector<float> q, kt;
  int seq = 0, dim = 0;
  float alpha = 0.0f;
  bool causal = true;
  const HeadFlags* flags = nullptr;
  uint64_t sr_qk = 0;  // qk=sr: the stream of S's random bits (kernels/stochastic_round.h)
};

// q, k point at head (b, h)'s (T, D) slices.
inline ScoreOperands load_score_operands(const AttentionParams& p, const HeadFlags& f, int b, int h,
                                         const float* q, const float* k) {
  ScoreOperands s;
  s.seq = p.seq;
  s.dim = p.dim;
  s.alpha = p.scale;
  s.causal = p.causal;
  s.flags = &f;
  s.sr_qk = sr_stream(p.sr_key, SrSite::kQk, b, h);
  bool keep = is(f, Op::kQk, Prec::kFp32);
  load_rounded(q, p.seq, p.dim, keep, s.q);
  std::vector<float> kr;
  load_rounded(k, p.seq, p.dim, keep, kr);
  s.kt = transpose(kr, p.seq, p.dim);
  return s;
}

// Unmasked key count of row r within [c0, c1): causal keeps keys c <= r.
inline int unmasked(const ScoreOperands& s, int r, int c0, int c1) {
  int end = s.causal ? std::min(c1, r + 1) : c1;
  return std::max(0, end - c0);
}

// S tile rows [r0, r1) x keys [c0, c1) into s (row stride `ld` >= c1 - c0). Masked entries are left
// untouched: callers only read the first unmasked(r, c0, c1) entries of each row.
// S = alpha * acc with acc accumulated in FP32 over d ascending; then the qk fault, then the
// s_bf16 rounding (qk=sbf16 regime) or its stochastic twin (qk=sr; bits of (row, key), so the
// backward's recompute rounds each S as the forward did).
inline void compute_scores(const ScoreOperands& so, int r0, int r1, int c0, int c1, float* s,
                           int ld) {
  const int d_dim = so.dim, t = so.seq;
  const HeadFlags& f = *so.flags;
  const bool fault = is(f, Op::kQk, Prec::kFault);
  const float c = fault_c(f, Op::kQk);
  for (int r = r0; r < r1; ++r) {
    const int n = unmasked(so, r, c0, c1);
    float* row = s + static_cast<size_t>(r - r0) * ld;
    for (int j = 0; j < n; ++j) row[j] = 0.0f;
    const float* qr = so.q.data() + static_cast<size_t>(r) * d_dim;
    for (int d = 0; d < d_dim; ++d) {
      const float qv = qr[d];
      const float* kd = so.kt.data() + static_cast<size_t>(d) * t + c0;
      for (int j = 0; j < n; ++j) row[j] += qv * kd[j];
    }
    const uint32_t rw = f.s_sr ? sr_row_word(so.sr_qk, r) : 0;
    for (int j = 0; j < n; ++j) {
      float x = so.alpha * row[j];
      if (fault) x += c * std::fabs(x);
      if (f.s_bf16) x = round_bf16(x);
      if (f.s_sr) {
        const uint32_t col = static_cast<uint32_t>(c0 + j);
        x = round_bf16_sr(x, sr_bits_in_row(so.sr_qk, rw, col));
      }
      row[j] = x;
    }
  }
}

// Runs fn(b, h) for every (batch, head); each pair runs entirely on one thread, so the result
// is independent of the thread count and of scheduling.
template <class Fn>
void for_each_head(const AttentionParams& p, Fn fn) {
  const int64_t n = static_cast<int64_t>(p.batch) * p.heads;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) fn(static_cast<int>(i / p.heads), static_cast<int>(i % p.heads));
}

}  // namespace rwd::kernels::detail
