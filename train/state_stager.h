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

class StateStager {
 public:
  struct Staged {
    // Run on the checkpoint writer's thread: the state's names, in order, each with its host
    // copy, once the copies hold the bytes.
    std::function<NamedTensors()> take;
    double buffer_seconds = 0;  // the calling thread's time allocating or awaiting buffers
  };
  // Host tensors of `state` are cloned on this thread. Device tensors go one of two ways:
  //
  // - Through a device snapshot (GPU runs, where free memory allows): the state is copied
  //   there on the current stream (1.5 GB: about a millisecond on an H200) and training goes
  //   on; take() copies the snapshot into host buffers of the writer's own (plain memory,
  //   allocated on the writer's thread when the state's tensors change) through two pinned
  //   32 MiB chunks on a side stream, and frees the snapshot for the next checkpoint. The
  //   calling thread allocates no host memory: 2-6 ms a gpt2-small checkpoint on an H200, where
  //   buffers allocated on the loop's thread took 0.7-1.0 s at each change of the state's
  //   tensors (AdamW makes its moments at the first step). One pinned block for the whole state,
  //   allocated on the writer's thread, stalled the loop's CUDA calls for 0.67 s on an H200 host
  //   (the driver's lock); a pageable copy straight from the device stalled every checkpoint.
  // - Without one: copied into pinned buffers on a side stream, and the state's next in-place
  //   update must wait for the copy on the device: `set_before_update` receives what makes the
  //   current stream wait; without it the current stream is made to wait at once. Two buffer
  //   sets are used in turn; set k % 2 is reused by call k + 2, so the caller must have
  //   finished with call k's copies by then (its writer holds at most one job behind the one it
  //   runs, and waits for room before staging).
  //
  // The host never waits for the device here; it waits only where the snapshot still holds
  // the last checkpoint, which ready() tells beforehand.
  Staged stage(const NamedTensors& state, const std::function<void(std::function<void()>)>& set_before_update = {});

  // Whether stage() would not wait: false while the snapshot holds a state whose host copy
  // has not been taken, or the second pinned set is still being allocated (a checkpoint due
  // then is better deferred than waited for).
  bool ready() const;

  struct Snapshot;  // shared with the writer's take(): the device copy, the writer's pinned set

 private:
  std::shared_ptr<Snapshot> snap_;
  std::vector<torch::Tensor> pinned_[2];  // without a snapshot: the sets used in turn
  int pinned_next_ = 0;
  std::future<std::vector<torch::Tensor>> pinned_spare_;
};

}  // namespace rwd::train
