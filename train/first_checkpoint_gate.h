// FirstCheckpointGate: the order of a recording's first commits (train::Recorder and the
// Python extension's ScriptRecording).
#pragma once

#include <future>
#include <memory>
#include <stdexcept>

namespace rwd::train {

// Holds back the steps queued after a recording's first checkpoint until that checkpoint is
// committed: the step and checkpoint writers commit on connections of their own, so without it
// a recording killed while its first checkpoint is written can leave steps and no checkpoint to
// replay or resume them from. Steps before it never wait (its job waits for them).
class FirstCheckpointGate {
 public:
  // On the loop's thread as a checkpoint is queued: what its job settles (set_value once
  // committed, set_exception if it failed), or null after the first. A job dropped unsettled
  // breaks the promise, which the waiting steps see as an error.
  std::shared_ptr<std::promise<void>> arm() {
    if (first_.valid()) return nullptr;
    auto p = std::make_shared<std::promise<void>>();
    first_ = p->get_future().share();
    return p;
  }
  // What a step job queued now waits on: pass() returns once the first checkpoint is
  // committed (at once if none was queued before the step), or rethrows its failure.
  std::shared_future<void> ticket() const { return first_; }
  static void pass(const std::shared_future<void>& t) {
    if (!t.valid()) return;
    try {
      t.get();
    } catch (const std::future_error&) {  // its job was dropped behind an earlier failure
      throw std::runtime_error("the first checkpoint was never written");
    }
  }

 private:
  std::shared_future<void> first_;
};

}  // namespace rwd::train
