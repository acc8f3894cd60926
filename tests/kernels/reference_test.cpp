// FP64 reference: gradients match central finite differences of L = sum(dO * O), causal and
// not; rows sum to one (O of constant V equals V); LSE matches a direct log-sum-exp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/test_util.h"

namespace rwd::kernels {
namespace {

using test::make_problem;
using test::Problem;

double loss(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& g) {
  std::vector<double> o(pr.n()), lse(pr.rows());
  attention_reference_forward(pr.p, q.data(), k.data(), v.data(), o.data(), lse.data());
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * g[i];
  return s;
}

void check_gradients(bool causal) {
  Problem pr = make_problem(2, 2, 5, 3, 11, 1.5f, causal);
  auto wide = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  std::vector<double> q = wide(pr.q), k = wide(pr.k), v = wide(pr.v), g = wide(pr.d_o);
  test::Reference ref = test::run_reference(pr);
  // Central differences have O(h^2) truncation and O(eps/h) cancellation error; h = 1e-5
  // balances them at ~1e-10 for these O(1) quantities, so 1e-7 leaves a wide margin.
  const double h = 1e-5, tol = 1e-7;
  std::vector<double>* inputs[3] = {&q, &k, &v};
  const std::vector<double>* grads[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int which = 0; which < 3; ++which) {
    std::vector<double>& x = *inputs[which];
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + h;
      const double up = loss(pr, q, k, v, g);
      x[i] = keep - h;
      const double down = loss(pr, q, k, v, g);
      x[i] = keep;
      EXPECT_NEAR((up - down) / (2 * h), (*grads[which])[i], tol) << "input " << which << " elem " << i;
    }
  }
}

TEST(Reference, GradientsMatchFiniteDifferencesCausal) { check_gradients(true); }
TEST(Reference, GradientsMatchFiniteDifferencesFull) { check_gradients(false); }

TEST(Reference, ForwardIsAConvexCombinationAndLseIsLogSumExp) {
  Problem pr = make_problem(1, 1, 7, 4, 3, 2.0f, true);
  std::vector<double> q(pr.q.begin(), pr.q.end()), k(pr.k.begin(), pr.k.end());
  std::vector<double> v(pr.n(), 0.0);
  for (int r = 0; r < pr.p.seq; ++r)
    for (int d = 0; d < pr.p.dim; ++d) v[r * pr.p.dim + d] = d + 1.0;  // every row (1,2,3,4)
  std::vector<double> o(pr.n()), lse(pr.rows());
  attention_reference_forward(pr.p, q.data(), k.data(), v.data(), o.data(), lse.data());
  for (int r = 0; r < pr.p.seq; ++r) {
    for (int d = 0; d < pr.p.dim; ++d) EXPECT_NEAR(o[r * pr.p.dim + d], d + 1.0, 1e-14);
    double sum = 0.0;
    for (int c = 0; c <= r; ++c) {
      double s = 0.0;
      for (int d = 0; d < pr.p.dim; ++d) s += q[r * pr.p.dim + d] * k[c * pr.p.dim + d];
      sum += std::exp(pr.p.scale * s);
    }
    EXPECT_NEAR(lse[r], std::log(sum), 1e-13);
  }
}

}  // namespace
}  // namespace rwd::kernels
