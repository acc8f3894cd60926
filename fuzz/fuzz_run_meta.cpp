// Fuzz target: a store's runs.meta JSON (train::RunMeta::parse, read by every command that
// opens a recorded run). Bad text must give one rwd::Error; what parses must hold values in
// the documented ranges.
#include "fuzz/fuzz_util.h"
#include "train/run_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = rwd::fuzz::as_text(data, size);
  rwd::fuzz::expect_clean([&] {
    const rwd::train::RunMeta m = rwd::train::RunMeta::parse(text);
    rwd::fuzz::require(m.threads >= 1 && m.world_size >= 1 && m.checkpoint_every >= 0 &&
                           m.digest_every >= 0 && m.recorded_numerics >= 1,
                       "a parsed value is outside its range", text);
  });
  return 0;
}
