// .npy writer: header per the numpy format spec (NEP 1), data streamed in C order.
#include "store/npy.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "store/store_error.h"

namespace rwd::store {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::string npy_header(Dtype dtype, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '";
  dict += npy_descr(npy_export_dtype(dtype));
  dict += "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // 6 magic + 2 version + 2 length bytes, then the dict padded with spaces and ended by '\n'.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(dict.size());
  out += static_cast<char>(len & 0xFF);
  out += static_cast<char>(len >> 8);
  return out + dict;
}

void write_npy(const std::string& path, Dtype dtype, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes) {
  const uint64_t want = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
  if (want != nbytes) {
    throw StoreError(ExitCode::kInternal, "npy: " + std::to_string(nbytes) +
                                              " bytes do not match shape " + shape_to_json(shape));
  }
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  auto io_error = [&](const char* doing) {
    return data_error(std::string(doing) + " " + path + ": " + std::strerror(errno));
  };
  if (!f) throw io_error("cannot create");
  const std::string header = npy_header(dtype, shape);
  if (std::fwrite(header.data(), 1, header.size(), f.get()) != header.size()) {
    throw io_error("cannot write");
  }
  if (dtype == Dtype::kBF16) {
    // numpy has no bfloat16: widen exactly to float32, in blocks to bound memory.
    const uint8_t* p = static_cast<const uint8_t*>(data);
    std::vector<float> block;
    const size_t n = nbytes / 2;
    for (size_t i = 0; i < n; i += 65536) {
      const size_t m = std::min<size_t>(65536, n - i);
      block.resize(m);
      for (size_t j = 0; j < m; ++j) {
        uint16_t bits;
        std::memcpy(&bits, p + 2 * (i + j), 2);
        block[j] = bf16_to_f32(bits);
      }
      if (std::fwrite(block.data(), sizeof(float), m, f.get()) != m) {
        throw io_error("cannot write");
      }
    }
  } else if (nbytes && std::fwrite(data, 1, nbytes, f.get()) != nbytes) {
    throw io_error("cannot write");
  }
  if (std::fclose(f.release()) != 0) throw io_error("cannot write");
}

}  // namespace rwd::store
