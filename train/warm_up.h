// A restore's first step on a GPU pays for CUDA's lazy setup: the kernels' modules load at
// their first launch, cuBLAS makes its handles, the fused AdamW finds its variant. For
// gpt2-small on an H200 that is 0.75-0.9 s of the first step, on the critical path of every
// bisect worker and every `rewind replay`. DeviceWarmUp does that setup on a thread of its own,
// on a two-layer model of the same shapes (layer 0 under the given plan, layer 1 in FP32, the
// kind of plan a bisect's first probes run), while the restore reads the checkpoint, builds its
// trainer and loads the state. It touches nothing the restored trainer computes with: its own
// parameters, no generator draws (the optimizer's calibration has a generator of its own).
#pragma once

#include <exception>
#include <thread>

#include <torch/types.h>

#include "train/config.h"
#include "train/data.h"
#include "train/model.h"
#include "plan/plan.h"

namespace rwd::train {

class DeviceWarmUp {
 public:
  // Starts the thread when it pays: once per process and GPU, unless REWIND_WARM_UP=0
  // (REWIND_WARM_UP=1 runs it on the CPU too, for tests). `data` must outlive wait().
  DeviceWarmUp(const Config& config, const plan::Plan& plan, const TokenFile& data, torch::Device device,
               AttentionImpl impl);
  ~DeviceWarmUp() { wait(); }
  DeviceWarmUp(const DeviceWarmUp&) = delete;
  DeviceWarmUp& operator=(const DeviceWarmUp&) = delete;
  // Joins the thread. A warm-up that failed leaves the setup to the first step, as before,
  // and says why on stderr once: nothing the restore computes depends on it.
  void wait();
  bool started() const { return thread_.joinable() || ran_; }

 private:
  std::thread thread_;
  std::exception_ptr error_;
  bool ran_ = false;
};

}  // namespace rwd::train
