// Small non-cryptographic hashes shared by all libraries (fingerprints, digests, cache keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace rwd {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

// FNV-1a, 64 bit, over bytes; `h` lets callers hash several pieces in sequence.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

inline uint64_t fnv1a64(const std::string& s, uint64_t h = kFnvOffset) {
  return fnv1a64(s.data(), s.size(), h);
}

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// splitmix64: a counter-based generator; stateless, so batch k of step s is a pure function.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace rwd
