// Small non-cryptographic hashes shared by all libraries (fingerprints, digests, cache keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

// Host and device code (kernels/cuda includes this header for the parameter digest).
#include "common/host_device.h"

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
RWD_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Parameter digest "d2" (Trainer::param_digest): each tensor's bytes read as little-endian
// 32-bit words w_i, i = 0..n-1; its sum is the wrapping (mod 2^64) sum over i of
// splitmix64(i << 32 | w_i). Every term is a bijection of (i, w_i), so any change to one word
// changes the sum; the sum does not depend on the order of additions, so a GPU reduction with
// atomics and a threaded CPU one give the same bits. The digest then chains each tensor's word
// count and sum through FNV-1a, so tensor order counts. Tensors hold fewer than 2^32 words.
RWD_HOST_DEVICE inline uint64_t digest_term(uint32_t word, uint64_t index) {
  return splitmix64((index << 32) | word);
}

}  // namespace rwd
