// Host copies of a training state taken without stopping training, for checkpoints: what
// train::Recorder (rewind's trainer) and rewind.record (a user's Python loop,
// python/record_ext.cpp) hand their checkpoint writer.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "train/tensor_io.h"

namespace rwd::train {

// A device copy of the state (GPU runs, where free memory allows). A checkpoint copies the
// state there on the training stream (1.5 GB: about a millisecond on an H200) and the pinned
// copy reads the snapshot on a side stream, so the next optimizer update no longer waits for
// the state to cross PCIe (30-60 ms). last_copy: the previous device-to-host copy's event
// (an at::cuda::CUDAEvent), which the next snapshot waits for before overwriting. off: too
// little free memory or a failed allocation: the state is copied to the host directly and
// the next update waits for that copy.
struct DeviceSnapshot {
  std::vector<torch::Tensor> bufs;
  std::shared_ptr<void> last_copy;
  bool off = false;
};

class StateStager {
 public:
  struct Staged {
    NamedTensors host;                // the state's names, each with its host copy
    std::function<void()> wait_ready;  // blocks until the host copies hold the bytes (empty: they do)
  };
  // Host tensors of `state` are cloned on this thread. Device tensors are copied into pinned
  // host buffers on a side stream, after the work queued so far on the current stream and
  // overlapping what is queued after it, through the device snapshot where there is one.
  // Without a snapshot the state's next in-place update must wait for the copy on the device:
  // `set_before_update` receives what makes the current stream wait (and an empty function
  // where the snapshot makes that needless); without `set_before_update` the current stream
  // is made to wait at once (the host never waits).
  //
  // Two sets of pinned buffers are used in turn (a device-to-host copy into reused pinned
  // memory runs at PCIe speed, while a fresh pageable copy of gpt2-small's 1.5 GB state took
  // 0.4-1.1 s of the training thread: allocation and first touch). Set k % 2 is reused by
  // the stage call k + 2: the caller must have finished with the staged copies of call k by
  // then (its checkpoint writer holds at most one job behind the one it runs, and waits for
  // room before staging). The second set is allocated on a helper thread while training runs
  // on from the first checkpoint (1.5 GB of pinned memory takes ~1 s to allocate).
  Staged stage(const NamedTensors& state, const std::function<void(std::function<void()>)>& set_before_update = {});

 private:
  std::vector<torch::Tensor> pinned_[2];
  int pinned_next_ = 0;
  std::future<std::vector<torch::Tensor>> pinned_spare_;
  DeviceSnapshot snapshot_;
};

}  // namespace rwd::train
