// BF16 emulation: flash vs naive agree to rounding (naive == tiling off bit for bit), the
// all-FP32 plan matches the FP64 reference to FP32 accuracy, T = 1, bitwise determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/bf16.h"
#include "tests/kernels/test_util.h"

namespace rwd::kernels {
namespace {

using test::bitwise_equal;
using test::make_problem;
using test::max_abs_diff;
using test::Problem;
using test::Result;

struct Shape {
  int b, h, t, d, block;
};
// Tiles that divide T, that don't, one tile, and T = 1.
const Shape kShapes[] = {{2, 3, 64, 16, 16}, {1, 2, 100, 32, 32}, {2, 2, 37, 8, 0}, {1, 2, 1, 16, 16}};

TEST(Emulation, FlashAndNaiveAgreeToRounding) {
  for (const Shape& s : kShapes) {
    for (bool causal : {true, false}) {
      Problem pr = make_problem(s.b, s.h, s.t, s.d, 100 + s.t, 2.0f, causal, s.block, s.block);
      Result flash = test::run_emulation(pr);
      pr.p.naive = true;
      Result naive = test::run_emulation(pr);
      test::Reference ref = test::run_reference(pr);
      // Two implementations with the same rounding points differ by at most their own errors
      // against the exact result; 2x the naive error (plus an FP32-level floor) bounds it.
      auto check = [&](const std::vector<float>& a, const std::vector<float>& b,
                       const std::vector<double>& r, const char* what) {
        const double bound = 2.0 * max_abs_diff(b, r) + 1e-6;
        EXPECT_LE(max_abs_diff(a, b), bound) << what << " T=" << s.t << " causal=" << causal;
      };
      check(flash.o, naive.o, ref.o, "O");
      check(flash.dq, naive.dq, ref.dq, "dQ");
      check(flash.dk, naive.dk, ref.dk, "dK");
      check(flash.dv, naive.dv, ref.dv, "dV");
    }
  }
}

TEST(Emulation, NaiveEqualsTilingOffBitwise) {
  Problem pr = make_problem(2, 2, 50, 16, 7, 2.0f, true, 0, 0);
  Result off = test::run_emulation(pr);
  pr.p.naive = true;
  pr.p.block_q = pr.p.block_k = 16;  // ignored by naive
  Result naive = test::run_emulation(pr);
  EXPECT_TRUE(bitwise_equal(off.o, naive.o));
  EXPECT_TRUE(bitwise_equal(off.lse, naive.lse));
  EXPECT_TRUE(bitwise_equal(off.dq, naive.dq));
  EXPECT_TRUE(bitwise_equal(off.dk, naive.dk));
  EXPECT_TRUE(bitwise_equal(off.dv, naive.dv));
}

TEST(Emulation, TilingChangesForwardRounding) {
  // The running rescale makes the tiled forward round differently from one tile; if it did
  // not, the flash-vs-naive test above would be vacuous.
  Problem pr = make_problem(2, 2, 100, 32, 8, 2.0f, true, 16, 16);
  Result tiled = test::run_emulation(pr);
  pr.p.naive = true;
  Result naive = test::run_emulation(pr);
  EXPECT_FALSE(bitwise_equal(tiled.o, naive.o));
}

TEST(Emulation, AllFp32PlanMatchesReferenceToFp32Accuracy) {
  for (const Shape& s : kShapes) {
    Problem pr = make_problem(s.b, s.h, s.t, s.d, 200 + s.t, 2.0f, true, s.block, s.block);
    test::Reference ref = test::run_reference(pr);
    Result low = test::run_emulation(pr);
    for (auto& f : pr.flags)
      for (auto& op : f.prec) op = Prec::kFp32;
    Result hi = test::run_emulation(pr);
    // FP32 sums of <= 100 terms: worst-case relative error ~T * 2^-24 = 6e-6 of the largest
    // magnitude involved; BF16 rounding alone is 2^-9 = 2e-3, so 2e-5 separates the regimes.
    auto rel = [](const std::vector<float>& a, const std::vector<double>& r) {
      // Scale floor 1 (inputs are O(1)): for T = 1 the exact dQ, dK are 0 while FP32 dP - delta
      // cancels to ~1e-7.
      return max_abs_diff(a, r) / std::max(1.0, test::max_abs(r));
    };
    EXPECT_LE(rel(hi.o, ref.o), 2e-5) << "T=" << s.t;
    EXPECT_LE(rel(hi.dq, ref.dq), 2e-5) << "T=" << s.t;
    EXPECT_LE(rel(hi.dk, ref.dk), 2e-5) << "T=" << s.t;
    EXPECT_LE(rel(hi.dv, ref.dv), 2e-5) << "T=" << s.t;
    EXPECT_LE(max_abs_diff(hi.lse, ref.lse), 2e-5 * std::max(1.0, test::max_abs(ref.lse)));
    EXPECT_GT(rel(low.o, ref.o), 1e-4) << "the default plan must be visibly BF16";
  }
}

TEST(Emulation, SingleTokenIsExact) {
  Problem pr = make_problem(2, 2, 1, 16, 5, 1.0f, true, 16, 16);
  Result r = test::run_emulation(pr);
  for (size_t i = 0; i < pr.n(); ++i) {
    EXPECT_EQ(r.o[i], round_bf16(pr.v[i]));     // one key: P̄ = 1, l = 1
    EXPECT_EQ(r.dv[i], round_bf16(pr.d_o[i]));  // dV = P dO with P = 1
    EXPECT_EQ(r.dq[i], 0.0f);                   // dS = dO (V - O) = 0 exactly
    EXPECT_EQ(r.dk[i], 0.0f);
  }
}

TEST(Emulation, ForwardAndBackwardAreBitwiseDeterministic) {
  Problem pr = make_problem(4, 3, 100, 32, 9, 3.0f, true, 32, 16);
  pr.flags[1].stable = true;
  pr.flags[2].prec[static_cast<int>(Op::kSoftmax)] = Prec::kFp32;
  Result a = test::run_emulation(pr);
  Result b = test::run_emulation(pr);
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  EXPECT_TRUE(bitwise_equal(a.dq, b.dq));
  EXPECT_TRUE(bitwise_equal(a.dk, b.dk));
  EXPECT_TRUE(bitwise_equal(a.dv, b.dv));
  EXPECT_TRUE(bitwise_equal(a.delta, b.delta));
  for (int h = 0; h < pr.p.heads; ++h) {
    EXPECT_EQ(a.stats[h].rows, pr.p.batch * pr.p.seq);
    EXPECT_EQ(a.stats[h].pbar_one, b.stats[h].pbar_one);
    EXPECT_EQ(a.stats[h].max_logit, b.stats[h].max_logit);
  }
}

TEST(Emulation, RejectsBadParams) {
  Problem pr = make_problem(1, 1, 4, 4, 1);
  std::vector<float> o(pr.n()), lse(pr.rows());
  AttentionParams p = pr.p;  // flags not set
  EXPECT_THROW(attention_forward_cpu(p, pr.q.data(), pr.k.data(), pr.v.data(), o.data(), lse.data()),
               KernelError);
  p.flags = pr.flags.data();
  p.seq = 0;
  EXPECT_THROW(attention_forward_cpu(p, pr.q.data(), pr.k.data(), pr.v.data(), o.data(), lse.data()),
               KernelError);
}

}  // namespace
}  // namespace rwd::kernels
