// Content hash against published XXH64 vectors; dtype tables, BF16 rounding and shape JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "store/content_hash.h"
#include "store/dtype.h"
#include "store/store_error.h"

namespace rwd::store {
namespace {

uint64_t xxh(const std::string& s) { return xxh64(s.data(), s.size(), 0); }

TEST(ContentHash, MatchesReferenceXxh64Vectors) {
  // Vectors from the xxHash reference implementation / python-xxhash documentation.
  EXPECT_EQ(xxh(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh("abc"), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(xxh("Nobody inspects the spammish repetition"), 0xFBCEA83C8A378BF1ULL);
  EXPECT_EQ(content_hash("", 0), "ef46db3751d8e999");
  EXPECT_TRUE(is_content_hash(content_hash("abc", 3)));
  EXPECT_FALSE(is_content_hash("EF46DB3751D8E999"));
  EXPECT_FALSE(is_content_hash("ef46db3751d8e99"));
}

TEST(ContentHash, EveryTailLengthAndAlignmentIsDistinctAndStable) {
  // Lengths 0..96 cover the stripe loop and every 8/4/1-byte tail; offsets test unaligned loads.
  std::string buf(200, '\0');
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 31 + 7);
  std::set<uint64_t> seen;
  for (size_t n = 0; n <= 96; ++n) {
    const uint64_t h = xxh64(buf.data(), n);
    std::string copy = buf.substr(0, n);
    std::string shifted = "x" + copy;
    EXPECT_EQ(h, xxh64(shifted.data() + 1, n)) << n;
    seen.insert(h);
  }
  EXPECT_EQ(seen.size(), 97u);
}

TEST(Dtype, SizesNamesAndNumpyDescriptors) {
  for (Dtype d : kAllDtypes) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
    EXPECT_GT(dtype_size(d), 0u);
  }
  EXPECT_EQ(dtype_size(Dtype::kBF16), 2u);
  EXPECT_EQ(dtype_size(Dtype::kI64), 8u);
  EXPECT_STREQ(npy_descr(Dtype::kU16), "<u2");
  EXPECT_STREQ(npy_descr(Dtype::kBF16), "<f4");  // exported widened to float32
  EXPECT_EQ(npy_export_dtype(Dtype::kBF16), Dtype::kF32);
  EXPECT_THROW(dtype_from_name("f8"), StoreError);
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between BF16 1.0 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): goes up.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // docs/design.md, rounding points: the FP32 sum -4.703990459442139 rounds to BF16 -4.71875.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-4.703990459442139f)), -4.71875f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.296875f)), -2.296875f);  // exactly representable
}

TEST(Dtype, ShapeJsonRoundTripAndRejectsJunk) {
  for (const std::vector<int64_t>& s :
       {std::vector<int64_t>{}, {0}, {7}, {2, 3, 4}, {50304, 768}}) {
    EXPECT_EQ(shape_from_json(shape_to_json(s)), s);
  }
  EXPECT_EQ(shape_from_json(" [ 1 , 2 ] "), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({3, 0}), 0);
  for (const char* bad :
       {"", "[", "[1,]", "[-1]", "[1 2]", "{}", "[1]x", "[99999999999999999999]"}) {
    EXPECT_THROW(shape_from_json(bad), StoreError) << bad;
  }
}

}  // namespace
}  // namespace rwd::store
