// `--capture` selectors: which steps, layers and heads a recording keeps attention tensors of.
// Torch-free (the recorder uses it; the fuzzer links it without LibTorch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rwd::train {

// `steps=6600:6620;L2.H*` (or `steps=5;L0,L1.H{1,3}`): which steps, layers and heads keep
// their attention tensors Q, K, V, O, LSE, dO, delta, and the layer input X (head -1).
struct CaptureSpec {
  int64_t from = -1, to = -1;               // inclusive; -1: nothing
  std::vector<int> layers;                  // layers to keep
  std::vector<std::vector<int>> heads;      // per entry of `layers`: heads to keep
  static CaptureSpec parse(const std::string& spec, int n_layer, int n_head);
  bool active(int64_t step) const { return step >= from && step <= to; }
};

}  // namespace rwd::train
