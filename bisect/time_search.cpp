// Checkpoint bisection in time: find the failure step F in the recording (where the
// predicate turns true), then the latest checkpoint c* < F whose replay to F under
// the fix plan (all-FP32) avoids the failure.
#include <algorithm>
#include <optional>

#include "bisect/driver.h"
#include "bisect/driver_context.h"

namespace rwd::bisect::detail {

namespace {

// The failure step of a recording: the first step at which the predicate, judged on that step
// with the recorded steps before it as history, turns true after having been false (a loss
// that starts high is no failure at step 0). Steps it cannot judge yet (x[STEP] names a later
// step) are skipped. Fills `why` either way.
std::optional<int64_t> first_failing_step(store::Store& s, int64_t run, const Predicate& pred,
                                          int64_t first, int64_t last, std::string& why) {
  Series all = recorded_series(s, run, first, last);
  const int64_t n = static_cast<int64_t>(all.values["loss"].size());
  std::optional<int64_t> last_false, held_from, held_to;
  for (int64_t t = first; t < first + n; ++t) {
    bool holds = false;
    try {
      holds = pred.eval_step(all, t);
    } catch (const UsageError&) {
      continue;
    }
    if (holds && last_false) {
      why = "the first step where '" + pred.source() + "' turns true (it holds at step " +
            std::to_string(t) + ", not at step " + std::to_string(*last_false) + ")";
      if (held_from)
        why += "; it held at steps " + std::to_string(*held_from) + ".." + std::to_string(*held_to) +
               " at the start of the recording, which is not a failure";
      return t;
    }
    if (!holds) last_false = t;
    else if (!held_from) held_from = held_to = t;
    else held_to = t;
  }
  why = "'" + pred.source() + "' never turns from false to true in the recording (steps " +
        std::to_string(first) + ".." + std::to_string(first + n - 1) + ")";
  if (held_from && !last_false) why += "; it holds at every step it can judge, from the start";
  return std::nullopt;
}

}  // namespace

bool find_window(Context& ctx, const BisectOptions& o) {
  BisectReport& rep = ctx.report;
  const int64_t run = ctx.run.run_id;
  auto range = ctx.store.step_range(run);
  if (!range) throw Error(ExitCode::kData, "run " + std::to_string(run) + " has no recorded steps");
  TimeSearch t;
  if (o.until) {
    t.fail_step = *o.until;
    t.fail_step_given = true;
    t.fail_reason = "given with --until";
    if (t.fail_step < range->first || t.fail_step > range->second)
      throw UsageError("bisect: failure step " + std::to_string(t.fail_step) +
                       " is outside the recording (steps " + std::to_string(range->first) + ".." +
                       std::to_string(range->second) + ")");
  } else {
    auto f = first_failing_step(ctx.store, run, ctx.pred, range->first, range->second, t.fail_reason);
    if (!f) {
      t.status = TimeSearch::Status::kNoFailure;
      t.message = "not reproducible: " + t.fail_reason + "; give the failure step with --until";
      rep.time = t;
      rep.near_miss = recorded_near_miss(ctx, range->first, range->second);
      return false;
    }
    t.fail_step = *f;
  }
  for (int64_t c : ctx.store.checkpoint_steps(run))
    if (c < t.fail_step) t.checkpoints.push_back(c);
  if (t.checkpoints.empty())
    throw Error(ExitCode::kData, "bisect: no checkpoint before the failure step " +
                                     std::to_string(t.fail_step) + ": nothing to bisect in time");
  t.recorded_from = t.checkpoints.front();
  for (const auto& s : ctx.store.steps(run, t.recorded_from, t.fail_step)) t.recorded_loss.push_back(s.loss());

  if (o.hold) {
    std::string capped;
    const int64_t horizon = horizon_end(ctx, o, t.fail_step + *o.hold, capped);
    find_point_of_no_return(ctx, o, t, horizon);
    rep.horizon->capped = capped;
    rep.time = t;
    return t.status == TimeSearch::Status::kWindow;
  }
  // k-ary search for the last checkpoint whose fix replay passes, assuming passes come first
  // (the later the fix starts, the more damage is already done). Index lo passes (-1: none
  // known), hi fails (n: F itself, which fails by definition). --jobs N probes N points per
  // round; with N = 1 it is a binary search: ceil(log2(n + 1)) probes for n checkpoints.
  ctx.phase = "time";
  const int n = static_cast<int>(t.checkpoints.size());
  const int k = std::max(1, o.pool.jobs);
  int lo = -1, hi = n;
  for (int m = n; m > 1; m = (m + 1) / 2) ++ctx.estimate;
  ctx.estimate += 1;
  while (hi - lo > 1) {
    std::vector<int> points;
    for (int i = 1; i <= k; ++i) {
      int p = lo + static_cast<int>((static_cast<int64_t>(hi - lo) * i) / (k + 1));
      if (p > lo && p < hi && (points.empty() || p != points.back())) points.push_back(p);
    }
    std::vector<ProbeSpec> batch;
    for (int p : points) {
      ProbeSpec s = ctx.make(t.checkpoints[p], t.fail_step, "time");
      s.spec = o.fix;
      batch.push_back(s);
    }
    const int first = static_cast<int>(rep.probes.size());
    std::vector<ProbeOutcome> outs = ctx.probe(batch);
    for (size_t i = 0; i < points.size(); ++i) t.probes.push_back(first + static_cast<int>(i));
    for (size_t i = 0; i < points.size(); ++i) {
      if (outs[i].fails) {
        hi = points[i];
        break;
      }
      lo = points[i];
    }
  }
  const std::string fix = o.fix == kFullPrecision ? std::string("all-FP32") : "'" + o.fix + "'";
  if (lo < 0) {
    t.c_star = t.checkpoints.front();
    // From the very first step under all-FP32 and still failing: no precision plan caused it.
    const bool at_start = t.c_star <= range->first && (o.fix == kFullPrecision || o.fix == "all=fp32");
    t.status = at_start ? TimeSearch::Status::kNotPrecision : TimeSearch::Status::kBakedIn;
    t.message = at_start ? "not a precision failure: replaying from the first step (" + std::to_string(t.c_star) +
                               ") to " + std::to_string(t.fail_step) + " under " + fix + " still fails"
                         : "the failure is already baked into the earliest checkpoint (step " +
                               std::to_string(t.c_star) + "): replaying from it under " + fix +
                               " still fails at step " + std::to_string(t.fail_step);
  } else {
    t.c_star = t.checkpoints[lo];
    t.status = TimeSearch::Status::kWindow;
    t.message = "causal window " + std::to_string(t.c_star) + ":" + std::to_string(t.fail_step) +
                ": replaying from checkpoint " + std::to_string(t.c_star) + " under " + fix + " avoids the failure";
    if (lo + 1 < n)
      t.message += ", from checkpoint " + std::to_string(t.checkpoints[lo + 1]) + " it does not (the damage is done in between)";
    else
      t.message += " (it is the last checkpoint before the failure)";
    if (lo == 0) t.message += "; c* is the earliest checkpoint: the cause is active from the start of the recording";
  }
  rep.time = t;
  return t.status == TimeSearch::Status::kWindow;
}

}  // namespace rwd::bisect::detail
