// RAII zstd contexts, one of each per Store and reused for every frame. Frames carry their
// content size and a checksum; reading rejects frames whose size is unknown or unexpected.
#pragma once

#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

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

  // Compresses `size` bytes into one frame; the returned buffer is reused by the next call.
  const std::vector<uint8_t>& compress(const void* data, size_t size);
  int level() const { return level_; }

 private:
  ZSTD_CCtx* cctx_ = nullptr;
  int level_;
  std::vector<uint8_t> out_;
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
