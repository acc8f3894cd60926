// Stabilized softmax (paper Alg. 3 + rewind's guard): exact-arithmetic equivalence, P̄ < 1
// for repeated maxima, untouched rows without repeats, masked entries never counted, and
// finite results for repeated maxima of +-100 and +-1000.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/stable_softmax.h"
#include "tests/kernels/test_util.h"

namespace rwd::kernels {
namespace {

using test::bitwise_equal;
using test::Problem;
using test::Result;

// Softmax of a row in double with the given max shift m.
std::vector<double> softmax_with(const std::vector<double>& s, double m) {
  double l = 0.0;
  std::vector<double> p(s.size());
  for (size_t i = 0; i < s.size(); ++i) l += (p[i] = std::exp(s[i] - m));
  for (auto& x : p) x /= l;
  return p;
}

const double kMaxima[] = {100.0, -100.0, 1000.0, -1000.0, 3.0, -3.0, 0.0, 1e-3, -1e-3, 40000.0};

TEST(StableSoftmax, ShiftIsExactInDoubleArithmetic) {
  for (double top : kMaxima) {
    std::vector<double> s = {top, top - 0.5, top, top - 2.0, top - 7.0};  // repeated max
    StableShift sh = stable_shift<double>(top, 2, 2.0f);
    EXPECT_TRUE(sh.pos || sh.neg);
    std::vector<double> a = softmax_with(s, top), b = softmax_with(s, sh.m);
    for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-14 * a[i]) << top;
  }
}

TEST(StableSoftmax, RepeatedMaximumGetsPbarBelowOneInBf16) {
  for (double top : kMaxima) {
    for (float beta : {2.0f, 1.0f, 1.001f, 8.0f}) {
      const float r_m = static_cast<float>(top);
      StableShift sh = stable_shift<float>(r_m, 2, beta);
      const float pbar = std::exp(r_m - sh.m);  // FP32, as the kernel computes it
      EXPECT_LT(round_bf16(pbar), 1.0f) << "r_m=" << top << " beta=" << beta;
      EXPECT_GE(pbar, std::exp(-kStableMaxShift) * 0.999f) << "r_m=" << top;  // no underflow
    }
  }
  // Without a repeat the tile max is unchanged (so such rows round exactly as standard).
  StableShift one = stable_shift<float>(5.0f, 1, 2.0f);
  EXPECT_EQ(one.m, 5.0f);
  EXPECT_FALSE(one.pos || one.neg || one.guard);
  // The guard fires exactly when the literal rule would leave [2^-8, 16].
  EXPECT_FALSE(stable_shift<float>(3.0f, 2, 2.0f).guard);    // d = 3
  EXPECT_TRUE(stable_shift<float>(100.0f, 2, 2.0f).guard);   // d = 100 -> 16
  EXPECT_TRUE(stable_shift<float>(-100.0f, 2, 2.0f).guard);  // d = 100 -> 16
  EXPECT_TRUE(stable_shift<float>(0.0f, 2, 2.0f).guard);     // d = 0 -> 2^-8
  EXPECT_FALSE(stable_shift<float>(-3.0f, 2, 2.0f).guard);   // d = 3
}

// Queries (1, 0, ..) and keys (x_c, 0, ..) with scale 1: S[r][c] = x_c exactly.
Problem row_problem(const std::vector<float>& x, bool causal, int block) {
  const int t = static_cast<int>(x.size()), d = 4;
  Problem pr = test::make_problem(1, 2, t, d, 1, 1.0f, causal, block, block);
  pr.p.scale = 1.0f;
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < t; ++r)
      for (int j = 0; j < d; ++j) {
        const size_t i = (static_cast<size_t>(h) * t + r) * d + j;
        pr.q[i] = j == 0 ? 1.0f : 0.0f;
        pr.k[i] = j == 0 ? x[r] : 0.0f;
      }
  pr.flags[1].stable = true;  // head 0 standard, head 1 stabilized
  return pr;
}

