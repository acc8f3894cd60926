// FP64 reference attention (forward and backward) on the CPU: the ground truth every
// low-precision implementation is measured against. Straightforward materialized math.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_cpu.h"
#include "kernels/emulation_common.h"

namespace rwd::kernels {
namespace {

// Number of keys row r attends to.
int keys_of(const AttentionParams& p, int r) { return p.causal ? r + 1 : p.seq; }

double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_reference_forward(const AttentionParams& p, const double* q, const double* k,
                                 const double* v, double* o, double* lse) {
  if (p.batch <= 0 || p.heads <= 0 || p.seq <= 0 || p.dim <= 0)
    throw KernelError("reference attention: shape must be positive");
  const int t = p.seq, dd = p.dim;
  const double alpha = p.scale;
  detail::for_each_head(p, [&](int b, int h) {
    const size_t off = (static_cast<size_t>(b) * p.heads + h) * t * dd;
    const size_t off_row = (static_cast<size_t>(b) * p.heads + h) * t;
    std::vector<double> s(t);
    for (int r = 0; r < t; ++r) {
      const int n = keys_of(p, r);
      double m = -std::numeric_limits<double>::infinity();
      for (int c = 0; c < n; ++c) {
        s[c] = alpha * dot(q + off + static_cast<size_t>(r) * dd, k + off + static_cast<size_t>(c) * dd, dd);
        m = std::max(m, s[c]);
      }
      double l = 0.0;
      for (int c = 0; c < n; ++c) l += (s[c] = std::exp(s[c] - m));
      double* orow = o + off + static_cast<size_t>(r) * dd;
      for (int d = 0; d < dd; ++d) orow[d] = 0.0;
      for (int c = 0; c < n; ++c) {
        const double pc = s[c] / l;
        const double* vr = v + off + static_cast<size_t>(c) * dd;
        for (int d = 0; d < dd; ++d) orow[d] += pc * vr[d];
      }
      lse[off_row + r] = m + std::log(l);
    }
  });
}

void attention_reference_backward(const AttentionParams& p, const double* q, const double* k,
                                  const double* v, const double* o, const double* d_o,
                                  const double* lse, double* dq, double* dk, double* dv) {
  if (p.batch <= 0 || p.heads <= 0 || p.seq <= 0 || p.dim <= 0)
    throw KernelError("reference attention: shape must be positive");
  const int t = p.seq, dd = p.dim;
  const double alpha = p.scale;
  detail::for_each_head(p, [&](int b, int h) {
    const size_t off = (static_cast<size_t>(b) * p.heads + h) * t * dd;
    const size_t off_row = (static_cast<size_t>(b) * p.heads + h) * t;
    std::fill(dq + off, dq + off + static_cast<size_t>(t) * dd, 0.0);
    std::fill(dk + off, dk + off + static_cast<size_t>(t) * dd, 0.0);
    std::fill(dv + off, dv + off + static_cast<size_t>(t) * dd, 0.0);
    for (int r = 0; r < t; ++r) {
      const double* qr = q + off + static_cast<size_t>(r) * dd;
      const double* gr = d_o + off + static_cast<size_t>(r) * dd;
      const double delta = dot(gr, o + off + static_cast<size_t>(r) * dd, dd);
      for (int c = 0; c < keys_of(p, r); ++c) {
        const double* kc = k + off + static_cast<size_t>(c) * dd;
        const double* vc = v + off + static_cast<size_t>(c) * dd;
        const double pc = std::exp(alpha * dot(qr, kc, dd) - lse[off_row + r]);
        const double ds = pc * (dot(gr, vc, dd) - delta);
        for (int d = 0; d < dd; ++d) {
          dv[off + static_cast<size_t>(c) * dd + d] += pc * gr[d];
          dq[off + static_cast<size_t>(r) * dd + d] += alpha * ds * kc[d];
          dk[off + static_cast<size_t>(c) * dd + d] += alpha * ds * qr[d];
        }
      }
    }
  });
}

}  // namespace rwd::kernels
