// Fuzz target: the `--capture` selector (train::CaptureSpec::parse). The first byte picks the
// model size; whatever parses must name only layers and heads that exist and a non-empty range.
#include "fuzz/fuzz_util.h"
#include "train/capture_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int n_layer = 1 + (data[0] & 15), n_head = 1 + (data[0] >> 4);
  const std::string spec = rwd::fuzz::as_text(data + 1, size - 1);
  rwd::fuzz::expect_clean([&] {
    const rwd::train::CaptureSpec c = rwd::train::CaptureSpec::parse(spec, n_layer, n_head);
    rwd::fuzz::require(c.layers.size() == c.heads.size(), "layers and heads differ in length", spec);
    rwd::fuzz::require(spec.empty() || c.from <= c.to, "empty step range accepted", spec);
    for (size_t i = 0; i < c.layers.size(); ++i) {
      rwd::fuzz::require(c.layers[i] >= 0 && c.layers[i] < n_layer, "layer out of range", spec);
      for (int h : c.heads[i]) rwd::fuzz::require(h >= 0 && h < n_head, "head out of range", spec);
    }
  });
  return 0;
}
