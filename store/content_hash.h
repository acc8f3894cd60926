// Content hash used to address blobs: XXH64 (seed 0) of the RAW bytes, as 16 lowercase hex digits.
// Non-cryptographic: it detects corruption and deduplicates; it does not defend against tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rwd::store {

// XXH64 as specified by Yann Collet (github.com/Cyan4973/xxHash, doc/xxhash_spec.md):
// four 64-bit lanes consume 32-byte stripes, then the 8/4/1-byte tail, then an avalanche.
// Output is bit-identical to the reference implementation (tests check published vectors).
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

// The blob key: xxh64(data, size, 0) formatted as exactly 16 lowercase hex digits.
std::string content_hash(const void* data, size_t size);

// True when `s` looks like a content hash (16 lowercase hex digits).
bool is_content_hash(const std::string& s);

}  // namespace rwd::store
