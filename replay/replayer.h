// Re-executes a recorded window from the nearest checkpoint: bit-exact verification against
// the recording, or — with a different plan — the divergence curve (replayed vs recorded).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "train/run_spec.h"
#include "train/trainer.h"
#include "store/store.h"

namespace rwd::replay {

struct ReplayedStep {
  train::StepResult replayed;
  std::optional<store::StepRecord> recorded;
  double step_s = 0;  // the time of train_step alone (not the plan, the record or the callback)
};

struct ReplayResult {
  train::RunSpec run;
  int64_t checkpoint_step = 0;
  std::vector<ReplayedStep> window;  // steps from..to
  double seconds = 0;
  std::string plan_canonical;        // the plan in force in the window (after overrides)
  bool plan_differs = false;         // window plan != recorded plan
  bool world_differs = false;        // replayed on another number of ranks than recorded
};

// Restores the trainer state before step `step` (loads the nearest checkpoint, fast-forwards).
// Shared handles: a warm restore (below) hands out the trainer this process keeps.
struct Restored {
  train::RunSpec run;
  std::shared_ptr<train::TokenFile> data;
  std::shared_ptr<train::Trainer> trainer;
  int64_t checkpoint_step = 0;
};
struct RestoreOptions {
  std::string data_path;  // "" = the recorded path
  bool verify = false;    // compare the fast-forwarded steps with the recording, bit for bit
  // Called after every fast-forwarded step (in_window false) for progress output.
  std::function<void(const train::StepResult&, bool in_window)> on_step;
  train::Comm* comm = nullptr;  // the job's ranks (nullptr: one process)
  // Bisect probes, which restore the same step dozens of times in one process. A warm restore
  // reuses the warm trainer (see below) when the last warm restore was of the same store, run,
  // step, checkpoint, data and ranks: its restore is then a copy of the state kept on the
  // trainer's device, and the model, the CUDA context and the fused optimizer's calibration
  // stay. Otherwise it restores as usual, the checkpoint from the warm cache
  // (read_checkpoint_warm), and becomes the warm trainer. The caller may change only the plan
  // of a warm trainer, and uses it until its next restore_before.
  bool warm = false;
};
Restored restore_before(store::Store& s, int64_t run, int64_t step, const RestoreOptions& o = {});

struct ReplayOptions {
  int64_t run = 0;                      // 0 = the last run in the store
  int64_t from = 0, to = 0;             // inclusive window of steps
  std::optional<std::string> plan;      // applied on top of the recorded plan inside [from, to]
  std::vector<int> capture_layers;      // attention tensors to keep in the window
  bool stop_on_nonfinite = false;       // bisect probes: stop once the loss is NaN/Inf
  // How the window's first step is reached (RestoreOptions, above; warm is not used). Its
  // verify also compares the window's loss / grad-norm / digest bits every step, and its
  // on_step is called for the window's steps too (in_window true). A run recorded on another
  // number of ranks than restore.comm has is replayed with a warning and compared as a
  // divergence curve, not bit for bit.
  RestoreOptions restore;
};

// Throws UsageError for a window outside the recording; Error(kData) for a missing checkpoint,
// a dataset whose fingerprint differs, a store from a different model config; Error(kFinding)
// "replay diverged at step N: ..." on the first verified mismatch.
ReplayResult replay(store::Store& s, const ReplayOptions& o);

// A window of steps run on a restored trainer that stands before `from`.
struct WindowOptions {
  int64_t from = 0, to = 0;                         // inclusive
  std::function<plan::Plan(int64_t step)> plan_at;  // the plan each step runs under
  std::vector<int> capture_layers;                  // attention tensors to keep (train_step)
  bool recorded = true;                             // read each step's row (ReplayedStep::recorded)
  // After each step, with what it replayed (the callback may move from it); false stops the
  // window there.
  std::function<bool(int64_t step, ReplayedStep& rs)> on_step;
};
// Every step of the window sets its plan, trains and reads its recorded row, in that order, so
// that replay, fast-forward and bisect probes run the same bits. Returns the steps run.
int64_t run_window(store::Store& s, Restored& r, const WindowOptions& o);

// Warm probes: a per-process cache of decompressed checkpoints, bounded by
// REWIND_WARM_BYTES (bytes of tensor data, default 8 GiB; 0 turns it off), least recently used
// evicted first. An entry is keyed by the store's path, the run, the step and every tensor's
// name, dtype, shape and content hash, so another store, run or checkpoint never hits. The
// state is exactly what train::read_checkpoint returned (CPU tensors, fresh on a miss).
// The tensors returned are the cached ones (shared handles): read them, never write them or
// keep them past the load (Trainer::load_state copies every tensor into its own).
train::NamedTensors read_checkpoint_warm(store::Store& s, int64_t run, int64_t step);
//
// The warm trainer: one per process, with a copy of its state before the restored
// step (parameters, AdamW moments, generators) on its device; REWIND_WARM_TRAINER=0 turns it
// off. Restoring from it replays the bits of a cold restore (tests/bisect/warm_probe_test.cpp).
struct WarmStats {
  int64_t hits = 0, misses = 0;  // read_checkpoint_warm calls served from / not from the cache
  int64_t bytes = 0;             // tensor bytes held
  int64_t entries = 0;           // checkpoints held
  int64_t capacity = 0;          // REWIND_WARM_BYTES as last read
  int64_t trainer_hits = 0, trainer_misses = 0;  // warm restores that reused / built the trainer
};
WarmStats warm_stats();
void warm_clear();  // drops every entry and the warm trainer, and zeroes the counters

// The per-step series of a window as predicate/report inputs: loss, grad_norm, lr and every
// monitor "L<l>.H<h>.<name>".
std::map<std::string, std::vector<double>> window_series(const std::vector<ReplayedStep>& w);
// The divergence curve as JSON text (per step: replayed vs recorded loss, grad norm).
std::string divergence_json(const ReplayResult& r);

}  // namespace rwd::replay
