// Writes a training run into a store: one transaction per step (batch, RNG, lr, loss and
// grad-norm bits, digest, monitors, captured attention tensors) and the checkpoints, each kind
// written by a background thread on a connection of its own (store::StoreWorker), so training
// waits neither for compression nor for SQLite's write lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "train/capture_spec.h"
#include "train/checkpoint_schedule.h"
#include "train/first_checkpoint_gate.h"
#include "train/state_stager.h"
#include "train/trainer.h"
#include "store/store.h"
#include "store/store_worker.h"
#include "store/writer_lock.h"

namespace rwd::train {

struct RecordOptions {
  int checkpoint_every = 20;  // K: checkpoints at steps 0, K, 2K, ...
  // A checkpoint that falls due while the writer still has one waiting behind the one it is
  // writing is taken at the first later step where the writer has room (false: training never
  // waits for the writer), or waited for (true: checkpoints exactly K apart).
  bool wait_for_writer = false;
  int digest_every = 1;       // N: parameter digest every N steps
  bool full_batches = false;  // store the batch tokens, not only offsets + hash
  CaptureSpec capture;
  // Checkpoints kept: after each checkpoint is committed, the checkpoint writer
  // deletes those the rule drops (Store::thin: never one a stored bisect probe needs), in one
  // transaction of its own. Their pages are reused by the next checkpoints, so the file stays
  // flat; `rewind store thin` gives free pages back to the file system.
  store::Retention retention;
};

// Whether a recording with --digest-every N stores the parameter digest after `step`: known to
// every rank of a job, which all compute the digest then and compare it with rank 0's.
inline bool digest_due(int digest_every, int64_t step) { return digest_every > 0 && (step + 1) % digest_every == 0; }

class Recorder {
 public:
  // Takes the store's writer lock (store::WriterLock: a recording or `store thin` already
  // writing it is a one-line StoreError) and opens two connections of its own to the store
  // at `store_path` (one per writer thread).
  Recorder(const std::string& store_path, int64_t run, const RecordOptions& o, const store::StoreOptions& so);
  ~Recorder();  // commits what is queued (steps, then checkpoints) unless a write failed
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Records the step that just ran. `digest`: the parameter digest after the step (called on
  // the step writer's thread: StepResult::digest), or empty. Copies what the step row
  // needs (device tensors to the host) and queues it for the step writer, which commits it in
  // one transaction; waits only while 256 steps are queued. Throws if an earlier write failed.
  void record_step(const StepResult& r, std::function<std::string()> digest, const TokenFile& data,
                   int block_size);
  // Whether to checkpoint before step `step` (CheckpointSchedule, asked with whether the
  // checkpoint writer has room and the stager its buffers). `at_end`: after the last step.
  bool checkpoint_due(int64_t step, bool at_end = false);
  // Snapshots the trainer's state and queues it for the checkpoint writer. Host tensors are
  // copied on this thread. Device tensors are copied into pinned host buffers on a side
  // stream, after the work already queued and overlapping the next forward and backward;
  // the trainer's next optimizer update waits for the copy on the device (set_before_update),
  // and the writer waits for it before reading the buffers. The writer commits the checkpoint
  // only after every step recorded before it, so a checkpoint at step s in the store always
  // follows steps < s (what resuming a killed recording relies on), and steps recorded after
  // the first checkpoint this recorder queues commit only once that checkpoint is in the
  // store: a recording killed at any moment leaves no step without a checkpoint to replay it
  // from (a store with neither is a stub `--record` replaces).
  void checkpoint(int64_t step, Trainer& trainer);
  void flush();  // blocks until every queued step and checkpoint is committed; rethrows an error
  // record_step, checkpoint and flush rethrow a write that failed because the disk is full,
  // the store became read-only, or its file was deleted or moved as one line saying what the
  // store holds, after reading it back and verifying it, e.g. `store: disk full while writing
  // step 7; the store holds steps 0..6 (checkpoints 0, 5) and verifies` (StoreError kData).

  bool wants_digest(int64_t step) const { return digest_due(opt_.digest_every, step); }
  const RecordOptions& options() const { return opt_; }
  // What recording cost, to read after flush(): checkpoints queued, how many of them were
  // taken late (and by how many steps at most) and how many due ones were folded into a late
  // one, the training thread's time copying checkpoints and waiting for room in either
  // writer's queue, and each writer's own time.
  struct Costs {
    int checkpoints = 0, late = 0, folded = 0;
    int64_t max_late_steps = 0;
    double snapshot_seconds = 0, checkpoint_waited_seconds = 0, step_waited_seconds = 0;
    double checkpoint_writer_seconds = 0, step_writer_seconds = 0;
    // Retention: checkpoints deleted, their blobs' stored bytes, the checkpoint writer's time.
    int thinned = 0;
    int64_t thinned_bytes = 0;
    double thin_seconds = 0;
  };
  Costs costs();

 private:
  // Runs `body`; rethrows a write failure as described above (explain).
  template <class F>
  void guard(F&& body);
  [[noreturn]] void explain(const store::StoreError& e);

  std::string path_;
  int64_t run_;
  RecordOptions opt_;
  // The step (or checkpoint step) whose write failed, -1 while none has; set by the writers.
  std::atomic<int64_t> failed_step_{-1}, failed_checkpoint_{-1};
  // Retention's part of the costs, counted by the checkpoint writer.
  std::atomic<int> thinned_{0};
  std::atomic<int64_t> thinned_bytes_{0}, thin_micros_{0};
  Costs costs_;                    // training thread's part
  FirstCheckpointGate first_checkpoint_;  // before the writers: their last jobs use it
  CheckpointSchedule schedule_;
  StateStager stager_;  // the checkpoints' host copies (pinned buffers, device snapshot)
  // Declared in this order so the checkpoint writer, whose jobs wait for the step writer,
  // stops first, and the lock is let go last.
  store::WriterLock lock_;
  store::StoreWorker steps_;
  store::StoreWorker checkpoints_;
};

}  // namespace rwd::train
