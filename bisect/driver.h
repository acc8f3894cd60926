// `rewind bisect` as a library: time bisection over checkpoints (find the causal window), then
// layer/head/op narrowing of a window with the search engine, fix checks, and the report data.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bisect/probe.h"
#include "bisect/probe_pool.h"
#include "bisect/report_near_miss.h"
#include "bisect/search.h"
#include "common/progress.h"

namespace rwd::bisect {

struct BisectOptions {
  std::string store_path;
  int64_t run = 0;                             // 0 = the last run
  std::optional<std::pair<int64_t, int64_t>> window;  // --window A:B
  std::string fail;                            // failure predicate text
  PoolOptions pool;                            // --jobs, --gpus, --fresh, the ranks
  bool find_window = false;                    // --find-window
  std::optional<int64_t> until;                // --until F
  bool window_only = false;                    // --window-only
  std::string fix = kFullPrecision;            // --fix PLAN of the time probes
  std::string reference = kFullPrecision;      // --reference PLAN: what candidates promote towards
  bool group_testing = true;                   // --search cheap (default) | groups | ddmin
  bool cheap_direction = true;                 // --search cheap (issue 26; the default since issue 36)
  bool progress = true;                        // progress line on stderr
  // The run as the probes see it, when rewind's trainer did not record it (bisect --cmd: a
  // script's run, its layers, heads and plan schedule); otherwise loaded from the store.
  std::optional<train::RunSpec> run_spec;
  // Only the attention ops are under the plan (a script's run: rewind.attention is the op a
  // plan reaches; its Linear, LayerNorm and head are the script's own): modules and the model
  // head are left out of the search.
  bool attention_only = false;
};

// One probe as the report sees it: what was asked, in which phase, and the answer.
struct ProbeEntry {
  int index = 0;
  std::string phase;  // "time", "check", "failing/layers", ..., "fix"
  ProbeSpec spec;
  ProbeOutcome outcome;
  // Cost in recorded steps (issue 26), NaN where unknown: predicted by the cost model (probes
  // of a candidate set), and measured: its training-step time over the recorded plan's
  // per-step time measured in this bisect (BisectReport::recorded_step_s).
  double predicted_cost = 0, measured_cost = 0;
  // The probe whose set this one's was split from (the engine's Probe::parent as an index into
  // BisectReport::probes; issue 35's narrowing tree); -1: a root (checks, time and fix probes).
  int parent = -1;
};

// Time bisection over checkpoints (issue 9).
struct TimeSearch {
  enum class Status {
    kWindow,        // c* found: the causal window is [c*, F]
    kBakedIn,       // the fix replay from the earliest checkpoint still fails
    kNotPrecision,  // ... and that checkpoint is the first step of the run
    kNoFailure,     // the recorded run never fails the predicate (no --until given)
  };
  Status status = Status::kWindow;
  int64_t fail_step = 0;              // F
  bool fail_step_given = false;       // --until, else the first recorded failing step
  std::string fail_reason;            // why F: "given with --until" or where the predicate turns true
  std::vector<int64_t> checkpoints;   // candidates: checkpoints < F
  int64_t c_star = 0;
  std::vector<int> probes;            // indices into BisectReport::probes
  std::string message;
  std::vector<double> recorded_loss;  // recorded losses of steps [recorded_from, F]
  int64_t recorded_from = 0;
};

// A fix option checked on the window (promotion of the fixing set, stabilized softmax).
struct FixCheck {
  std::string name;
  std::string spec;
  bool fixes = false;
  int probe = -1;  // index into BisectReport::probes
};

struct BisectReport {
  int64_t run = 0;
  std::string store_path;
  std::string predicate;
  std::string recorded_plan;          // canonical plan at the window start
  std::string reference;              // --reference as given ("" = the default, full precision)
  std::vector<std::string> space;     // what the narrowing searched: its op kinds, modules, head
  int n_layer = 0, n_head = 0;
  std::optional<TimeSearch> time;
  std::vector<std::string> widenings; // windows whose recorded-plan replay passed, and why widened
  bool narrowed = false;              // the layer/head/op search ran
  int64_t from = 0, to = 0;           // the window narrowed (valid when narrowed)
  SearchResult search;
  std::vector<FixCheck> fixes;
  std::vector<ProbeEntry> probes;     // every probe, in the order they were asked
  std::vector<double> recorded_loss;  // over the window (or over [c0, F] for a time search)
  int64_t recorded_from = 0;
  // Not reproducible (the recording never fails, or the window's recorded-plan replay passes):
  // where the recording came closest to failing (issue 35).
  std::optional<NearMiss> near_miss;
  int executed = 0, cached = 0, jobs = 1;
  int cut = 0, skipped = 0;  // probes cut short by a race / never started (ProbePool)
  int ranks = 1;                      // data-parallel ranks each probe ran on
  std::vector<std::string> gpus;
  double wall_s = 0;
  // Issue 26: probe costs in recorded steps, summed over the probes that have one.
  std::string cost_model = "h100";
  double recorded_step_s = 0;          // per-step time of the recorded plan's probe (0: none)
  double predicted_cost = 0, measured_cost = 0;
  int predicted_probes = 0, measured_probes = 0;
  // Issue 36 item 4: the cost model calibrated on this machine and plan pair. The reference
  // run's probe (low{}) measures what promoting everything costs here (reference_step_ratio,
  // 0: not measured); each candidate's model cost above 1 is scaled so that the model's
  // low{} lands on it. calibrated_cost sums the candidates' calibrated per-step costs times
  // the steps each ran (an early verdict stops a probe: the window is no prediction of that).
  double reference_step_ratio = 0, calibrated_cost = 0;
  std::string verdict;                // human text, several lines
  int exit_code = 0;
};

// Runs the whole bisect. Throws UsageError / Error(kData) for bad options or data.
BisectReport run_bisect(const BisectOptions& o);

// The text of `rewind bisect log`: every probe of every bisect job in the store, in order.
std::string bisect_log(store::Store& s, int64_t run);

namespace detail {

// Shared by the narrowing and the time search: the store, run, predicate, pool and report.
struct Context {
  store::Store& store;
  train::RunSpec run;
  Predicate pred;
  ProbePool pool;
  BisectReport& report;
  std::string job;
  bool progress = true;
  int estimate = 0;
  double t0 = 0;
  std::string phase;
  std::shared_ptr<Progress> line;  // the progress line (recreated if the estimate grows)
  std::string reference = kFullPrecision;  // BisectOptions::reference, given to every probe
  std::string job_text;
  bool started = false;
  // Writes the job's description and an empty probe log into the store, once: called when
  // the first batch of probes is back, so that a bisect whose first probe fails (a script that
  // cannot replay the window) leaves the store as it was.
  void start();

  // Runs a batch in the current phase; appends to the report and the job's log.
  std::vector<ProbeOutcome> probe(const std::vector<ProbeSpec>& batch, int stop_after_fails = 0);
  ProbeSpec make(int64_t from, int64_t to, const std::string& kind) const;
};

// The near miss of the recorded steps [from, to] (history: every recorded step before them).
NearMiss recorded_near_miss(Context& ctx, int64_t from, int64_t to);

// Issue 9: fills report.time; returns true when a window [c*, F] was found.
bool find_window(Context& ctx, const BisectOptions& o);

}  // namespace detail

}  // namespace rwd::bisect
