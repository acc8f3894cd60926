// One bisect probe: a replay of a recorded window under a candidate or a fix plan, judged by the
// failure predicate; its cache key, its stored form in the probes table, and its execution.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bisect/predicate.h"
#include "bisect/space.h"
#include "common/error.h"
#include "train/dist.h"
#include "train/run_spec.h"
#include "store/store.h"

namespace rwd::bisect {

// Errors of the bisect driver (a probe worker that failed, a cache entry that does not parse).
class BisectError : public Error {
 public:
  BisectError(ExitCode code, const std::string& what) : Error(code, "bisect: " + what) {}
};

// What a probe runs in the window [from, to]. The plan of step s inside the window is
//   candidate set: candidate_plan(candidate, space, recorded plan at s,
//                                 plan::apply(recorded plan at s, reference))
//   otherwise:     plan::apply(recorded plan at s, spec)   (time probes, stable-softmax checks)
// so a plan schedule recorded with --plan-from stays honoured inside the window.
struct ProbeSpec {
  std::string kind = "window";  // "window" (search), "time" (find-window), "fix" (fix checks)
  int64_t run = 0;
  int64_t from = 0, to = 0;
  std::optional<Candidate> candidate;
  std::string spec;
  std::string reference = kFullPrecision;  // --reference: what a candidate promotes towards
  std::string predicate;  // source text of the failure predicate
  std::string job;        // the bisect job that first asked for it
  // The recorded plan's probe (fp32{}) runs the whole window to time the recorded step, unless
  // false: with races its early verdict ends it like any other (not part of the cache key).
  bool baseline_whole = true;
  // The leading indicator (bisect --early-band K): band[i] is the reference branch's largest max
  // logit over its heads at step from + i. The probe notes the first step where its own has
  // stayed above band_k x the band for band_steps steps in a row (indicator_at); band_stop: it
  // is judged failing there and stops. Empty band: no indicator.
  std::vector<double> band;
  double band_k = 0;
  int band_steps = 0;
  bool band_stop = false;

