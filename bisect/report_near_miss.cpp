// The near miss of a recording that passes its predicate (report_near_miss.h): per step the
// threshold found by search on the judged series, since a predicate is any expression
// ('grad_norm > 10 * rmedian(grad_norm, 500)' has a threshold that moves with the steps).
#include "bisect/report_near_miss.h"

#include <algorithm>
#include <optional>

#include "common/error.h"

namespace rwd::bisect {

namespace {

// The judgement of step t with the series' value there set to x; nullopt: it cannot be judged.
class StepJudge {
 public:
  StepJudge(const Predicate& pred, Series rec, const std::string& key, int64_t t)
      : pred_(pred), rec_(std::move(rec)), key_(key), t_(t) {}
  std::optional<bool> operator()(double x) {
    std::vector<double>& v = rec_.values.at(key_);
    const size_t i = static_cast<size_t>(t_ - rec_.first_step);
    const double keep = v[i];
    v[i] = x;
    std::optional<bool> out;
    try {
      out = pred_.eval_step(rec_, t_);
    } catch (const Error&) {  // UsageError too: x[STEP] of a step not recorded yet
    }
    v[i] = keep;
    return out;
  }
  Series& rec() { return rec_; }
  void at(int64_t t) { t_ = t; }

 private:
  const Predicate& pred_;
  Series rec_;
  std::string key_;
  int64_t t_;
};

// From `start` (verdict `was`), the nearest value in direction `dir` (+1/-1) with the other
// verdict, by doubling the distance, then bisection between the two; NaN if none up to
// 2^60 times the start's magnitude.
double boundary(StepJudge& judge, double start, bool was, int dir) {
  double step = std::max(std::fabs(start), 1e-6);
  double near = start, far = NAN;
  for (int k = 0; k < 60; ++k, step *= 2) {
    const double x = start + dir * step;
    const std::optional<bool> h = judge(x);
    if (!h) return NAN;
    if (*h != was) {
      far = x;
      break;
    }
    near = x;
  }
  if (std::isnan(far)) return NAN;
  // `near` has the start's verdict, `far` the other; the threshold is where the other begins.
  for (int k = 0; k < 60 && std::fabs(far - near) > 1e-5 * std::max(std::fabs(far), 1e-9); ++k) {
    const double mid = 0.5 * (near + far);
    const std::optional<bool> h = judge(mid);
    if (!h) return NAN;
    (*h == was ? near : far) = mid;
  }
  return was ? near : far;  // the last value that holds when it held, else the first that holds
}

}  // namespace

NearMiss near_miss(const Predicate& pred, const Series& recording, int64_t from, int64_t to) {
  NearMiss m;
  const std::vector<std::string> used = pred.series_used();
  m.series = used.empty() || std::find(used.begin(), used.end(), "loss") != used.end() ? "loss" : used.front();
  m.from = from;
  auto it = recording.values.find(m.series);
  if (it == recording.values.end() || it->second.empty() || from < recording.first_step) {
    // A report still says why there is no curve: the bisect's verdict does not depend on it.
    m.note = "The recording has no values of " + m.series + " from step " + std::to_string(from) + ": nothing to draw.";
    return m;
  }
  const int64_t last = std::min<int64_t>(to, recording.first_step + static_cast<int64_t>(it->second.size()) - 1);
  if (used.empty()) {
    m.note = "The predicate reads no series (only 'nan'): it holds at a NaN or Inf value; no threshold applies.";
    for (int64_t t = from; t <= last; ++t) m.values.push_back(it->second[static_cast<size_t>(t - recording.first_step)]);
    m.threshold.assign(m.values.size(), NAN);
    m.holds.assign(m.values.size(), false);
    return m;
  }
  StepJudge judge(pred, recording, m.series, from);
  int votes_above = 0, votes_below = 0;
  double best = INFINITY;
  for (int64_t t = from; t <= last; ++t) {
    judge.at(t);
    const double v = judge.rec().values.at(m.series)[static_cast<size_t>(t - recording.first_step)];
    m.values.push_back(v);
    const std::optional<bool> h = std::isfinite(v) ? judge(v) : std::nullopt;
    m.holds.push_back(h.value_or(false));
    double thr = NAN;
    if (h) {
      // Not holding: the threshold lies above (loss > 6) or below (min(loss) < 1). Holding: the
      // value at which it stops holding, searched downward first.
      int dir = *h ? -1 : +1;
      thr = boundary(judge, v, *h, dir);
      if (std::isnan(thr)) thr = boundary(judge, v, *h, dir = -dir);
      const bool fails_above = *h ? dir < 0 : dir > 0;
      if (!std::isnan(thr)) ++(fails_above ? votes_above : votes_below);
      if (!*h && !std::isnan(thr)) {
        const double rel = std::fabs(thr - v) / std::max({std::fabs(thr), std::fabs(v), 1e-12});
        if (rel < best) {
          best = rel;
          m.closest = t;
          m.gap = thr - v;
        }
      }
    }
    m.threshold.push_back(thr);
  }
  m.above = votes_above >= votes_below;
  if (votes_above + votes_below == 0)
    m.note = "No value of " + m.series + " at a single step makes '" + pred.source() +
             "' hold there: there is no threshold to draw.";
  else
    m.note = "The threshold is the value " + m.series + " would have had to " + (m.above ? "exceed" : "fall below") +
             " at each step, the rest as recorded, for '" + pred.source() +
             "' to hold there (each step judged with the steps before it as history, as the time search judges a recording).";
  return m;
}

}  // namespace rwd::bisect
