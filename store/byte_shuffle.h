// Byte shuffle filter (as in HDF5/Blosc): byte k of every element is grouped into plane k
// before compression. Float exponents and sign bytes vary slowly, so the planes compress better.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rwd::store {

// dst[k * n_elem + i] = src[i * elem + k] for the n / elem whole elements; trailing bytes
// (n % elem) are copied unchanged. elem == 1 is a plain copy. src and dst must not overlap.
void byte_shuffle(const uint8_t* src, size_t n, size_t elem, uint8_t* dst);
// Exact inverse of byte_shuffle.
void byte_unshuffle(const uint8_t* src, size_t n, size_t elem, uint8_t* dst);

}  // namespace rwd::store
