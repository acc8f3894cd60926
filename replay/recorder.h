// Writes a training run into a store: one transaction per step (batch, RNG, lr, loss and
// grad-norm bits, digest, monitors, captured attention tensors) and checkpoints written by a
// background thread on its own connection, so training never waits for compression.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "replay/trainer.h"
#include "store/store.h"

namespace rwd::replay {

// `steps=6600:6620;L2.H*` (or `steps=5;L0,L1.H{1,3}`): which steps, layers and heads keep
// their attention tensors Q, K, V, O, LSE, dO, delta, and the layer input X (head -1).
struct CaptureSpec {
  int64_t from = -1, to = -1;               // inclusive; -1: nothing
  std::vector<int> layers;                  // layers to keep
  std::vector<std::vector<int>> heads;      // per entry of `layers`: heads to keep
  static CaptureSpec parse(const std::string& spec, int n_layer, int n_head);
  bool active(int64_t step) const { return step >= from && step <= to; }
};

struct RecordOptions {
  int checkpoint_every = 20;  // K: checkpoints at steps 0, K, 2K, ...
  int digest_every = 1;       // N: parameter digest every N steps
  bool full_batches = false;  // store the batch tokens, not only offsets + hash
  CaptureSpec capture;
};

class Recorder {
 public:
  Recorder(store::Store& s, const std::string& store_path, int64_t run, const RecordOptions& o,
           const store::StoreOptions& so);
  ~Recorder();  // waits for pending checkpoints
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Records the step that just ran. `digest`: parameter digest after the step, or "".
  void record_step(const StepResult& r, const std::string& digest, const TokenFile& data,
                   int block_size);
  // Snapshots the trainer's state and queues it for the background writer. Host tensors are
  // copied on this thread. Device tensors are copied into pinned host buffers on a side
  // stream, after the work already queued and overlapping the next forward and backward;
  // the trainer's next optimizer update waits for the copy on the device (set_before_update),
  // and the writer waits for it before reading the buffers.
  void checkpoint(int64_t step, Trainer& trainer);
  void flush();  // blocks until every queued checkpoint is committed; rethrows its error

  bool wants_checkpoint(int64_t step) const {
    return opt_.checkpoint_every > 0 && step % opt_.checkpoint_every == 0;
  }
  bool wants_digest(int64_t step) const {
    return opt_.digest_every > 0 && (step + 1) % opt_.digest_every == 0;
  }
  const RecordOptions& options() const { return opt_; }
  // Checkpoint costs, to read after flush(): how many were queued, the training thread's time
  // copying them and waiting for room in the writer's queue, and the writer's own time.
  struct CheckpointCosts {
    int count = 0;
    double snapshot_seconds = 0, waited_seconds = 0, writer_seconds = 0;
  };
  CheckpointCosts checkpoint_costs();

 private:
  void writer_loop();

  store::Store& store_;
  int64_t run_;
  RecordOptions opt_;
  store::Store writer_store_;  // own connection for the background thread
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    int64_t step = 0;
    NamedTensors state;
    std::function<void()> wait_ready;  // blocks until the snapshot's bytes are on the host
  };
  std::deque<Job> queue_;
  bool stop_ = false;
  bool busy_ = false;
  std::string error_;
  double ckpt_seconds_ = 0;                         // writer thread, under mu_
  int ckpt_count_ = 0;                              // training thread
  double snapshot_seconds_ = 0, waited_seconds_ = 0;  // training thread
  // Page-locked host buffers for device tensors, two sets used in turn: a device-to-host copy
  // into reused pinned memory runs at PCIe speed, while a fresh pageable copy of gpt2-small's
  // 1.5 GB state took 0.4-1.1 s of the training thread (allocation and first touch). Set
  // k % 2 is free again when checkpoint k + 2 is taken: checkpoint() first waits until the
  // writer took checkpoint k + 1 from the queue, so it has finished checkpoint k.
  std::vector<torch::Tensor> pinned_[2];
  int pinned_next_ = 0;
  std::thread thread_;
};

}  // namespace rwd::replay
