// Shared helpers for the kernel tests: random problems, running the emulation and the FP64
// reference on them, and error metrics. Plain C++ (no LibTorch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention_cpu.h"

namespace rwd::kernels::test {

// One attention problem: (B, H, T, D) inputs plus the upstream gradient.
struct Problem {
  AttentionParams p;
  std::vector<HeadFlags> flags;
  std::vector<float> q, k, v, d_o;
  size_t n() const { return static_cast<size_t>(p.batch) * p.heads * p.seq * p.dim; }
  size_t rows() const { return static_cast<size_t>(p.batch) * p.heads * p.seq; }
};

// Standard-normal q, k (times qk_scale), v and dO from a fixed seed.
inline Problem make_problem(int b, int h, int t, int d, uint32_t seed, float qk_scale = 1.0f,
                            bool causal = true, int block_q = 64, int block_k = 64) {
  Problem pr;
  pr.p.batch = b;
  pr.p.heads = h;
  pr.p.seq = t;
  pr.p.dim = d;
  pr.p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  pr.p.causal = causal;
  pr.p.block_q = block_q;
  pr.p.block_k = block_k;
  pr.flags.assign(h, HeadFlags{});
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, float s) {
    x.resize(pr.n());
    for (auto& e : x) e = s * nd(rng);
  };
  fill(pr.q, qk_scale);
  fill(pr.k, qk_scale);
  fill(pr.v, 1.0f);
  fill(pr.d_o, 1.0f);
  return pr;
}

struct Result {
  std::vector<float> o, lse, o_f32, dq, dk, dv, delta;
  std::vector<HeadStats> stats;
};

inline Result run_emulation(const Problem& pr) {
  Result r;
  AttentionParams p = pr.p;
  p.flags = pr.flags.data();
  r.stats.resize(p.heads);
  p.stats = r.stats.data();
  r.o.resize(pr.n());
  r.o_f32.resize(pr.n());
  r.lse.resize(pr.rows());
  attention_forward_cpu(p, pr.q.data(), pr.k.data(), pr.v.data(), r.o.data(), r.lse.data(),
                        r.o_f32.data());
  r.dq.resize(pr.n());
  r.dk.resize(pr.n());
  r.dv.resize(pr.n());
  r.delta.resize(pr.rows());
  attention_backward_cpu(p, pr.q.data(), pr.k.data(), pr.v.data(), r.o.data(), r.o_f32.data(),
                         pr.d_o.data(), r.lse.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                         r.delta.data());
  return r;
}

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

// FP64 reference on the problem's exact FP32 inputs.
inline Reference run_reference(const Problem& pr) {
  auto wide = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  std::vector<double> q = wide(pr.q), k = wide(pr.k), v = wide(pr.v), g = wide(pr.d_o);
  Reference r;
  r.o.resize(pr.n());
  r.lse.resize(pr.rows());
  attention_reference_forward(pr.p, q.data(), k.data(), v.data(), r.o.data(), r.lse.data());
  r.dq.resize(pr.n());
  r.dk.resize(pr.n());
  r.dv.resize(pr.n());
  attention_reference_backward(pr.p, q.data(), k.data(), v.data(), r.o.data(), g.data(),
                               r.lse.data(), r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

template <class A>
double max_abs(const std::vector<A>& a) {
  double m = 0.0;
  for (const auto& x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Elements [h*T*D .. ) of head h in every batch, flattened: compares one head's slice.
inline std::vector<float> head_slice(const std::vector<float>& x, const Problem& pr, int h,
                                     bool per_row) {
  const size_t w = per_row ? pr.p.seq : static_cast<size_t>(pr.p.seq) * pr.p.dim;
  std::vector<float> out;
  for (int b = 0; b < pr.p.batch; ++b) {
    const size_t off = (static_cast<size_t>(b) * pr.p.heads + h) * w;
    out.insert(out.end(), x.begin() + off, x.begin() + off + w);
  }
  return out;
}

}  // namespace rwd::kernels::test
