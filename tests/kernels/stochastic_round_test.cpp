// Stochastic rounding (kernels/stochastic_round.h) and the sr heads of the CPU emulation: the
// rounding is unbiased where round-to-nearest-even is not (the paper's repeated-maximum row
// included), keeps BF16 values, NaN and infinities; the bits are a pure function of the key and
// the element (same call, same bits; another step, other bits; any tiling, the same bits); and
// the backward rounds P with the bits the forward drew for P̄.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/stochastic_round.h"
#include "tests/kernels/test_util.h"

namespace rwd::kernels {
namespace {

using test::bitwise_equal;
using test::Problem;
using test::Result;

constexpr uint64_t kKey = 0x1234'5678'9abc'def0ull;

// Mean over n draws (elements of one stream) of sr(x) - x, in units of the BF16 spacing at x.
double mean_sr_error_ulps(float x, int n) {
  const uint64_t stream = sr_stream(kKey, SrSite::kPv, 0, 0);
  const double ulp = bf16_ulp(x);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const uint32_t bits = sr_element_bits(stream, i / 256, static_cast<uint32_t>(i % 256));
    sum += (static_cast<double>(round_bf16_sr(x, bits)) - x) / ulp;
  }
  return sum / n;
}

TEST(StochasticRound, UnbiasedWhereNearestEvenIsNot) {
  // Values at 1/4, 1/2 (a tie: nearest-even goes down here) and 3/4 of their BF16 spacing, the
  // paper's P̄ = exp(-2^-10) just below 1, a negative one (0.7 of the way), 0.3 and a subnormal.
  const float xs[] = {1.0f + 0.25f / 128, 1.0f + 0.5f / 128, 1.0f + 0.75f / 128, std::exp(-1.0f / 1024),
                      -2.40625f - 0.7f / 64, 0.3f, 1e-39f};
  const int n = 1 << 16;
  for (float x : xs) {
    const double rn_err = (static_cast<double>(round_bf16(x)) - x) / bf16_ulp(x);
    const double sr_err = mean_sr_error_ulps(x, n);
    // One draw's error has variance at most ulp^2 / 4: the mean's standard deviation is below
    // 1 / (2 sqrt(n)) ulp = 0.002 ulp; 5 of them allowed.
    EXPECT_LT(std::fabs(sr_err), 5.0 * 0.5 / std::sqrt(static_cast<double>(n))) << x;
    EXPECT_GT(std::fabs(rn_err), 0.09) << x << ": choose inputs nearest-even rounds off-centre";
  }
}

TEST(StochasticRound, KeepsBf16ValuesNanAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t r : {0u, 1u, 0x7fffu, 0x8000u, 0xffffu}) {
    for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 0.99609375f, 3.0e38f, inf, -inf})
      EXPECT_EQ(round_bf16_sr(round_bf16(x), r), round_bf16(x)) << x << " r " << r;
    EXPECT_TRUE(std::isnan(round_bf16_sr(std::nanf(""), r)));
    EXPECT_TRUE(std::isnan(round_bf16_sr(-std::nanf(""), r)));
  }
  // Above the largest finite BF16 (0x7f7f): infinity with probability (dropped bits) / 2^16.
  const float above = bits_float(0x7f7f4000u);  // a quarter of the way to 2^128
  EXPECT_EQ(round_bf16_sr(above, 0xbfffu), bf16_bits_to_float(0x7f7f));
  EXPECT_EQ(round_bf16_sr(above, 0xc000u), inf);
  EXPECT_EQ(round_bf16_sr(-above, 0xc000u), -inf);
  // The extremes of r: truncation (r = 0) and the step up whenever a bit is dropped.
  EXPECT_EQ(round_bf16_sr(1.0f + 1.0f / 256, 0), 1.0f);
  EXPECT_EQ(round_bf16_sr(1.0f + 1.0f / 65536, 0xffffu), 1.0f + 1.0f / 128);
}

