// Fuzz target: the nanoGPT checkpoint reader of `rewind import nanogpt` (interop/): the
// pickle program of a ckpt.pt (its data.pkl) run by our pickle reader, then mapped onto
// rewind's model and AdamW state. Tensor storages "data/0".."data/999" exist and hold 64 KiB
// of zeros (enough for the seeds: small nanoGPT checkpoints the tests' fixture writes); any
// other record is missing. Bad input must give one rwd::Error (InteropError or a config one).
#include <vector>

#include "fuzz/fuzz_util.h"
#include "interop/nanogpt.h"

namespace {

std::optional<std::pair<at::DataPtr, size_t>> zero_record(const std::string& name) {
  static std::vector<char> zeros(64 << 10);
  const std::string digits = name.rfind("data/", 0) == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::make_pair(at::DataPtr(zeros.data(), c10::Device(c10::kCPU)), zeros.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string pickle = rwd::fuzz::as_text(data, size);
  rwd::fuzz::expect_clean([&] {
    const c10::IValue root = rwd::interop::read_pickle(pickle, zero_record);
    rwd::interop::nanogpt_checkpoint(root, "fuzz input");
  });
  return 0;
}
