// `rewind bisect` as a library: time bisection over checkpoints (find the causal window), then
// layer/head/op narrowing of a window with the search engine, fix checks, and the report data.
#pragma once

#include <cmath>
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

struct BisectReport;

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
  bool cheap_direction = true;                 // --search cheap (the default)
  bool progress = true;                        // progress line on stderr
  // The run as the probes see it, when rewind's trainer did not record it (bisect --cmd: a
  // script's run, its layers, heads and plan schedule); otherwise loaded from the store.
  std::optional<train::RunSpec> run_spec;
  // Only the attention ops are under the plan (a script's run: rewind.attention is the op a
  // plan reaches; its Linear, LayerNorm and head are the script's own): modules and the model
  // head are left out of the search.
  bool attention_only = false;
  // --hold N: healthy means the predicate stays false through the failure step + N. The time
  // search then finds the point of no return (the latest checkpoint from which the reference
  // holds through that horizon, confirmed by the checkpoint before it) and every narrowing
  // probe is judged over the whole horizon. nullopt: window-local, then one hold check.
  std::optional<int64_t> hold;
  // Without --hold: the hold check's horizon past the window's end (nullopt: min(1000, 10x the
  // window); 0: no hold check, the verdict says so).
  std::optional<int64_t> hold_check;
  // --granularity: the deepest level searched (0 layers, 1 heads, 2 ops).
  int depth = 2;
  // --budget M: minutes for the narrowing; it descends layers -> heads -> ops only while the
  // next level's estimate (the last level's probe time) fits in what is left. 0: no budget.
  double budget_min = 0;
  // --early-band K: the leading indicator, the largest max logit over the heads against the
  // reference branch's at the same step (--hold's narrowing). Every probe notes where it stayed
  // above K x the reference's for early_steps steps; early_stop: the probe is judged failing
  // there. The verdict reports how often the indicator's call agreed with the probe's outcome.
  double early_band = 0;
  int early_steps = 5;
  bool early_stop = false;
  // Probes may train past the last recorded step (rewind's own trainer draws its batches from
  // the data set at any step); a script's run is checked up to its recording's end.
  bool beyond_recording = true;
  // Called with the report so far after each phase that ends before the last (report.pending
  // names what has not run yet): the CLI writes it to --report, so that a bisect stopped by its
  // machine's deadline keeps what it found. Not called when empty.
  std::function<void(const BisectReport&)> on_interim;
};

// A branch that held counts as healthy as the reference when the median gradient norm of its
// last steps is within this factor of the reference's (the user's own comparison of a fixed run
// with a healthy one).
inline constexpr double kHealthyEndRatio = 1.5;

// What a verdict claims about time: the steps its branches were trained over past the window.
struct Horizon {
  bool searched = false;     // --hold: the search itself judged every probe over [from, to]
  int64_t from = 0, to = 0;  // the branches' first and last step
  int64_t fail_step = -1;    // the failure step the horizon counts from (-1: the window's end)
  int64_t hold = 0;          // to = fail_step (or the window's end) + hold, unless capped
  std::string capped;        // why `to` is earlier than asked ("" = not capped)
  int64_t point_of_no_return = -1;  // --hold: the latest checkpoint the reference holds from
  std::string granularity;   // "layers", "heads" or "ops": how deep the durable set was sought
  std::string depth_note;    // why the search stopped above the asked granularity, if it did
  struct Branch {
    std::string name;        // "recorded plan", "reference", "fixing set", a fix check's name
    std::string label;       // the probe's candidate or plan
    int probe = -1;          // index into BisectReport::probes
    bool held = false;
    int64_t broke_at = -1;   // first step where the predicate held (-1: unknown or held)
    // A branch that held and the reference both trained through the horizon: the median
    // gradient norm of its last end_steps steps over the reference's (NaN: not compared).
    double end_ratio = NAN;
    int64_t end_steps = 0;
  };
  std::vector<Branch> branches;
  std::string claim;         // one sentence: what holds through which step, at what granularity
  std::string fork_command;  // the independent confirmation (`rewind train --fork ...`)
};

// One probe as the report sees it: what was asked, in which phase, and the answer.
struct ProbeEntry {
  int index = 0;
  std::string phase;  // "time", "check", "failing/layers", ..., "fix"
  ProbeSpec spec;
  ProbeOutcome outcome;
  // Cost in recorded steps, NaN where unknown: predicted by the cost model (probes
  // of a candidate set), and measured: its training-step time over the recorded plan's
  // per-step time measured in this bisect (BisectReport::recorded_step_s).
  double predicted_cost = 0, measured_cost = 0;
  // The probe whose set this one's was split from (the engine's Probe::parent as an index into
  // BisectReport::probes; the report's narrowing tree); -1: a root (checks, time and fix probes).
  int parent = -1;
};

// Time bisection over checkpoints.
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
  int depth = 2;                      // the deepest level the narrowing searched (0 layers, 1 heads, 2 ops)
  std::string depth_note;             // why it stopped above --granularity (the budget), if it did
  std::vector<FixCheck> fixes;
  std::string checks_note;            // fix checks left out, and why (the budget), if any were
  std::string pending;                // an interim report: the phases still to run ("" = finished)
  std::optional<Horizon> horizon;     // the hold check (default) or the --hold search
  // --early-band: the indicator's calls against the probes' outcomes (probes that ran to their
  // verdict), and the probes it judged failing early (early_stop: not run to their verdict).
  struct EarlyCalls {
    double k = 0;
    int steps = 0;
    bool stop = false;
    int called_failed = 0, called_held = 0, missed = 0, quiet_held = 0, judged = 0;
    int64_t lead_steps = 0;   // summed over called_failed probes with a known break: break - call
    int64_t after_call = 0;   // steps those probes ran after the call (a trusted call saves them)
    int64_t steps_run = 0;    // steps every probe with a band ran
  };
  std::optional<EarlyCalls> early;
  std::vector<ProbeEntry> probes;     // every probe, in the order they were asked
  std::vector<double> recorded_loss;  // over the window (or over [c0, F] for a time search)
  int64_t recorded_from = 0;
  // Not reproducible (the recording never fails, or the window's recorded-plan replay passes):
  // where the recording came closest to failing.
  std::optional<NearMiss> near_miss;
  int executed = 0, cached = 0, jobs = 1;
  int cut = 0, skipped = 0;  // probes cut short by a race / never started (ProbePool)
  int ranks = 1;                      // data-parallel ranks each probe ran on
  std::vector<std::string> gpus;
  double wall_s = 0;
  // Probe costs in recorded steps, summed over the probes that have one.
  std::string cost_model = "h100";
  double recorded_step_s = 0;          // per-step time of the recorded plan's probe (0: none)
  double predicted_cost = 0, measured_cost = 0;
  int predicted_probes = 0, measured_probes = 0;
  // The cost model calibrated on this machine and plan pair. The reference
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

}  // namespace rwd::bisect
