// Regression driver for the fuzz targets without libFuzzer (ctest, gcc build): feeds every file
// of the given directories (corpus seeds and the inputs that once crashed) to the target's
// LLVMFuzzerTestOneInput. A crash, sanitizer report or violated property aborts the test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t inputs = 0;
  for (int a = 1; a < argc; ++a) {
    if (!fs::exists(argv[a])) continue;  // e.g. no regression for this target yet
    if (!fs::is_directory(argv[a])) {
      std::fprintf(stderr, "fuzz replay: %s is not a directory\n", argv[a]);
      return 2;
    }
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(argv[a])) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++inputs;
    }
  }
  std::printf("fuzz replay: %zu inputs, no crash\n", inputs);
  return inputs > 0 ? 0 : 1;
}
