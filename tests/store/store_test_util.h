// Helpers shared by the store tests: a self-deleting temp dir, deterministic bytes and file I/O.
#pragma once

#include <ftw.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "store/content_hash.h"

namespace rwd::store::test {

// mkdtemp'd directory removed (recursively) when the object dies.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/rewind_store_test_XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    ::nftw(
        path_.c_str(),
        [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Incompressible bytes that are a pure function of (seed, size).
inline std::vector<uint8_t> random_bytes(uint64_t seed, size_t size) {
  std::vector<uint8_t> out(size);
  uint64_t state = mix64(seed);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    state = mix64(state);
    std::memcpy(out.data() + i, &state, 8);
  }
  state = mix64(state);
  for (; i < size; ++i, state >>= 8) out[i] = static_cast<uint8_t>(state);
  return out;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "writing " << path;
}

inline std::string file_hash(const std::string& path) {
  std::vector<uint8_t> b = read_file(path);
  return content_hash(b.data(), b.size()) + ":" + std::to_string(b.size());
}

// Size of a file in bytes, -1 if it does not exist.
inline int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace rwd::store::test
