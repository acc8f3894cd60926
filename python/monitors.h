// The per-head monitors of rewind.attention while a recording asks for them: each call's
// capture kept by layer until a step takes them (python/attention_ext.cpp fills them,
// python/record_ext.cpp's step writer turns them into the step's metrics).
#pragma once

#include <torch/extension.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_op.h"

namespace rwd::python {

// The raw stats of the attention() calls since the last take, by layer: each call's HeadStats
// bytes as a uint8 tensor where they lie (a CUDA call's still on the device, so the caller may
// copy them without waiting).
using LayerStats = std::vector<std::pair<int, std::vector<torch::Tensor>>>;

// A capture for one attention() call of `layer` (stats only), or null while monitoring is off.
// Thread-safe (the compiled ops call it without the GIL).
std::shared_ptr<kernels::AttentionCapture> monitor_capture(int layer);
// Takes (and forgets) the stats of the calls since the last take. Thread-safe.
LayerStats take_monitor_stats();
// The metrics rewind's trainer records (train::Trainer::monitors, less the W_Q spectral norm,
// which needs to know the model's W_Q) per layer and head, from stats on the host: max logit
// (max over the calls), repeated-max row rate and P̄ == 1 count (summed), stable-guard count.
// Needs no GIL (the step writer calls it).
std::vector<std::pair<std::string, double>> monitors_from_stats(const LayerStats& stats);

void bind_monitors(pybind11::module_& m);

}  // namespace rwd::python
