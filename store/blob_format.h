// How a blob is laid out in blob_chunks: the facts the writer (store.cpp) and the reader
// (store_read.cpp) share.
#pragma once

#include <algorithm>
#include <cstddef>

#include "store/store.h"

namespace rwd::store {

// Frames of a blob of `size` raw bytes; even an empty blob gets one (empty) frame.
inline size_t chunk_count(size_t size) { return std::max<size_t>(1, (size + kChunkBytes - 1) / kChunkBytes); }

// Byte-shuffle element sizes a blob may record (1 = none).
inline bool valid_shuffle(int elem) { return elem == 1 || elem == 2 || elem == 4 || elem == 8; }

}  // namespace rwd::store
