// Cutting user text (plans, paths, configs) for one-line messages without cutting a UTF-8
// character in half: a cut falls only where a character starts.
#pragma once

#include <cstddef>
#include <string>

namespace rwd {

// Whether byte `c` continues a UTF-8 sequence (10xxxxxx) rather than starting a character.
inline bool utf8_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The longest prefix of `s` of at most `max_bytes` bytes that ends where a character ends.
// Text that is not UTF-8 is cut where it is, after backing off at most 3 bytes.
inline std::string utf8_prefix(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  for (int k = 0; k < 3 && n > 0 && utf8_continuation(s[n]); ++k) --n;  // to the cut character's start
  return s.substr(0, n);
}

// `s` whole when it has at most `max_bytes` bytes, else its utf8_prefix followed by `ellipsis`,
// at most `max_bytes` bytes in all.
inline std::string utf8_shorten(const std::string& s, size_t max_bytes, const std::string& ellipsis = "...") {
  if (s.size() <= max_bytes) return s;
  return utf8_prefix(s, max_bytes > ellipsis.size() ? max_bytes - ellipsis.size() : 0) + ellipsis;
}

// The whole character that starts at byte `at` of `s` (1-4 bytes); one byte where the text is
// not UTF-8 there; "" at or past the end.
inline std::string utf8_char_at(const std::string& s, size_t at) {
  if (at >= s.size()) return "";
  const unsigned char lead = static_cast<unsigned char>(s[at]);
  const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
  if (at + len > s.size()) return s.substr(at, 1);
  for (size_t k = 1; k < len; ++k)
    if (!utf8_continuation(s[at + k])) return s.substr(at, 1);
  return s.substr(at, len);
}

}  // namespace rwd
