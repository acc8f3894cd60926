// The data-parallel gradient exchange in buckets, started while the backward still runs (as
// PyTorch DDP does): each bucket goes through Comm::sum_in_rank_order as soon as the last
// micro-batch's backward has accumulated all its parameters' gradients, so the transfer hides
// behind the backward of the layers before it. The hooks only hand a ready bucket to a thread
// of its own, which queues the collectives and sums: autograd's thread, which queues the
// backward's kernels and bounds a GPU step, does no more work than without buckets. Every element is still summed r0 + r1 + ... in
// rank order, so the bits are those of one exchange after the backward (the property the
// bitwise replays rest on), whatever the bucket sizes and however the exchange interleaves.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "train/dist.h"

namespace torch::autograd {
struct Node;
}

namespace rwd::train {

class GradBuckets {
 public:
  // params: the trainer's parameters in their fixed order (leaves, all on one device).
  // bucket_bytes: FP32 bytes per bucket (parameters in reverse order, the order the backward
  // completes them; a parameter larger than a bucket is a bucket of its own).
  // on_hooks_thread: exchange on the thread that runs the hooks instead of a thread of its own
  // (inside a CUDA graph's capture, where the host's queueing time does not recur).
  GradBuckets(Comm& comm, const std::vector<torch::Tensor>& params, int64_t bucket_bytes, bool on_hooks_thread = false);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Call right before the last local backward of a step: from then on, a bucket whose
  // gradients are all accumulated is exchanged (buckets go in order on every rank: NCCL needs
  // the same sequence of collectives everywhere).
  void arm();
  // Call when a step starts: forgets a step that ended between arm() and finish() (its
  // backward threw), once the exchange thread is idle, so that step's hooks stay disarmed.
  void reset();
  // Call after that backward: exchanges what is left, in order, waits until every bucket's
  // work is queued, and makes the device's current stream wait for it (on CPUs: until it is
  // done). The gradients then hold the sums. Rethrows the exchange thread's error.
  void finish();
  // The environment's bucket size in bytes: REWIND_GRAD_BUCKET_MB (MiB, fractions allowed;
  // default 25, as DDP); 0 turns the overlap off (one exchange after the backward).
  static int64_t bytes_from_env();
  // REWIND_GRAPH_BUCKETS=1: a rank's CUDA graph holds its bucketed exchange (step_graph.h).
  static bool in_graph_from_env();

 private:
  struct Stream;  // the side stream and its events on CUDA (opaque: no CUDA header here)
  void ready(size_t param);            // an accumulated gradient (autograd's thread)
  void launch_ready_locked();          // hands the ready buckets at the front over, in order
  void hand_over_locked(size_t bucket);
  void loop();                         // the exchange thread
  void exchange(size_t bucket);

  Comm& comm_;
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;   // parameter indices, in ready order
  std::vector<size_t> bucket_of_;              // parameter -> bucket
  std::vector<size_t> waiting_;                // per bucket: gradients not yet accumulated
  size_t next_ = 0;                            // the first bucket not yet exchanged
  bool armed_ = false;
  bool inline_ = false;                        // on_hooks_thread
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;   // buckets handed over, not yet exchanged
  size_t exchanged_ = 0;       // buckets exchanged since arm()
  bool busy_ = false;          // the exchange thread is inside exchange()
  bool stop_ = false;
  std::exception_ptr error_;
  // What grad_accumulator returns: std::shared_ptr<Node> in LibTorch 1.x and early 2.x,
  // c10::intrusive_ptr<Node> in 2.15.
  using NodeRef = decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));
  std::vector<NodeRef> accumulators_;  // kept alive: they hold the hooks
  std::vector<uintptr_t> hook_keys_;
  std::unique_ptr<Stream> stream_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace rwd::train
