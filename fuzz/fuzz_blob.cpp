// Fuzz target: the pieces of the store reader below SQLite, on bytes an attacker controls in a
// store file: a blob's zstd frame (exact size, checksum, no trailing bytes) and byte unshuffle,
// a tensor row's dtype name and JSON shape, and the .npy header made from them.
// Input: 1 byte element size selector, 2 bytes expected raw size, then the frame; or, when the
// first byte is odd, a row text "dtype|shape".
#include <vector>

#include "fuzz/fuzz_util.h"
#include "store/byte_shuffle.h"
#include "store/dtype.h"
#include "store/npy.h"
#include "store/zstd_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  if (data[0] & 1) {
    const std::string row = rwd::fuzz::as_text(data + 1, size - 1);
    const size_t bar = row.find('|');
    rwd::fuzz::expect_clean([&] {
      const rwd::store::Dtype dtype = rwd::store::dtype_from_name(row.substr(0, bar));
      const std::vector<int64_t> shape =
          rwd::store::shape_from_json(bar == std::string::npos ? "[]" : row.substr(bar + 1));
      rwd::fuzz::require(rwd::store::shape_from_json(rwd::store::shape_to_json(shape)) == shape,
                         "shape JSON round trip differs", row);
      const std::string header = rwd::store::npy_header(dtype, shape);
      rwd::fuzz::require(header.size() % 64 == 0, "npy header not 64-byte aligned", row);
      rwd::store::shape_numel(shape);
    });
    return 0;
  }
  static const size_t kElem[] = {1, 2, 4, 8};
  const size_t elem = kElem[(data[0] >> 1) & 3];
  const size_t expected = size_t(data[1]) | (size_t(data[2]) << 8);
  std::vector<uint8_t> raw(expected), out(expected);
  rwd::fuzz::expect_clean([&] {
    rwd::store::ZstdDecompressor d;
    d.decompress(data + 3, size - 3, raw.data(), expected, "fuzzed frame");
    rwd::store::byte_unshuffle(raw.data(), expected, elem, out.data());
    std::vector<uint8_t> back(expected);
    rwd::store::byte_shuffle(out.data(), expected, elem, back.data());
    rwd::fuzz::require(back == raw, "shuffle(unshuffle(x)) != x", "frame");
  });
  return 0;
}
