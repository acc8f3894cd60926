// The TF32 split's CPU twin (kernels/cuda/tf32_split.h) and the 3xTF32 product sequence of
// train/fp32_gemm.h run on the CPU: rounding to nearest even into 10 mantissa bits, x = hi + lo
// up to 2^-22 |x|, and the skipped products of exact operands change no bit.
#include <gtest/gtest.h>

#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cuda/tf32_split.h"
#include "train/fp32_gemm.h"

namespace rwd::train {
namespace {

using kernels::cuda::tf32_round;
using kernels::cuda::tf32_split_one;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(Tf32Split, RoundsToNearestEvenIntoTenMantissaBits) {
  EXPECT_EQ(tf32_round(1.0f + 0x1p-11f), 1.0f);                   // tie, even below
  EXPECT_EQ(tf32_round(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);     // tie, even above
  EXPECT_EQ(tf32_round(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f);
  EXPECT_EQ(tf32_round(-(1.0f + 0x1p-11f + 0x1p-20f)), -(1.0f + 0x1p-10f));
  EXPECT_EQ(tf32_round(2.0f - 0x1p-23f), 2.0f);                   // carries into the exponent
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(tf32_round(inf), inf);
  EXPECT_TRUE(std::isnan(tf32_round(std::nanf(""))));
  const float big = std::numeric_limits<float>::max();             // would round to inf
  EXPECT_TRUE(std::isfinite(tf32_round(big)));
  float hi, lo;
  tf32_split_one(inf, hi, lo);
  EXPECT_EQ(hi, inf);
  EXPECT_EQ(lo, 0.0f);
}

TEST(Tf32Split, TermsAreTf32ExactAndSumBackToX) {
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({20000}) * torch::exp(8.0 * torch::randn({20000}));
  auto [hi, lo] = split_tf32(x);
  const float* px = x.data_ptr<float>();
  const float* ph = hi.data_ptr<float>();
  const float* pl = lo.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(bits(ph[i]) & 0x1fffu, 0u) << px[i];
    ASSERT_EQ(bits(pl[i]) & 0x1fffu, 0u) << px[i];
    ASSERT_LE(std::fabs(static_cast<double>(px[i]) - ph[i]), std::ldexp(std::fabs(px[i]), -11)) << px[i];
    ASSERT_LE(std::fabs(static_cast<double>(px[i]) - ph[i] - pl[i]), std::ldexp(std::fabs(px[i]), -22)) << px[i];
  }
}

// On the CPU the split products run in LibTorch's FP32 GEMM: within 2x of the plain FP32 GEMM's
// RMS error against FP64 (the dropped lo*lo term and lo's rounding are ~2^-22 per product).
TEST(Tf32Split, SplitProductsMatchTheFp32GemmOnTheCpu) {
  torch::manual_seed(3);
  const torch::Tensor a = torch::randn({64, 512}), b = torch::randn({512, 96});
  const torch::Tensor ref = torch::mm(a.to(torch::kFloat64), b.to(torch::kFloat64));
  const double e32 = (torch::mm(a, b).to(torch::kFloat64) - ref).norm().item<double>();
  const double es = (split_tf32_mm(a, b, false, false).to(torch::kFloat64) - ref).norm().item<double>();
  EXPECT_LE(es, 2.0 * e32) << "split " << es << " plain " << e32;
  // b as a transposed view splits in its memory order, with the same result.
  const torch::Tensor bt = b.t().contiguous();
  EXPECT_TRUE(torch::equal(split_tf32_mm(a, bt.t(), false, false), split_tf32_mm(a, b, false, false)));
}

// An operand declared exact (BF16 values) skips its zero low part: the same bits as splitting it.
TEST(Tf32Split, ExactOperandsSkipOnlyZeroProducts) {
  torch::manual_seed(5);
  const torch::Tensor a = torch::randn({32, 256}).to(torch::kBFloat16).to(torch::kFloat32);
  const torch::Tensor b = torch::randn({256, 48});
  const torch::Tensor bb = b.to(torch::kBFloat16).to(torch::kFloat32);
  EXPECT_TRUE(torch::equal(split_tf32_mm(a, b, true, false), split_tf32_mm(a, b, false, false)));
  EXPECT_TRUE(torch::equal(split_tf32_mm(b.t(), a.t(), false, true), split_tf32_mm(b.t(), a.t(), false, false)));
  EXPECT_TRUE(torch::equal(split_tf32_mm(a, bb, true, true), torch::mm(a, bb)));
}

}  // namespace
}  // namespace rwd::train
