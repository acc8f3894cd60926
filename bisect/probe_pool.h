// Runs batches of bisect probes: answers from the store's probe cache first, then runs the rest
// in this process (--jobs 1) or in worker processes, one probe each (--jobs N, --gpus LIST).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bisect/probe.h"

namespace rwd::bisect {

struct PoolOptions {
  int jobs = 1;                    // concurrent worker processes; 1 = run in this process
  std::vector<std::string> gpus;   // CUDA_VISIBLE_DEVICES per worker slot (round robin)
  bool fresh = false;              // ignore cached probes (they are still overwritten)
  // Worker executable and the arguments before the probe: `<exe> bisect __probe`. Workers are
  // started with posix_spawn (fork+exec): LibTorch and OpenMP are not fork-safe without exec.
  std::string exe = "/proc/self/exe";
};

class ProbePool {
 public:
  ProbePool(store::Store& s, const train::RunSpec& run, const Predicate& pred,
            PoolOptions options);

  // Outcomes in the order of `batch`; duplicate keys inside a batch run once.
  std::vector<ProbeOutcome> run(const std::vector<ProbeSpec>& batch);

  int executed() const { return executed_; }
  int cached() const { return cached_; }
  // Called for every probe as it becomes known (cached ones included), in batch order.
  std::function<void(const ProbeSpec&, const ProbeOutcome&)> on_done;

 private:
  std::vector<ProbeOutcome> run_workers(const std::vector<ProbeSpec>& todo);

  store::Store& store_;
  const train::RunSpec& run_;
  const Predicate& pred_;
  PoolOptions options_;
  int executed_ = 0, cached_ = 0;
};

// The hidden worker: `rewind bisect __probe --store S --probe JSON`. Runs one probe and writes
// it into the store's probe cache. Returns the exit code.
int probe_worker(const std::string& store_path, const std::string& probe_json);

}  // namespace rwd::bisect