TEST(StochasticRound, BitsArePureFunctionsOfKeyAndElement) {
  EXPECT_EQ(sr_call_key(1, 7, 0, 2), sr_call_key(1, 7, 0, 2));
  // Every coordinate of the call moves the key.
  const uint64_t k = sr_call_key(1, 7, 0, 2);
  for (uint64_t other : {sr_call_key(2, 7, 0, 2), sr_call_key(1, 8, 0, 2), sr_call_key(1, 7, 1, 2),
                         sr_call_key(1, 7, 0, 3)})
    EXPECT_NE(other, k);
  // 16 uniform bits: the mean over a stream's elements is near 2^15 - 1/2, each bit near 1/2.
  const uint64_t s = sr_stream(k, SrSite::kPv, 0, 0);
  double mean = 0.0;
  int ones[16] = {};
  const int n = 256 * 256;
  for (int i = 0; i < n; ++i) {
    const uint32_t b = sr_element_bits(s, i / 256, static_cast<uint32_t>(i % 256));
    ASSERT_LT(b, 1u << 16);
    mean += b;
    for (int j = 0; j < 16; ++j) ones[j] += (b >> j) & 1;
  }
  EXPECT_NEAR(mean / n, 32767.5, 5 * 65536 / std::sqrt(12.0 * n));
  for (int j = 0; j < 16; ++j) EXPECT_NEAR(ones[j] / static_cast<double>(n), 0.5, 0.01) << "bit " << j;
  EXPECT_NE(sr_stream(k, SrSite::kPv, 0, 1), s);
  EXPECT_NE(sr_stream(k, SrSite::kAcc, 0, 0), s);
}

// The paper's row: 16 of 64 keys tie for the row maximum (P̄ = 1 exactly) and 48 sit 2^-10
// below it (P̄ = exp(-2^-10) = 0.99902, which nearest-even rounds up to 1); V = -1 everywhere,
// so every row's exact O is -1 and rounding P̄ up makes Ō / l too negative. The 64 identical
// rows (no causal mask) draw independent bits; o_f32 (Ō / l before O's own rounding) shows
// the bias.
Problem repeated_max_problem(bool pv_sr, uint64_t key) {
  Problem pr = test::make_problem(1, 1, 64, 2, 1, 1.0f, /*causal=*/false, 64, 64);
  pr.p.scale = 1.0f;
  pr.p.sr_key = key;
  const int t = pr.p.seq;
  for (int r = 0; r < t; ++r) {
    pr.q[r * 2] = 1.0f;
    pr.q[r * 2 + 1] = 1.0f / 16;
    pr.k[r * 2] = 1.0f;
    pr.k[r * 2 + 1] = r < 16 ? 0.0f : -1.0f / 64;  // S = 1 (ties) or 1 - 2^-10
    pr.v[r * 2] = pr.v[r * 2 + 1] = -1.0f;
  }
  pr.flags[0].pv_sr = pv_sr;
  return pr;
}

TEST(StochasticRound, PvSrRemovesThePaperRowsBias) {
  double rn = 0.0, sr = 0.0;
  int n = 0;
  for (uint64_t step = 0; step < 16; ++step) {
    const Result a = test::run_emulation(repeated_max_problem(false, step));
    const Result b = test::run_emulation(repeated_max_problem(true, sr_call_key(3, step, 0, 0)));
    for (size_t i = 0; i < a.o_f32.size(); ++i, ++n) {
      rn += a.o_f32[i] + 1.0;
      sr += b.o_f32[i] + 1.0;
    }
  }
  rn /= n;
  sr /= n;
  // Nearest-even: 48 of 64 P̄ rounded up by 0.00098: Ō / l = -64 / 63.95, 7.3e-4 too negative.
  EXPECT_NEAR(rn, -7.3e-4, 0.2e-4);
  // SR: one P̄'s rounding error has spread ~0.0017 (0.0039 x sqrt(0.75 x 0.25)), a row's mean
  // of 48 of them over 64 keys ~1.8e-4; over 1024 rows (the two columns share P̄) the mean's
  // spread is ~6e-6.
  EXPECT_LT(std::fabs(sr), 4e-5) << "mean error " << sr << " vs nearest-even " << rn;
}

// Head 1 of 2, batch 1 of 2: the key's (b, h) part is exercised.
Problem sr_problem(int block, uint64_t key) {
  Problem pr = test::make_problem(2, 2, 48, 8, 17, 2.0f, true, block, block);
  pr.p.sr_key = key;
  return pr;
}

