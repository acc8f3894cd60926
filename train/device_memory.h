// Peak GPU memory of the run: what LibTorch's CUDA caching allocator held on the training
// device, for `rewind train`'s closing line and the memory table
// (experiments/train_bench/memory_bench.sh).
#pragma once

#include <torch/types.h>

#include <string>

namespace rwd::train {

// "peak GPU memory: 9.81 GiB allocated, 10.52 GiB reserved (cuda:0)": the caching allocator's
// peaks on `device` since the process started (as torch.cuda.max_memory_allocated() /
// max_memory_reserved() report them: model, optimizer state, activations and the recorder's
// device snapshots; not the CUDA context). "" for a CPU device or a build without REWIND_CUDA.
std::string peak_memory_report(const torch::Device& device);

}  // namespace rwd::train
