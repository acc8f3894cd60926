// When a recording takes its checkpoints: at steps 0, K, 2K, ...; one that falls due while
// the checkpoint writer is full is taken at the first later step where it has room (due ones
// meanwhile fold into it), unless the recording waits for the writer instead. Torch-free, so
// its tests need no trainer.
#pragma once

#include <algorithm>
#include <cstdint>

namespace rwd::train {

class CheckpointSchedule {
 public:
  CheckpointSchedule(int every, bool wait_for_writer) : every_(every), wait_(wait_for_writer) {}

  // Whether to checkpoint before step `step`, given whether the writer has room. `at_end`:
  // after the last step, where a due or deferred checkpoint is taken whatever the writer's
  // state. Call once per step, then taken(step) when the checkpoint is taken.
  bool due(int64_t step, bool writer_has_room, bool at_end = false) {
    const bool scheduled = every_ > 0 && step % every_ == 0;
    if (!scheduled && deferred_from_ < 0) return false;
    if (at_end || wait_ || writer_has_room) return true;
    if (deferred_from_ < 0) {
      deferred_from_ = step;
    } else if (scheduled) {
      ++folded_;  // due again before the deferred one was taken: one checkpoint for both
    }
    return false;
  }
  void taken(int64_t step) {
    if (deferred_from_ >= 0) {
      ++late_;
      max_late_ = std::max(max_late_, step - deferred_from_);
    }
    deferred_from_ = -1;
  }

  int late() const { return late_; }              // checkpoints taken after their step
  int folded() const { return folded_; }          // due ones merged into a late one
  int64_t max_late() const { return max_late_; }  // the most steps one was late
  // The step of a due checkpoint deferred and not taken (the run ended first), or -1.
  int64_t pending() const { return deferred_from_; }

 private:
  int every_;
  bool wait_;
  int64_t deferred_from_ = -1;  // step of the due checkpoint not yet taken, or -1
  int late_ = 0, folded_ = 0;
  int64_t max_late_ = 0;
};

}  // namespace rwd::train
