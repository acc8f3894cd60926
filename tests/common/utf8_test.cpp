// Cutting text for messages (common/utf8.h): a cut never falls inside a UTF-8 character.
#include <gtest/gtest.h>

#include <string>

#include "common/utf8.h"

namespace rwd {
namespace {

// "é" is 2 bytes, "—" 3, "𝄞" 4.
const std::string kText = "a\xc3\xa9" "b\xe2\x80\x94" "c\xf0\x9d\x84\x9e" "d";  // a é b — c 𝄞 d

// Whether `s` is whole UTF-8: every sequence has its lead byte and all its continuation bytes.
bool whole_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const std::string c = utf8_char_at(s, i);
    if (c.size() == 1 && (static_cast<unsigned char>(c[0]) >= 0x80)) return false;
    i += c.size();
  }
  return true;
}

TEST(Utf8, PrefixNeverEndsInsideACharacter) {
  EXPECT_EQ(utf8_prefix(kText, 1), "a");
  EXPECT_EQ(utf8_prefix(kText, 2), "a");  // not "a" and half of "é"
  EXPECT_EQ(utf8_prefix(kText, 3), "a\xc3\xa9");
  EXPECT_EQ(utf8_prefix(kText, 5), "a\xc3\xa9" "b");
  EXPECT_EQ(utf8_prefix(kText, 6), "a\xc3\xa9" "b");
  EXPECT_EQ(utf8_prefix(kText, 10), "a\xc3\xa9" "b\xe2\x80\x94" "c");  // 3 bytes into the 4 of "𝄞"
  EXPECT_EQ(utf8_prefix(kText, 0), "");
  EXPECT_EQ(utf8_prefix(kText, 100), kText);
  for (size_t n = 0; n <= kText.size() + 1; ++n) {
    const std::string p = utf8_prefix(kText, n);
    EXPECT_LE(p.size(), n);
    EXPECT_TRUE(whole_utf8(p)) << n;
    EXPECT_EQ(kText.compare(0, p.size(), p), 0) << n;
    EXPECT_GE(p.size() + 3, std::min(n, kText.size())) << n;  // backs off at most one character
  }
  // Not UTF-8: cut where asked once 3 bytes back have been tried.
  EXPECT_EQ(utf8_prefix("a\x80\x80\x80\x80\x80", 5), "a\x80");
}

TEST(Utf8, ShortenAddsTheEllipsisWithinTheWidth) {
  EXPECT_EQ(utf8_shorten(kText, kText.size()), kText);
  EXPECT_EQ(utf8_shorten(kText, 8), "a\xc3\xa9" "b...");  // 5 bytes for text end inside "—": "aéb"
  EXPECT_EQ(utf8_shorten("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 6), "\xc3\xa9...");
  EXPECT_EQ(utf8_shorten("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 7), "\xc3\xa9\xc3\xa9...");
  for (size_t n = 3; n < kText.size(); ++n) {
    const std::string s = utf8_shorten(kText, n);
    EXPECT_LE(s.size(), n);
    EXPECT_TRUE(whole_utf8(s)) << n;
  }
}

TEST(Utf8, CharAtReturnsTheWholeCharacter) {
  EXPECT_EQ(utf8_char_at(kText, 0), "a");
  EXPECT_EQ(utf8_char_at(kText, 1), "\xc3\xa9");
  EXPECT_EQ(utf8_char_at(kText, 4), "\xe2\x80\x94");
  EXPECT_EQ(utf8_char_at(kText, 8), "\xf0\x9d\x84\x9e");
  EXPECT_EQ(utf8_char_at(kText, kText.size()), "");
  EXPECT_EQ(utf8_char_at("\xc3", 0), "\xc3");        // a lead byte at the end: itself
  EXPECT_EQ(utf8_char_at("\xe2\x80x", 0), "\xe2");   // a sequence broken off: its first byte
  EXPECT_EQ(utf8_char_at("\x80z", 0), "\x80");
}

}  // namespace
}  // namespace rwd