TEST(StochasticRound, SameCallSameBitsAnotherStepOtherBits) {
  void (*modes[])(HeadFlags&) = {[](HeadFlags& f) { f.pv_sr = true; }, [](HeadFlags& f) { f.acc_sr = true; },
                                 [](HeadFlags& f) { f.s_sr = true; }};
  for (auto mode : modes) {
    Problem a = sr_problem(16, sr_call_key(1, 10, 0, 0)), b = a, c = sr_problem(16, sr_call_key(1, 11, 0, 0));
    for (Problem* pr : {&a, &b, &c})
      for (auto& f : pr->flags) mode(f);
    const Result ra = test::run_emulation(a), rb = test::run_emulation(b), rc = test::run_emulation(c);
    EXPECT_TRUE(bitwise_equal(ra.o_f32, rb.o_f32) && bitwise_equal(ra.lse, rb.lse) && bitwise_equal(ra.dq, rb.dq) &&
                bitwise_equal(ra.dk, rb.dk) && bitwise_equal(ra.dv, rb.dv));
    EXPECT_FALSE(bitwise_equal(ra.o_f32, rc.o_f32));
  }
}

// Key 0 holds every row's strict maximum (S = 16 alpha = 5.7 against the others' N(0, 0.94^2)
// from dims 1..7), so m is final after the first tile whatever the tiling, and Ō, l take the
// same FP32 steps: bits equal across tilings for nearest-even, and for pv=sr only if the bits
// follow the element, not the tile.
TEST(StochasticRound, PvSrBitsDoNotDependOnTheTiling) {
  std::vector<Result> rs;
  for (int block : {16, 32, 64, 0}) {
    Problem pr = test::make_problem(2, 2, 48, 8, 17, 1.0f, true, block, block);
    pr.p.sr_key = kKey;
    const int t = pr.p.seq, d = pr.p.dim;
    for (int bh = 0; bh < pr.p.batch * pr.p.heads; ++bh) {
      for (int r = 0; r < t; ++r) {
        pr.q[(static_cast<size_t>(bh) * t + r) * d] = 4.0f;
        pr.k[(static_cast<size_t>(bh) * t + r) * d] = 0.0f;
      }
      for (int j = 0; j < d; ++j) pr.k[static_cast<size_t>(bh) * t * d + j] = j == 0 ? 4.0f : 0.0f;
    }
    for (auto& f : pr.flags) f.pv_sr = true;
    rs.push_back(test::run_emulation(pr));
    pr.flags.assign(pr.flags.size(), HeadFlags{});
    if (block == 0) EXPECT_FALSE(bitwise_equal(test::run_emulation(pr).o_f32, rs.back().o_f32)) << "sr is inert";
  }
  for (size_t i = 1; i < rs.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(rs[i].o_f32, rs[0].o_f32) && bitwise_equal(rs[i].lse, rs[0].lse)) << i;
    EXPECT_TRUE(bitwise_equal(rs[i].dq, rs[0].dq) && bitwise_equal(rs[i].dk, rs[0].dk) &&
                bitwise_equal(rs[i].dv, rs[0].dv))
        << i;
  }
}

// dV of a pv=sr head, replayed by hand: P = exp(S - LSE) from the emulation's S and LSE, each
// rounded with sr_element_bits of the pv stream at (query, key), the bits the forward drew for
// P̄ of that element; rows ascending, the sum rounded to BF16.
TEST(StochasticRound, BackwardRoundsPWithTheForwardsElementBits) {
  Problem pr = sr_problem(16, sr_call_key(5, 3, 1, 2));
  for (auto& f : pr.flags) f.pv_sr = true;
  const Result r = test::run_emulation(pr);
  const int t = pr.p.seq, d = pr.p.dim;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h) {
      const size_t bh = static_cast<size_t>(b) * 2 + h;
      const uint64_t stream = sr_stream(pr.p.sr_key, SrSite::kPv, b, h);
      for (int c = 0; c < t; ++c)
        for (int j = 0; j < d; ++j) {
          float acc = 0.0f;
          for (int q = c; q < t; ++q) {
            float s = 0.0f;
            for (int e = 0; e < d; ++e)
              s += round_bf16(pr.q[(bh * t + q) * d + e]) * round_bf16(pr.k[(bh * t + c) * d + e]);
            const float p = std::exp(pr.p.scale * s - r.lse[bh * t + q]);
            acc += round_bf16_sr(p, sr_element_bits(stream, q, static_cast<uint32_t>(c))) *
                   round_bf16(pr.d_o[(bh * t + q) * d + j]);
          }
          ASSERT_EQ(round_bf16(acc), r.dv[(bh * t + c) * d + j]) << "b " << b << " h " << h << " key " << c;
        }
    }
}

}  // namespace
}  // namespace rwd::kernels
