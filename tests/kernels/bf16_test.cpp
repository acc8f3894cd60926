// BF16 helpers: the paper's accumulation example bit for bit, ties to even, NaN/inf handling,
// directed rounding toward -inf and the BF16 ulp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/bf16.h"

namespace rwd::kernels {
namespace {

TEST(Bf16, PaperExampleWithResidue) {
  // FP32 accumulator holding BF16 -2.40625 plus a residue, plus the BF16 value -2.296875.
  const float acc = -2.4071154594421387f;
  const float x = -2.296875f;
  ASSERT_EQ(round_bf16(x), x);
  ASSERT_EQ(round_bf16(acc), -2.40625f);
  const float sum = acc + x;
  EXPECT_EQ(static_cast<double>(sum), -4.703990459442139);
  EXPECT_EQ(round_bf16(sum), -4.71875f);
  EXPECT_EQ(static_cast<double>(round_bf16(sum) - sum), -0.014759540557861328);
}

TEST(Bf16, PaperExampleExactTieRoundsToEven) {
  const float sum = -2.40625f + -2.296875f;
  EXPECT_EQ(sum, -4.703125f);  // exactly halfway between -4.6875 and -4.71875
  EXPECT_EQ(round_bf16(sum), -4.6875f);
  EXPECT_EQ(float_to_bf16_bits(-4.6875f) & 1u, 0u);  // the even neighbour
  // A positive tie between 1 and 1 + 2^-7 goes to 1 (even), the next one up goes to 1 + 2^-6.
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(round_bf16(std::nanf(""))));
  EXPECT_TRUE(std::isnan(round_bf16(-std::nanf(""))));
  // A NaN whose payload lives only in the dropped bits must stay NaN, not become inf.
  EXPECT_TRUE(std::isnan(round_bf16(bits_float(0x7f800001u))));
  EXPECT_EQ(round_bf16(inf), inf);
  EXPECT_EQ(round_bf16(-inf), -inf);
  EXPECT_EQ(round_bf16(std::numeric_limits<float>::max()), inf);
  EXPECT_EQ(round_bf16(-0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(round_bf16(-0.0f)));
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
}

TEST(Bf16, DirectedRoundingTowardMinusInfinity) {
  const float x = 1.0f + std::ldexp(1.0f, -7) * 0.75f;  // between 1 and 1 + 2^-7
  EXPECT_EQ(round_bf16_down(x), 1.0f);
  EXPECT_EQ(round_bf16_down(-x), -(1.0f + std::ldexp(1.0f, -7)));
  EXPECT_EQ(round_bf16_down(-4.703125f), -4.71875f);
  EXPECT_EQ(round_bf16_down(2.0f), 2.0f);  // representable values are unchanged
  EXPECT_EQ(round_bf16_down(-2.0f), -2.0f);
  // Never above the input, never more than one ulp below.
  for (float v = -3.0f; v < 3.0f; v += 0.01234f) {
    const float d = round_bf16_down(v);
    EXPECT_LE(d, v);
    EXPECT_LT(v - d, bf16_ulp(v) * 1.0001f);
  }
}

TEST(Bf16, Ulp) {
  EXPECT_EQ(bf16_ulp(1.0f), std::ldexp(1.0f, -7));
  EXPECT_EQ(bf16_ulp(-3.0f), std::ldexp(1.0f, -6));
  EXPECT_EQ(bf16_ulp(0.75f), std::ldexp(1.0f, -8));
  EXPECT_EQ(bf16_ulp(0.0f), std::ldexp(1.0f, -133));
}

TEST(Bf16, RoundingMatchesNearestNeighbour) {
  // Exhaustive over a band of FP32 values: the result is a BF16 value and no other BF16 value
  // is closer; exact ties go to the even mantissa.
  for (uint32_t u = 0x3f800000u; u < 0x3f800000u + (1u << 20); u += 7) {
    const float x = bits_float(u);
    const float r = round_bf16(x);
    ASSERT_EQ(float_bits(r) & 0xffffu, 0u);
    const float lo = bits_float(u & 0xffff0000u), hi = bits_float((u & 0xffff0000u) + 0x10000u);
    const float dl = x - lo, dh = hi - x;
    if (dl < dh) ASSERT_EQ(r, lo);
    if (dh < dl) ASSERT_EQ(r, hi);
    if (dl == dh) ASSERT_EQ(float_bits(r) & 0x10000u, 0u);
  }
}

}  // namespace
}  // namespace rwd::kernels
