// Runs batches of bisect probes: answers from the store's probe cache first, then runs the rest
// in this process (--jobs 1), on the job's ranks (--nproc-per-node N: rank 0 hands each probe to
// the others, which follow), or in long-lived worker processes, one per slot (--jobs N, --gpus
// LIST), each keeping its CUDA context and warm trainer from probe to probe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bisect/probe.h"

namespace rwd::bisect {

struct PoolOptions {
  int jobs = 1;                    // concurrent worker processes; 1 = run in this process
  std::vector<std::string> gpus;   // CUDA_VISIBLE_DEVICES per worker slot (round robin)
  bool fresh = false;              // ignore cached probes (they are still overwritten)
  // Worker executable: `<exe> bisect __probe --store S --serve`. Workers are started with
  // posix_spawn (fork+exec): LibTorch and OpenMP are not fork-safe without exec.
  std::string exe = "/proc/self/exe";
  // The job's ranks (not owned; nullptr: one process). Set on rank 0, whose pool runs every
  // probe on all ranks (jobs must be 1); the other ranks run follow_probes.
  train::Comm* comm = nullptr;
  // Runs a probe's window elsewhere (bisect --cmd: the user's script) instead of this
  // process's trainer; its report is judged by judge_probe. With jobs G > 1 the probes of a
  // batch run on G threads at once, `slot` (0..G-1) naming the thread: the runner of a slot is
  // called by one thread at a time. The runner asks `watch` after each step of the window it
  // has seen, in order, until it says kStop (an early verdict) or kCut (a race decided).
  std::function<ExternalRun(const ProbeSpec&, const train::RunSpec&, int slot, const StepWatch& watch)> runner;
  // The runner ends a probe where its watch says so (a served script); false: it runs each
  // window whole and only drops the steps after the verdict, so races would save nothing.
  bool runner_stops = false;
  // Part of every probe's cache key when not empty (bisect --cmd: the command, so that another
  // script's probes are other probes).
  std::string key_extra;
  // Ranks of each worker: an N-rank recording's probes run on G groups of N ranks,
  // each a worker whose rank 0 serves the probes and whose other ranks follow it (jobs G, the
  // gpus list giving rank r of slot s gpus[s * N + r]). Races need cuts, which ranks lack: none.
  int ranks = 1;
};

class ProbePool {
 public:
  ProbePool(store::Store& s, const train::RunSpec& run, const Predicate& pred,
            PoolOptions options);
  // With ranks: tells them that no probe follows (release_ranks), unless a probe was cut short
  // by an error (the ranks are then inside its collectives and end with the job). Workers: their
  // input is closed (an idle one ends), and one still inside a probe is killed.
  ~ProbePool();
  ProbePool(const ProbePool&) = delete;
  ProbePool& operator=(const ProbePool&) = delete;

  // Outcomes in the order of `batch`; duplicate keys inside a batch run once. With
  // stop_after_fails > 0 (a race), once that many of the batch have failed (cached
  // ones count) the probes still running are cut short and those not started are not run:
  // their outcomes say `cut` (no verdict) and nothing of them is stored.
  std::vector<ProbeOutcome> run(const std::vector<ProbeSpec>& batch, int stop_after_fails = 0);

  // With ranks: the followers' end (an empty message); later probes are refused.
  void release_ranks();

  int executed() const { return executed_; }  // started by this invocation, cut ones included
  int cut() const { return cut_; }            // of those, cut short by a race
  int skipped() const { return skipped_; }    // never started: a race was decided first
  int cached() const { return cached_; }
  // Called for every probe as it becomes known (cached ones included), in batch order.
  std::function<void(const ProbeSpec&, const ProbeOutcome&)> on_done;

 private:
  std::vector<ProbeOutcome> run_workers(const std::vector<ProbeSpec>& todo, int stop_after_fails);
  // The runner's probes of a batch on `jobs` threads; outcomes judged and stored in order.
  // With stop_after_fails > 0, a race: once that many have failed the rest are cut short.
  std::vector<ProbeOutcome> run_external(const std::vector<ProbeSpec>& todo, int stop_after_fails);
  struct Worker {
    pid_t pid = -1;
    int to = -1, from = -1;   // its probe input (our write end), its replies (our read end)
    std::string replies;      // bytes read, not yet a whole line
    bool busy = false;
    long serial = 0;          // probes handed to it so far (the one it runs: this one)
    bool cutting = false;     // asked to cut its probe short
    bool warming = false;     // getting ready (a warm-up: restore only), no probe
    bool warmed = false;      // has run a probe or a warm-up
    std::vector<pid_t> followers;  // a group's ranks 1.. (PoolOptions::ranks)
  };
  void start_workers();
  void stop_workers();
  std::string key(const ProbeSpec& p) const;

  store::Store& store_;
  const train::RunSpec& run_;
  const Predicate& pred_;
  PoolOptions options_;
  int world_ = 1;           // ranks each probe runs on
  bool in_probe_ = false;   // a probe on the ranks has started and not finished
  bool released_ = false;
  int executed_ = 0, cached_ = 0, cut_ = 0, skipped_ = 0;
  std::vector<Worker> workers_;
  std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();
  double since_began() const;
};

// Collects the workers that stopped pools told to end and that have ended, without waiting for
// the others (ProbePool's destructor does not wait either: a GPU worker's end, its CUDA context
// torn down, took 0.3 s that the bisect's exit waited for on 2 H200s).
void reap_ended_workers();

// The hidden worker: `rewind bisect __probe --store S --probe JSON` runs one probe and writes it
// into the store's probe cache. With `--serve FD` instead of --probe it runs every probe read
// from standard input (one JSON line each) until its end, writing "done", "cut" or "error: WHY"
// a line to FD after each. SIGUSR1 queued with the value n (sigqueue) cuts its n-th probe short
// (1-based; a signal for a probe already done is ignored). Under WORLD_SIZE > 1 it is rank 0 of
// a worker group: it connects the group on `device` and hands every line to the other ranks
// (`__probe --follow`, follow_probes), then releases them at the end. Returns the exit code.
int probe_worker(const std::string& store_path, const std::string& probe_json);
int probe_server(const std::string& store_path, int reply_fd, const std::string& device = "cpu");

// Ranks 1..N-1 of a bisect job, or of a worker group: run every probe (and warm-up) rank 0
// hands out, in lockstep with it, until it releases them. The store is opened read-only: rank 0 alone writes probes, the log
// and the report. Returns the exit code (0).
int follow_probes(const std::string& store_path, train::Comm& comm);

}  // namespace rwd::bisect
