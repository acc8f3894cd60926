// Writer for numpy .npy files (format version 1.0, little-endian, C order), used by
// `rewind store export`. BF16 tensors are written as float32 (exact widening).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "store/dtype.h"

namespace rwd::store {

// The full header (magic, version, length, dict, padding) for `dtype` as exported, so that
// magic + header is a multiple of 64 bytes as numpy writes it.
std::string npy_header(Dtype dtype, const std::vector<int64_t>& shape);

// Writes `nbytes` of raw `dtype` elements with `shape` to `path` (replacing it).
// Throws StoreError(kData) on I/O failure, kInternal if nbytes does not match the shape.
void write_npy(const std::string& path, Dtype dtype, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes);

}  // namespace rwd::store
