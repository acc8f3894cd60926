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

struct ReplayOptions {
  int64_t run = 0;                      // 0 = the last run in the store
  int64_t from = 0, to = 0;             // inclusive window of steps
  std::optional<std::string> plan;      // applied on top of the recorded plan inside [from, to]
  bool verify = false;                  // compare loss / grad-norm / digest bits every step
  std::string data_path;                // "" = the recorded path
  std::vector<int> capture_layers;      // attention tensors to keep in the window
  bool stop_on_nonfinite = false;       // bisect probes: stop once the loss is NaN/Inf
  // Called after every re-executed step (fast-forward included) for progress output.
  std::function<void(const train::StepResult&, bool in_window)> on_step;
  // The job's ranks (nullptr: one process). A run recorded on another number of ranks is
  // replayed with a warning and compared as a divergence curve, not bit for bit.
  train::Comm* comm = nullptr;
};

struct ReplayedStep {
  train::StepResult replayed;
  std::optional<store::StepRecord> recorded;
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

// Throws UsageError for a window outside the recording; Error(kData) for a missing checkpoint,
// a dataset whose fingerprint differs, a store from a different model config; Error(kFinding)
// "replay diverged at step N: ..." on the first verified mismatch.
ReplayResult replay(store::Store& s, const ReplayOptions& o);

// Restores the trainer state before step `step` (loads the nearest checkpoint, fast-forwards).
struct Restored {
  train::RunSpec run;
  std::unique_ptr<train::TokenFile> data;
  std::unique_ptr<train::Trainer> trainer;
  int64_t checkpoint_step = 0;
};
// comm: the job's ranks (nullptr: one process).
Restored restore_before(store::Store& s, int64_t run, int64_t step, const std::string& data_path,
                        bool verify, const std::function<void(const train::StepResult&, bool)>& on_step,
                        train::Comm* comm = nullptr);

// The per-step series of a window as predicate/report inputs: loss, grad_norm, lr and every
// monitor "L<l>.H<h>.<name>".
std::map<std::string, std::vector<double>> window_series(const std::vector<ReplayedStep>& w);
// The divergence curve as JSON text (per step: replayed vs recorded loss, grad norm).
std::string divergence_json(const ReplayResult& r);

}  // namespace rwd::replay
