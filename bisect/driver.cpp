// The bisect driver: the options checked, the time search, the window's narrowing
// (bisect/narrow.cpp) and the horizon (bisect/hold.cpp) in order, costs, verdict, probe log.
#include "bisect/driver.h"
#include "bisect/driver_context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "common/hash.h"
#include "common/json_int.h"
#include "common/progress.h"
#include "store/reader_pins.h"

namespace rwd::bisect {

using detail::interim;
using detail::now_s;
using detail::searched_space;

namespace {

// A probe's warm step time: the median of its steps (the mean where no median was stored).
double warm_step_s(const ProbeOutcome& o) {
  if (o.step_median_s > 0) return o.step_median_s;
  return o.steps > 0 ? o.step_s / o.steps : 0.0;
}

// Each probe's cost in recorded steps, predicted (probes of a candidate set, by the
// cost model) and measured (its warm step time over the recorded plan's, times its steps; both
// timed in this bisect or read with a cached probe), and the totals. Warm: the recorded plan's
// probe runs first, and on a GPU its first steps carry the process's lazy initialization
// (82 ms a step against 12-19 ms for the probes after it on the H100's 6-layer benchmark).
void account_costs(BisectReport& rep, const SearchSpace& space) {
  const CostModel model = CostModel::named(rep.cost_model);
  rep.recorded_step_s = 0;
  for (const auto& p : rep.probes)
    if (p.spec.kind == "window" && p.spec.candidate && p.spec.candidate->mode == Mode::kPromote &&
        p.spec.candidate->elements.empty() && p.outcome.step_s > 0 &&
        p.outcome.steps >= std::min<int64_t>(3, p.spec.to - p.spec.from + 1)) {
      // (a raced recorded-plan probe ends at its early verdict: one step times lazy setup)
      rep.recorded_step_s = warm_step_s(p.outcome);
      break;
    }
  rep.predicted_cost = rep.measured_cost = rep.calibrated_cost = rep.reference_step_ratio = 0;
  rep.predicted_probes = rep.measured_probes = 0;
  const Candidate reference_run{Mode::kKeepLow, {}};
  if (rep.recorded_step_s > 0)
    for (const auto& p : rep.probes)
      if (p.spec.kind == "window" && p.spec.candidate && p.spec.candidate->mode == Mode::kKeepLow &&
          p.spec.candidate->elements.empty() && p.outcome.steps > 0 && p.outcome.step_s > 0) {
        rep.reference_step_ratio = warm_step_s(p.outcome) / rep.recorded_step_s;
        break;
      }
  const double model_all = model.step_cost(reference_run, space);
  const bool calibrate = rep.reference_step_ratio > 0 && model_all > 1;
  const double scale = calibrate ? (rep.reference_step_ratio - 1) / (model_all - 1) : 0;
  for (auto& p : rep.probes) {
    p.predicted_cost = p.measured_cost = NAN;
    if (p.spec.candidate) {
      const double steps = static_cast<double>(p.spec.to - p.spec.from + 1);
      const double m = model.step_cost(*p.spec.candidate, space);
      p.predicted_cost = m * steps;
      rep.predicted_cost += p.predicted_cost;
      // Calibrated on the steps the probe ran (an early verdict stops it): the per-step model
      // is what it checks against the measured cost; the window is no prediction of those.
      const double ran = p.outcome.steps > 0 ? static_cast<double>(p.outcome.steps) : steps;
      if (calibrate) rep.calibrated_cost += (1 + (m - 1) * scale) * ran;
      ++rep.predicted_probes;
    }
    if (rep.recorded_step_s > 0 && p.outcome.steps > 0) {
      p.measured_cost = warm_step_s(p.outcome) * p.outcome.steps / rep.recorded_step_s;
      rep.measured_cost += p.measured_cost;
      ++rep.measured_probes;
    }
  }
}

// The horizon lines of a verdict: what was trained past the window, each branch, the claim.
}  // namespace

namespace detail {

ProbeSpec Context::make(int64_t from, int64_t to, const std::string& kind) const {
  ProbeSpec p;
  p.kind = kind;
  p.run = run.run_id;
  p.from = from;
  p.to = to;
  p.predicate = pred.source();
  p.job = job;
  p.reference = reference;
  return p;
}

NearMiss recorded_near_miss(Context& ctx, int64_t from, int64_t to) {
  const std::vector<std::string> used = ctx.pred.series_used();
  const int64_t first = ctx.store.step_range(ctx.run.run_id)->first;
  return near_miss(ctx.pred, recorded_series(ctx.store, ctx.run.run_id, first, to, &used), from, to);
}

void Context::start() {
  if (started) return;
  store.put_kv(run.run_id, "bisect/log/" + job, "[]");
  store.put_kv(run.run_id, "bisect/job/" + job, job_text);
  started = true;
}

std::vector<ProbeOutcome> Context::probe(const std::vector<ProbeSpec>& batch, int stop_after_fails) {
  std::vector<ProbeOutcome> outs = pool.run(batch, stop_after_fails);
  start();
  nlohmann::json log = nlohmann::json::array();
  if (auto old = store.get_kv(run.run_id, "bisect/log/" + job)) log = nlohmann::json::parse(*old);
  for (size_t i = 0; i < batch.size(); ++i) {
    ProbeEntry e{static_cast<int>(report.probes.size()), phase, batch[i], outs[i], NAN, NAN};
    report.probes.push_back(e);
    log.push_back({{"index", e.index}, {"phase", phase}, {"kind", batch[i].kind}, {"label", batch[i].label()},
                   {"window", std::to_string(batch[i].from) + ":" + std::to_string(batch[i].to)},
                   {"key", outs[i].key}, {"verdict", verdict_word(outs[i])},
                   {"cached", outs[i].cached}, {"wall_s", outs[i].wall_s}});
  }
  store.put_kv(run.run_id, "bisect/log/" + job, log.dump());
  if (progress && !batch.empty()) {
    const int done = static_cast<int>(report.probes.size());
    if (!line || done >= estimate) {
      estimate = std::max(estimate, done + 2);
      line = std::make_shared<Progress>("bisect probes", estimate, 0.0);
    }
    line->update(done, "| " + phase + " " + batch.back().label() + " -> " + verdict_word(outs.back()) +
                           " (probe count and ETA are estimates)");
  }
  return outs;
}

}  // namespace detail

BisectReport run_bisect(const BisectOptions& o) {
  const double t0 = now_s();
  if (o.fail.empty()) throw UsageError("bisect: --fail EXPR is required");
  if (!o.window && !o.find_window) throw UsageError("bisect: give --window A:B or --find-window");
  if (o.window && o.find_window) throw UsageError("bisect: --window and --find-window are exclusive");
  if (o.early_band > 0 && !o.hold) throw UsageError("bisect: --early-band judges probes over a horizon: give --hold N");
  if (o.early_band > 0 && o.run_spec)
    throw UsageError("bisect --cmd: --early-band is for rewind's own runs (a script's probes report no indicator)");
  if (!o.find_window && (o.until || o.window_only))
    throw UsageError("bisect: --until and --window-only need --find-window");
  store::Store st = store::Store::open(o.store_path, store::Mode::kReadWrite);
  BisectReport rep;
  train::RunSpec run = o.run_spec ? *o.run_spec : train::RunSpec::load(st, o.run);
  // `store thin` keeps the checkpoints this bisect may read until it returns (a pin beside the
  // store file, store/reader_pins.h): every one with --find-window, else the window's.
  const store::ReaderPin pin(st.path(), run.run_id,
                             o.window ? std::vector<int64_t>{o.window->first} : std::vector<int64_t>{}, "bisect");
  Predicate pred = Predicate::parse(o.fail);
  pred.validate(series_keys(run.config));
  const std::string job_text = "run " + std::to_string(run.run_id) + " " +
                               (o.window ? "window " + std::to_string(o.window->first) + ":" +
                                               std::to_string(o.window->second)
                                         : "find-window until " + (o.until ? std::to_string(*o.until) : std::string("auto")) +
                                               " fix " + o.fix) +
                               " fail " + pred.text() +
                               (!o.group_testing ? " search ddmin" : !o.cheap_direction ? " search groups" : "") +
                               (o.reference != kFullPrecision ? " reference " + o.reference : "") +
                               (o.hold ? " hold " + std::to_string(*o.hold) : "") +
                               (o.depth != 2 ? " depth " + std::to_string(o.depth) : "") +
                               (o.early_band > 0 ? " early " + std::to_string(o.early_band) + "x" +
                                                       std::to_string(o.early_steps) + (o.early_stop ? " stop" : "")
                                                 : "");
  plan::apply(plan::Plan::defaults(run.config.n_layer, run.config.n_head), o.reference);  // a bad --reference fails first
  detail::Context ctx{st, run, pred, ProbePool(st, run, pred, o.pool), rep, hex64(fnv1a64(job_text)).substr(0, 12),
                      o.progress, 0, t0, "", {}, o.reference};
  rep.run = run.run_id;
  rep.store_path = st.path();
  rep.predicate = pred.source();
  if (o.reference != kFullPrecision) rep.reference = o.reference;
  rep.n_layer = run.config.n_layer;
  rep.n_head = run.config.n_head;
  rep.jobs = o.pool.jobs;
  rep.ranks = o.pool.comm ? o.pool.comm->world() : o.pool.ranks;
  rep.gpus = o.pool.gpus;
  ctx.job_text = job_text;

  auto range = st.step_range(run.run_id);
  if (!range) throw Error(ExitCode::kData, "run " + std::to_string(run.run_id) + " has no recorded steps");
  std::optional<std::pair<int64_t, int64_t>> window = o.window;
  if (o.hold && *o.hold < 0) throw UsageError("bisect: --hold N needs N >= 0 steps past the failure step");
  if (o.find_window) {
    if (detail::find_window(ctx, o) && !o.window_only) {
      window = {{rep.time->c_star, o.hold ? rep.horizon->to : rep.time->fail_step}};
      interim(ctx, o, "the narrowing of steps " + std::to_string(window->first) + "-" + std::to_string(window->second));
    }
  } else {
    auto [a, b] = *o.window;
    if (a > b) throw UsageError("bisect: empty window " + std::to_string(a) + ":" + std::to_string(b));
    if (a < range->first || b > range->second)
      throw UsageError("bisect: window " + std::to_string(a) + ":" + std::to_string(b) +
                       " is outside the recording (steps " + std::to_string(range->first) + ".." +
                       std::to_string(range->second) + ")");
    if (!st.nearest_checkpoint(run.run_id, a))
      throw Error(ExitCode::kData, "missing checkpoint: no checkpoint at or before step " + std::to_string(a));
    if (o.hold) {  // the window's end stands for the failure step
      rep.horizon = Horizon{};
      rep.horizon->searched = true;
      rep.horizon->fail_step = b;
      rep.horizon->from = a;
      rep.horizon->to = detail::horizon_end(ctx, o, b + *o.hold, rep.horizon->capped);
      window = {{a, rep.horizon->to}};
    }
  }
  while (window) {
    rep.recorded_from = window->first;
    rep.recorded_loss.clear();
    for (const auto& s : st.steps(run.run_id, window->first, window->second)) rep.recorded_loss.push_back(s.loss());
    detail::narrow_window(ctx, o, window->first, window->second);
    if (!o.find_window || o.hold || rep.search.status != Status::kNotReproducible) break;
    window = detail::widen(ctx, *window, *range);
  }
  if (o.hold) {
    detail::describe_horizon(ctx, o);
  } else {
    if (rep.narrowed && !rep.search.fixing_set.empty() && o.hold_check.value_or(1) != 0) interim(ctx, o, "the hold check");
    detail::hold_check(ctx, o);
  }
  detail::account_early(ctx, o);
  ctx.pool.release_ranks();  // no probe follows (with ranks: they may end)
  rep.executed = ctx.pool.executed();
  rep.cached = ctx.pool.cached();
  rep.cut = ctx.pool.cut();
  rep.skipped = ctx.pool.skipped();
  rep.wall_s = now_s() - t0;
  account_costs(rep, rep.narrowed ? searched_space(run, o, rep.from, rep.to) : space_for(run.config));
  if (rep.narrowed) {
    const Status s = rep.search.status;
    rep.exit_code = (found_fix(s) || s == Status::kNoFixInSpace) ? 4 : 0;
  } else {
    rep.exit_code = rep.time && rep.time->status == TimeSearch::Status::kWindow ? 4 : 0;
  }
  rep.verdict = detail::verdict_text(rep);
  ctx.start();  // where no probe was asked (a time search that found no failure)
  st.put_kv(run.run_id, "bisect/verdict/" + ctx.job, rep.verdict);
  return rep;
}

std::string bisect_log(store::Store& s, int64_t run_id) {
  // The run's id only (RunSpec::load would also parse a config, which a script's run need not
  // have in rewind train's keys).
  int64_t id = run_id;
  if (run_id == 0) {
    const auto runs = s.runs();
    if (runs.empty()) throw Error(ExitCode::kData, "store '" + s.path() + "' holds no recorded run");
    id = runs.back().id;
  } else if (!s.run(run_id)) {
    throw UsageError("store '" + s.path() + "' has no run " + std::to_string(run_id));
  }
  std::string out;
  char buf[512];
  for (const auto& k : s.kv_keys(id, "bisect/log/")) {
    const std::string job = k.substr(std::string("bisect/log/").size());
    out += "# bisect job " + job + ": " + s.get_kv(id, "bisect/job/" + job).value_or("?") + "\n";
    auto log = nlohmann::json::parse(s.get_kv(id, k).value_or("[]"));
    for (const auto& e : log) {
      std::snprintf(buf, sizeof buf, "probe %3d  %-16s %-4s  %-10s %-7s %7.2fs %s  %s\n", static_cast<int>(json_int<int>(e.value("index", nlohmann::json(0))).value_or(-1)),
                    e.value("phase", "").c_str(), e.value("verdict", "").c_str(), e.value("window", "").c_str(),
                    e.value("kind", "").c_str(), e.value("wall_s", 0.0), e.value("cached", false) ? "cached" : "run   ",
                    e.value("label", "").c_str());
      out += buf;
    }
    if (auto v = s.get_kv(id, "bisect/verdict/" + job)) {
      size_t start = 0;
      while (start < v->size()) {
        size_t nl = v->find('\n', start);
        if (nl == std::string::npos) nl = v->size();
        out += "# " + v->substr(start, nl - start) + "\n";
        start = nl + 1;
      }
    } else {
      out += "# (no verdict: the bisect did not finish)\n";
    }
  }
  if (out.empty()) out = "no bisect probes recorded for run " + std::to_string(id) + "\n";
  return out;
}

}  // namespace rwd::bisect
