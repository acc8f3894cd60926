// Bisect probes: per-step probe plans, cache keys, the series a probe judges, in-process
// execution (warm probes) and early verdicts; the text forms are in bisect/probe_io.cpp.
#include "bisect/probe.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "common/hash.h"
#include "common/switches.h"
#include "replay/replayer.h"

namespace rwd::bisect {

namespace {

constexpr const char* kMonitorNames[] = {"wq_sn", "max_logit", "repmax_rate", "pbar_one"};

// The steps where the probe's plan may change: `from` and every schedule change inside.
std::vector<int64_t> plan_points(const ProbeSpec& p, const train::RunSpec& run) {
  std::vector<int64_t> pts = {p.from};
  for (const auto& ch : run.plan.changes)
    if (ch.first > p.from && ch.first <= p.to) pts.push_back(ch.first);
  return pts;
}

// A probe's series before its first step: the history, what the predicate reads of the
// recording before the window.
Series window_start(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred);

// What a probe restores: warm, since the probes of one bisect restore the same checkpoint.
replay::RestoreOptions probe_restore(train::Comm* comm) {
  replay::RestoreOptions o;
  o.comm = comm;
  o.warm = true;
  return o;
}

// The verdict on the window's series, its curves and its median step time.
void conclude(ProbeOutcome& out, Series& series, const Predicate& pred, std::vector<double> step_times) {
  if (!step_times.empty()) {
    std::sort(step_times.begin(), step_times.end());
    const size_t n = step_times.size();
    out.step_median_s = n % 2 ? step_times[n / 2] : 0.5 * (step_times[n / 2 - 1] + step_times[n / 2]);
  }
  out.fails = pred.eval(series);
  out.loss = series.values["loss"];
  out.grad_norm = series.values["grad_norm"];
}

}  // namespace

std::string ProbeSpec::label() const {
  return candidate ? to_string(*candidate) : spec;
}

SearchSpace space_for(const train::Config& c) {
  SearchSpace s;
  s.n_layer = c.n_layer;
  s.n_head = c.n_head;
  s.ops = {"qk", "softmax", "pv", "acc", "o", "delta", "bwd"};
  return s;
}

SearchSpace window_space(const train::RunSpec& run, int64_t from, int64_t to,
                         const std::string& reference) {
  const train::Config& c = run.config;
  ProbeSpec p;
  p.from = from;
  p.to = to;
  std::vector<plan::Plan> recorded, ref;
  for (int64_t s : plan_points(p, run)) {
    recorded.push_back(run.plan.at(s, c.n_layer, c.n_head));
    ref.push_back(plan::apply(recorded.back(), reference));
  }
  return space_between(space_for(c), recorded, ref);
}

plan::Plan probe_plan(const ProbeSpec& p, const train::RunSpec& run, int64_t step) {
  const train::Config& c = run.config;
  plan::Plan recorded = run.plan.at(step, c.n_layer, c.n_head);
  if (p.candidate)
    return candidate_plan(*p.candidate, space_for(c), recorded, plan::apply(recorded, p.reference));
  return plan::apply(recorded, p.spec);
}

std::string probe_key(const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred, int world) {
  const train::Config& c = run.config;
  std::string recorded, probe;
  for (int64_t s : plan_points(p, run)) {
    recorded += "@" + std::to_string(s) + ":" + run.plan.at(s, c.n_layer, c.n_head).canonical() + "\n";
    probe += "@" + std::to_string(s) + ":" + probe_plan(p, run, s).canonical() + "\n";
  }
  // v2: the predicate reads the recorded history before the window.
  const std::string text = "rewind-probe-v2\nrun " + std::to_string(run.run_id) + "\nwindow " +
                           std::to_string(p.from) + ":" + std::to_string(p.to) + "\nrecorded\n" +
                           recorded + "probe " + hex64(fnv1a64(probe)) + "\npredicate " + pred.text();
  // On the recorded number of ranks the key is what it was before probes could run on several:
  // another count sums gradients in another order, so its replays are other probes.
  std::string keyed = text;
  if (!p.band.empty()) {  // the indicator's step is part of the outcome, and with band_stop the verdict
    std::string band;
    for (double x : p.band) band += std::to_string(x) + ",";
    keyed += "\nearly " + std::to_string(p.band_k) + " " + std::to_string(p.band_steps) +
             (p.band_stop ? " stop " : " measure ") + hex64(fnv1a64(band));
  }
  if (world != run.world_size) return hex64(fnv1a64(keyed + "\nranks " + std::to_string(world)));
  return hex64(fnv1a64(keyed));
}

std::vector<std::string> series_keys(const train::Config& c) {
  std::vector<std::string> keys = {"loss", "grad_norm", "lr", "recorded_loss"};
  for (int l = 0; l < c.n_layer; ++l)
    for (int h = 0; h < c.n_head; ++h)
      for (const char* m : kMonitorNames)
        keys.push_back("L" + std::to_string(l) + ".H" + std::to_string(h) + "." + m);
  return keys;
}

Series recorded_series(store::Store& s, int64_t run, int64_t from, int64_t to,
                       const std::vector<std::string>* keys) {
  Series out;
  out.first_step = from;
  for (const auto& st : s.steps(run, from, to)) {
    out.values["loss"].push_back(st.loss());
    out.values["recorded_loss"].push_back(st.loss());
    out.values["grad_norm"].push_back(st.grad_norm());
    out.values["lr"].push_back(st.lr);
  }
  if (!keys) {
    for (const auto& m : s.metrics(run, from, to, "L")) out.values[m.key].push_back(m.value);
    return out;
  }
  for (const auto& key : *keys)
    if (!out.values.count(key))
      for (const auto& m : s.metrics(run, from, to, key))
        if (m.key == key) out.values[key].push_back(m.value);
  return out;
}

namespace {

Series window_start(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred) {
  Series series;
  series.first_step = p.from;
  const std::vector<std::string> used = pred.series_used();
  auto range = s.step_range(run.run_id);
  if (range && range->first < p.from) {
    Series before = recorded_series(s, run.run_id, range->first, p.from - 1, &used);
    // A series with a value on every recorded step; a monitor of a run recorded with
    // --monitor-every N > 1 has gaps, and its values would sit at the wrong steps: no history.
    const size_t steps = before.values["loss"].size();
    for (const auto& key : used)
      if (before.values.count(key) && before.values[key].size() == steps)
        series.history[key] = std::move(before.values[key]);
  }
  return series;
}

}  // namespace

void warm_probe(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, train::Comm* comm) {
  replay::restore_before(s, run.run_id, p.from, probe_restore(comm));
}

const char* verdict_word(const ProbeOutcome& o) { return o.cut ? "cut short" : o.fails ? "fail" : "pass"; }

ProbeOutcome execute_probe(store::Store& s, const ProbeSpec& p, const train::RunSpec& run,
                           const Predicate& pred, train::Comm* comm, const std::function<bool()>& cut_short) {
  auto t0 = std::chrono::steady_clock::now();
  ProbeOutcome out;
  const int world = comm ? comm->world() : 1;
  out.key = probe_key(p, run, pred, world);
  out.plan = probe_plan(p, run, p.from).canonical();
  if (const char* cvd = switches::external("CUDA_VISIBLE_DEVICES"))
    out.device = run.device + " (CUDA_VISIBLE_DEVICES=" + cvd + ")";
  else
    out.device = run.device;
  if (world > 1) out.device += " x " + std::to_string(world) + " ranks";
  // Every rank replays the window in lockstep; the loss is summed in rank order on all of
  // them, so each rank stops at the same non-finite step and judges the same series.
  // Warm: the probes of one bisect restore the same checkpoint, read and decompressed once.
  replay::Restored st = replay::restore_before(s, run.run_id, p.from, probe_restore(comm));
  out.restore_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Series series = window_start(s, p, run, pred);
  // Early verdict: a monotone predicate that holds on the steps run so far holds on
  // the whole window, so the probe stops there. Judging the prefix costs time of its own: alone
  // in its process the probe judges at most every `every` steps, so that judging takes ~2% of
  // the steps' time; with ranks it judges every step (the same series on every rank, so every
  // rank stops at the same step).
  // The recorded plan's probe (fp32{}) runs whole (unless the spec says otherwise: races):
  // its median step is the recorded step every probe's measured cost is counted in (a one-step
  // probe would time lazy initialization); it is judged until the predicate holds all the same,
  // to tell where it would have stopped.
  const bool baseline =
      p.baseline_whole && p.candidate && p.candidate->mode == Mode::kPromote && p.candidate->elements.empty();
  const bool early = pred.monotone();
  int64_t every = 1, next_check = p.from;
  int above_run = 0;  // steps in a row the indicator has been above the band
  std::vector<double> step_times;
  replay::WindowOptions w;
  w.from = p.from;
  w.to = p.to;
  w.plan_at = [&](int64_t step) { return probe_plan(p, run, step); };
  w.on_step = [&](int64_t step, replay::ReplayedStep& rs) {
    step_times.push_back(rs.step_s);
    out.step_s += rs.step_s;
    ++out.steps;
    const bool finite = std::isfinite(rs.replayed.loss);
    double top_logit = -INFINITY;
    for (auto& [key, v] : replay::window_series({rs})) {
      auto& dst = series.values[key];
      dst.insert(dst.end(), v.begin(), v.end());
      if (!v.empty() && key.size() > 10 && key.compare(key.size() - 10, 10, ".max_logit") == 0)
        top_logit = std::max(top_logit, v.back());
    }
    out.max_logit.push_back(top_logit);
    if (!p.band.empty() && out.indicator_at < 0) {
      const size_t i = static_cast<size_t>(step - p.from);
      const bool above = i < p.band.size() && std::isfinite(p.band[i]) && top_logit > p.band_k * p.band[i];
      above_run = above ? above_run + 1 : 0;
      if (above_run >= p.band_steps) out.indicator_at = step;
      if (out.indicator_at >= 0 && p.band_stop) {
        out.judged_early = true;
        if (step < p.to) out.stopped_at = step;
        return false;
      }
    }
    if (!finite) {  // the predicate reads NaN/Inf as +inf: the rest cannot change it
      if (step < p.to) out.stopped_at = step;
      if (out.held_at < 0 && pred.monotone()) out.held_at = step;
      return false;
    }
    if (early && step < p.to && step >= next_check && out.held_at < 0) {
      const auto e0 = std::chrono::steady_clock::now();
      bool holds = false;
      try {
        holds = pred.eval(series);
      } catch (const UsageError&) {
        // Not judgeable on this prefix yet (x[STEP] names a later step of the window).
      }
      const double judge_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
      if (holds && out.held_at < 0) out.held_at = step;
      if (holds && !baseline) {
        out.stopped_at = step;
        return false;
      }
      if (!comm) every = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(judge_s / (0.02 * step_times.back()))));
      next_check = step + every;
    }
    // Asked before every step after the first: a race decided elsewhere ends it with no verdict.
    if (step < p.to && cut_short && cut_short()) {
      out.cut = true;
      return false;
    }
    return true;
  };
  replay::run_window(s, st, w);
  if (!out.cut) conclude(out, series, pred, step_times);
  if (out.judged_early) out.fails = true;  // the indicator's verdict: failing, before its break
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

