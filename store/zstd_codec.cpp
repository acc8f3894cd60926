// zstd contexts with every call checked (CHECK_ZSTD style); errors carry the zstd error code.
#include "store/zstd_codec.h"

#include <zstd_errors.h>

#include <algorithm>
#include <string>
#include <utility>

#include "store/store_error.h"

namespace rwd::store {
namespace {

size_t check_zstd(size_t rc, const char* doing, ExitCode code = ExitCode::kInternal) {
  if (ZSTD_isError(rc)) {
    throw StoreError(code,
                     std::string(doing) + ": " + ZSTD_getErrorName(rc) + " (zstd code " +
                         std::to_string(static_cast<int>(ZSTD_getErrorCode(rc))) + ")",
                     static_cast<int>(ZSTD_getErrorCode(rc)));
  }
  return rc;
}

}  // namespace

ZstdCompressor::ZstdCompressor(int level, int workers) : level_(level) {
  cctx_ = ZSTD_createCCtx();
  if (!cctx_) throw StoreError(ExitCode::kInternal, "zstd: cannot allocate a compression context");
  check_zstd(ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level),
             "zstd: setting compression level");
  check_zstd(ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1), "zstd: enabling checksums");
  check_zstd(ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1),
             "zstd: enabling content size");
  // A libzstd built without threads supports 0 workers only: compress on the calling thread.
  const ZSTD_bounds wb = ZSTD_cParam_getBounds(ZSTD_c_nbWorkers);
  workers = ZSTD_isError(wb.error) ? 0 : std::min(workers, wb.upperBound);
  if (workers > 0) {
    check_zstd(ZSTD_CCtx_setParameter(cctx_, ZSTD_c_nbWorkers, workers),
               "zstd: setting worker threads");
  }
}

ZstdCompressor::~ZstdCompressor() { ZSTD_freeCCtx(cctx_); }

ZstdCompressor::ZstdCompressor(ZstdCompressor&& other) noexcept
    : cctx_(std::exchange(other.cctx_, nullptr)), level_(other.level_) {}

ZstdCompressor& ZstdCompressor::operator=(ZstdCompressor&& other) noexcept {
  if (this != &other) {
    ZSTD_freeCCtx(cctx_);
    cctx_ = std::exchange(other.cctx_, nullptr);
    level_ = other.level_;
  }
  return *this;
}

void ZstdCompressor::compress(const void* data, size_t size, Bytes& frame) {
  resize_for_overwrite(frame, ZSTD_compressBound(size));
  // compress2 resets the session but keeps parameters, so the context is safely reused.
  size_t n = check_zstd(ZSTD_compress2(cctx_, frame.data(), frame.size(), data, size),
                        "zstd: compressing a blob chunk");
  frame.resize(n);
}

ZstdDecompressor::ZstdDecompressor() {
  dctx_ = ZSTD_createDCtx();
  if (!dctx_) {
    throw StoreError(ExitCode::kInternal, "zstd: cannot allocate a decompression context");
  }
}

ZstdDecompressor::~ZstdDecompressor() { ZSTD_freeDCtx(dctx_); }

ZstdDecompressor::ZstdDecompressor(ZstdDecompressor&& other) noexcept
    : dctx_(std::exchange(other.dctx_, nullptr)) {}

ZstdDecompressor& ZstdDecompressor::operator=(ZstdDecompressor&& other) noexcept {
  if (this != &other) {
    ZSTD_freeDCtx(dctx_);
    dctx_ = std::exchange(other.dctx_, nullptr);
  }
  return *this;
}

void ZstdDecompressor::decompress(const void* frame, size_t frame_size, void* dst, size_t expected,
                                  const char* what) {
  const std::string w(what);
  unsigned long long content = ZSTD_getFrameContentSize(frame, frame_size);
  if (content == ZSTD_CONTENTSIZE_ERROR) throw data_error(w + ": not a zstd frame");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) {
    throw data_error(w + ": zstd frame has no content size");
  }
  if (content != expected) {
    throw data_error(w + ": zstd frame holds " + std::to_string(content) + " bytes, expected " +
                     std::to_string(expected));
  }
  size_t frame_len = check_zstd(ZSTD_findFrameCompressedSize(frame, frame_size),
                                (w + ": reading zstd frame").c_str(), ExitCode::kData);
  if (frame_len != frame_size) {
    throw data_error(w + ": " + std::to_string(frame_size - frame_len) +
                     " trailing bytes after the zstd frame");
  }
  size_t n = check_zstd(ZSTD_decompressDCtx(dctx_, dst, expected, frame, frame_size),
                        (w + ": decompressing").c_str(), ExitCode::kData);
  if (n != expected) {
    throw data_error(w + ": decompressed " + std::to_string(n) + " bytes, expected " +
                     std::to_string(expected));
  }
}

}  // namespace rwd::store
