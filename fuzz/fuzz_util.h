// Shared by the fuzz targets: input as text, a check that aborts (so libFuzzer and the
// regression replayer report it) and the one exception type a parser may throw on bad input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace rwd::fuzz {

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A property the parser promises (round trip, range) that fuzzed input broke.
inline void require(bool ok, const char* what, const std::string& input) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property violated: %s\ninput: %s\n", what, input.c_str());
  std::abort();
}

// Runs `parse` on bad input: a one-line rwd::Error (usage or data) is the documented outcome;
// any other exception escapes and is reported as a crash.
template <class F>
void expect_clean(F&& parse) {
  try {
    parse();
  } catch (const rwd::Error&) {
  }
}

}  // namespace rwd::fuzz