ProbeOutcome judge_probe(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred,
                         const std::string& key, const ExternalRun& r, double wall_s) {
  ProbeOutcome out;
  out.key = key;
  out.plan = probe_plan(p, run, p.from).canonical();
  out.device = r.device;
  out.stopped_at = r.stopped_at;
  Series series = window_start(s, p, run, pred);
  series.values = r.values;
  const size_t ran = series.values["loss"].size();
  out.steps = static_cast<int>(ran);
  auto& recorded = series.values["recorded_loss"];
  recorded.clear();
  if (ran > 0)
    for (const auto& st : s.steps(run.run_id, p.from, p.from + static_cast<int64_t>(ran) - 1))
      recorded.push_back(st.loss());
  for (double t : r.step_s) out.step_s += t;
  conclude(out, series, pred, r.step_s);
  out.wall_s = wall_s;
  return out;
}

EarlyVerdict::EarlyVerdict(store::Store& s, const ProbeSpec& p, const train::RunSpec& run, const Predicate& pred)
    : start_(window_start(s, p, run, pred)),
      pred_(pred),
      from_(p.from),
      whole_(p.baseline_whole && p.candidate && p.candidate->mode == Mode::kPromote &&
             p.candidate->elements.empty()) {
  for (const auto& st : s.steps(run.run_id, p.from, p.to)) recorded_loss_.push_back(st.loss());
}

Series EarlyVerdict::series(const ExternalRun& r) const {
  Series series = start_;
  series.values = r.values;
  const auto it = r.values.find("loss");
  const size_t ran = it == r.values.end() ? 0 : it->second.size();
  series.values["recorded_loss"].assign(recorded_loss_.begin(),
                                        recorded_loss_.begin() + static_cast<long>(std::min(ran, recorded_loss_.size())));
  return series;
}

bool EarlyVerdict::fails(const ExternalRun& r) const {
  try {
    return pred_.eval(series(r));
  } catch (const UsageError&) {
    return false;  // judge_probe raises it again, where the bisect reports it
  }
}

bool EarlyVerdict::stop(const ExternalRun& r) {
  if (held_at_ >= 0 || !pred_.monotone()) return held_at_ >= 0 && !whole_;
  const auto it = r.values.find("loss");
  if (it == r.values.end() || it->second.empty()) return false;
  if (!fails(r)) return false;
  held_at_ = from_ + static_cast<int64_t>(it->second.size()) - 1;
  return !whole_;
}

}  // namespace rwd::bisect