  std::string label() const;  // "low{L1.attn}", "fp32{}", or the spec
  std::string to_json() const;
  static ProbeSpec from_json(const std::string& text);
};

// The verdict and the curves of one probe.
struct ProbeOutcome {
  std::string key;
  bool fails = false;
  std::vector<double> loss;       // steps from, from+1, ... (shorter when stopped at NaN/Inf)
  std::vector<double> grad_norm;
  std::vector<double> max_logit;  // per step, the largest max logit over every head (the indicator)
  // Where the leading indicator left the reference's band (ProbeSpec::band), -1: it did not (or
  // no band); judged_early: the probe stopped there, failing, without reaching its verdict.
  int64_t indicator_at = -1;
  bool judged_early = false;
  double wall_s = 0;
  double step_s = 0;              // of wall_s, the time in the window's training steps
  double restore_s = 0;           // of wall_s, restoring the checkpoint before the window
  // The median of those steps' times: what a step costs once warm (the first probe of a GPU
  // process pays for lazy initialization in its first steps). 0: not known (stored earlier).
  double step_median_s = 0;
  int steps = 0;                  // steps run (fewer than the window when stopped early)
  // The step at which the verdict was decided before the window's end (a NaN/Inf loss, or a
  // monotone predicate that turned true: an early verdict); -1: the whole window ran.
  int64_t stopped_at = -1;
  // The first step after which the (monotone) predicate held on the steps so far: stopped_at
  // for a probe stopped early, and for the recorded plan's probe, which always runs whole, the
  // step it would have stopped at (how long a failing probe runs: races). -1: none.
  int64_t held_at = -1;
  bool cached = false;            // read from the store, not run by this invocation
  // Cut short by a race (ProbePool::run with stop_after_fails): no verdict (`fails` false), not
  // stored in the probe cache.
  bool cut = false;
  std::string device = "cpu";     // "cpu" or "cpu (CUDA_VISIBLE_DEVICES=1)"
  std::string plan;               // canonical plan at `from`
  // When this bisect handed the probe out and had its answer, seconds since the pool began
  // (-1: cached, or not run by this invocation): the report's timeline of rounds.
  double sent_s = -1, done_s = -1;
};

// "L1.H2.o", "L1.H2", "L1.attn", "L0.mlp", "head" -> Element; throws UsageError.
Element parse_element(const std::string& text);
// "low{...}" / "fp32{...}" as printed by to_string(Candidate); throws UsageError.
Candidate parse_candidate(const std::string& text);

// The search space of a recorded model: every op (the accumulator pseudo-op `acc` too), module
// and the model head.
SearchSpace space_for(const train::Config& c);
// The space a bisect of [from, to] searches: space_for(c) without what the recorded plans of
// the window and their reference agree on (space_between).
SearchSpace window_space(const train::RunSpec& run, int64_t from, int64_t to,
                         const std::string& reference);

// The plan a probe runs at step s (see ProbeSpec).
plan::Plan probe_plan(const ProbeSpec& p, const train::RunSpec& run, int64_t step);

// Cache key: hash of (run, window, recorded plan of the window, probe plan of the window,
// normalized predicate, and the number of ranks when it is not the recording's). Plans are
// described at `from` and at every schedule change inside the window, so equal keys mean
// identical replays judged identically.
std::string probe_key(const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred, int world = 1);

// Every series key a window of this run provides (to validate a predicate before probing).
std::vector<std::string> series_keys(const train::Config& c);

// Recorded per-step series of steps [from, to]: losses, lr, grad norm, and every monitor or
// (with `keys`) only the monitors named there.
Series recorded_series(store::Store& s, int64_t run, int64_t from, int64_t to,
                       const std::vector<std::string>* keys = nullptr);

// Runs the probe in this process (restore, replay the window, stop at a non-finite loss,
// evaluate the predicate). The caller sets the thread count of the recording. comm: the job's
// ranks, every one of which runs the same probe (nullptr: this process alone). cut_short:
// asked before each step after the first; true ends the probe there with no verdict (`cut`).
ProbeOutcome execute_probe(store::Store& s, const ProbeSpec& p, const train::RunSpec& run,
                           const Predicate& pred, train::Comm* comm = nullptr,
                           const std::function<bool()>& cut_short = {});

// Restores what the probe would restore, and runs nothing: a worker that has no probe of the
// first batch to run gets its CUDA context, trainer and checkpoint ready for the next one.
void warm_probe(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, train::Comm* comm = nullptr);

// A probe's verdict as the logs and reports print it: "fail", "pass" or "cut short".
const char* verdict_word(const ProbeOutcome& o);

// A probe's window computed by something other than this process's trainer (`bisect --cmd`:
// the user's script): what it reported of each step it ran, from `from` on.
struct ExternalRun {
  // "loss", "grad_norm", "lr" and any monitors ("L1.H0.max_logit"), one value per step run.
  std::map<std::string, std::vector<double>> values;
  std::vector<double> step_s;  // each step's time
  // Ended before the window's end: at a non-finite loss, or at the step where its watch said
  // kStop (an early verdict); -1: whole.
  int64_t stopped_at = -1;
  bool cut = false;            // its watch said kCut: no verdict
  std::string device = "cpu";
};

// What a runner does after a step of the window it has reported (ExternalRun's values then end
// with that step): go on, stop (the verdict is decided: the steps after it are not part of the
// probe, whether they ran or not), or stop with no verdict (a race was decided elsewhere).
enum class Watch { kGoOn, kStop, kCut };
using StepWatch = std::function<Watch(const ExternalRun&)>;

// An external probe's early verdict, judged on any thread while the probe runs: the
// recorded history and losses it needs are read from the store when it is made. A monotone
// predicate that holds on the steps so far holds on the whole window, so the probe may stop.
class EarlyVerdict {
 public:
  EarlyVerdict(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred);
  // Whether the predicate holds on `r`'s steps (those of the window, from `from`), for a
  // monotone predicate; records the first step where it did (held_at). The recorded plan's
  // probe that runs whole (ProbeSpec::baseline_whole) is judged too, and never told to stop.
  bool stop(const ExternalRun& r);
  // The verdict on `r` as judge_probe gives it (false where the predicate cannot be judged yet).
  bool fails(const ExternalRun& r) const;
  int64_t held_at() const { return held_at_; }

 private:
  Series series(const ExternalRun& r) const;
  Series start_;
  std::vector<double> recorded_loss_;  // the window's recorded losses
  const Predicate& pred_;
  int64_t from_;
  bool whole_;
  int64_t held_at_ = -1;
};

// The outcome of an external run, judged as execute_probe judges its own: the recorded history
// before the window, the recorded loss beside the replayed one, the predicate. `key`: the
// probe's cache key (the pool's).
ProbeOutcome judge_probe(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred,
                         const std::string& key, const ExternalRun& r, double wall_s);

// The probes table row of an outcome, and back (nullopt: not a bisect probe or unreadable).
store::ProbeRecord to_record(const ProbeSpec& p, const ProbeOutcome& o);
std::optional<ProbeOutcome> from_record(const store::ProbeRecord& r);

}  // namespace rwd::bisect
