// RAII zstd contexts, one of each per Store (and a compressor per put_blobs thread), each
// reused for every frame. Frames carry their content size and a checksum; reading rejects
// frames whose size is unknown or unexpected.
#pragma once

#include <zstd.h>

#include <cstddef>
#include <cstdint>

#include "store/bytes.h"

namespace rwd::store {

class ZstdCompressor {
 public:
  // level: zstd level (1..19 sensible; 3 is zstd's default); workers: 0 = compress inline.
  explicit ZstdCompressor(int level = 3, int workers = 0);
  ~ZstdCompressor();
  ZstdCompressor(ZstdCompressor&& other) noexcept;
  ZstdCompressor& operator=(ZstdCompressor&& other) noexcept;
  ZstdCompressor(const ZstdCompressor&) = delete;
  ZstdCompressor& operator=(const ZstdCompressor&) = delete;

  // Compresses `size` bytes into one frame written to `frame` (resized to fit it). A buffer
  // passed again keeps its capacity, so a recycled one needs no allocation or fresh pages.
  void compress(const void* data, size_t size, Bytes& frame);
  int level() const { return level_; }

 private:
  ZSTD_CCtx* cctx_ = nullptr;
  int level_;
};

class ZstdDecompressor {
 public:
  ZstdDecompressor();
  ~ZstdDecompressor();
  ZstdDecompressor(ZstdDecompressor&& other) noexcept;
  ZstdDecompressor& operator=(ZstdDecompressor&& other) noexcept;
  ZstdDecompressor(const ZstdDecompressor&) = delete;
  ZstdDecompressor& operator=(const ZstdDecompressor&) = delete;

  // Decompresses exactly one frame of exactly `expected` bytes into dst. Throws
  // StoreError(kData) naming `what` if the frame is malformed, has an unknown or different
  // content size, trailing bytes, or fails its checksum.
  void decompress(const void* frame, size_t frame_size, void* dst, size_t expected,
                  const char* what);

 private:
  ZSTD_DCtx* dctx_ = nullptr;
};

}  // namespace rwd::store