TEST(StableSoftmax, ExtremeRepeatedMaximaStayFiniteAndAccurate) {
  for (double top : {100.0, -100.0, 1000.0, -1000.0, 0.0}) {
    const float m = static_cast<float>(top);
    std::vector<float> x = {m - 1, m, m - 4, m, m - 0.5f, m - 30, m, m - 2};
    Problem pr = row_problem(x, false, 4);
    Result r = test::run_emulation(pr);
    test::Reference ref = test::run_reference(pr);
    for (const auto* v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv})
      for (float e : *v) ASSERT_TRUE(std::isfinite(e)) << "max " << top;
    // Every row's max (value m at keys 1, 3, 6) repeats: standard has P̄ == 1 ties, stable none.
    EXPECT_GT(r.stats[0].pbar_one, 0);
    EXPECT_EQ(r.stats[1].pbar_one, 0) << "max " << top;
    EXPECT_EQ(r.stats[1].repeated_max_rows, pr.p.seq);
    EXPECT_GT(r.stats[1].stable_pos + r.stats[1].stable_neg, 0);
    if (std::fabs(top) >= 100 || top == 0.0) EXPECT_GT(r.stats[1].stable_guard, 0);
    // Both heads compute the same exact function: errors stay at BF16 level (O is a convex
    // combination of V entries of size <= ~4, BF16 relative rounding 2^-8 per step).
    auto head = [&](const std::vector<float>& a, int h) { return test::head_slice(a, pr, h, false); };
    auto head_ref = [&](const std::vector<double>& a, int h) {
      std::vector<float> f(a.begin(), a.end());
      return test::head_slice(f, pr, h, false);
    };
    EXPECT_LE(test::max_abs_diff(head(r.o, 1), head_ref(ref.o, 1)),
              4.0 * test::max_abs_diff(head(r.o, 0), head_ref(ref.o, 0)) + 0.05);
  }
}

TEST(StableSoftmax, RowsWithoutRepeatsAreBitwiseUntouched) {
  Problem pr = test::make_problem(2, 2, 60, 16, 77, 1.0f, true, 16, 16);
  pr.flags[1].stable = true;
  for (size_t i = 0; i < pr.n(); ++i)
    if ((i / (60 * 16)) % 2 == 1) {  // head 1 gets head 0's inputs
      pr.q[i] = pr.q[i - 60 * 16];
      pr.k[i] = pr.k[i - 60 * 16];
      pr.v[i] = pr.v[i - 60 * 16];
      pr.d_o[i] = pr.d_o[i - 60 * 16];
    }
  Result r = test::run_emulation(pr);
  // Random FP32 logits: no tile row has a repeated max except single-entry rows... which
  // have r_s = 1. So the stabilized head must not trigger and must equal head 0 bitwise.
  ASSERT_EQ(r.stats[1].stable_pos + r.stats[1].stable_neg, 0);
  EXPECT_TRUE(bitwise_equal(test::head_slice(r.o, pr, 0, false), test::head_slice(r.o, pr, 1, false)));
  EXPECT_TRUE(bitwise_equal(test::head_slice(r.lse, pr, 0, true), test::head_slice(r.lse, pr, 1, true)));
  EXPECT_TRUE(bitwise_equal(test::head_slice(r.dq, pr, 0, false), test::head_slice(r.dq, pr, 1, false)));
}

TEST(StableSoftmax, MaskedEntriesAreNeverTies) {
  // All logits equal (q = 0): every unmasked tile row with >= 2 entries is a repeated max,
  // r_m = 0 -> the negative branch, guarded to d = 2^-8. Rows/tiles whose only unmasked entry
  // is the diagonal, and fully masked tiles, must not count (the paper's code counts masked
  // -finfo.max entries as ties).
  const int t = 20, block = 8;
  Problem pr = test::make_problem(1, 2, t, 4, 3, 1.0f, true, block, block);
  for (auto& e : pr.q) e = 0.0f;
  pr.flags[1].stable = true;
  Result r = test::run_emulation(pr);
  int64_t expected = 0;
  for (int row = 0; row < t; ++row)
    for (int j0 = 0; j0 < t; j0 += block) expected += (std::min(j0 + block, row + 1) - j0 >= 2);
  EXPECT_EQ(r.stats[1].stable_neg, expected);
  EXPECT_EQ(r.stats[1].stable_guard, expected);
  EXPECT_EQ(r.stats[1].stable_pos, 0);
  EXPECT_EQ(r.stats[0].stable_neg, 0);
  EXPECT_EQ(r.stats[1].pbar_one, 0);
  EXPECT_EQ(r.stats[0].repeated_max_rows, t - 1);  // row 0 has a single key
  for (float e : r.o) ASSERT_TRUE(std::isfinite(e));
}

}  // namespace
}  // namespace rwd::kernels
