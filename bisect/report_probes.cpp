// The probe count with its breakdown and per-probe divergence (report_probes.h).
#include "bisect/report_probes.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace rwd::bisect {

namespace {

std::string plural(int n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace

ProbeTally tally(const BisectReport& r) {
  ProbeTally t;
  t.total = static_cast<int>(r.probes.size());
  t.run = r.executed;
  t.cached = r.cached;
  t.cut = r.cut;
  t.skipped = r.skipped;
  t.repeated = std::max(0, t.total - t.run - t.cached - t.skipped);
  std::vector<std::pair<int64_t, int64_t>> windows;
  for (const auto& p : r.probes) {
    if (p.phase == "time") {
      ++t.time;
    } else if (p.phase == "fix") {
      ++t.fix;
    } else {
      ++t.narrowing;
      auto c = std::find_if(t.phases.begin(), t.phases.end(), [&](const PhaseCount& x) { return x.phase == p.phase; });
      if (c == t.phases.end()) t.phases.push_back({p.phase, 1});
      else ++c->probes;
      const std::pair<int64_t, int64_t> w{p.spec.from, p.spec.to};
      if (std::find(windows.begin(), windows.end(), w) == windows.end()) windows.push_back(w);
    }
  }
  t.windows = static_cast<int>(windows.size());
  t.engine = r.narrowed ? static_cast<int>(r.search.probes.size()) : 0;

  std::string s = plural(t.total, "probe", "probes") + ": " + std::to_string(t.run) + " run here, " +
                  std::to_string(t.cached) + " read from the probe cache";
  if (t.repeated) s += ", " + std::to_string(t.repeated) + " asked twice in one batch (run once)";
  if (t.cut || t.skipped)
    s += "; parallel races cut " + std::to_string(t.cut) + " short and left " + std::to_string(t.skipped) +
         " unstarted once the probes that decided them had failed (no verdict)";
  s += ". By part: ";
  std::vector<std::string> parts;
  if (r.time) parts.push_back(std::to_string(t.time) + " in the time search (fix replays from checkpoints)");
  if (t.narrowing || r.narrowed) {
    std::string n = std::to_string(t.narrowing) + " in the layer/head/op search";
    if (t.windows > 1) n += " of " + std::to_string(t.windows) + " windows (widened)";
    if (!t.phases.empty()) {
      n += " (";
      for (size_t i = 0; i < t.phases.size(); ++i)
        n += (i ? ", " : "") + t.phases[i].phase + " " + std::to_string(t.phases[i].probes);
      n += ")";
    }
    parts.push_back(n);
  }
  if (t.fix) parts.push_back(plural(t.fix, "fix check", "fix checks"));
  if (t.total == 0) {
    t.text = "0 probes: nothing was replayed.";
    return t;
  }
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? "; " : "") + parts[i];
  s += ".";
  if (r.narrowed && t.engine != t.narrowing)
    s += " The search engine's count in the verdict (" + std::to_string(t.engine) +
         ") is that of the last window's search.";
  if (r.predicted_probes > 0 || r.measured_probes > 0)
    s += " Costs: predicted for " + plural(r.predicted_probes, "probe", "probes") + " of a candidate set, measured for " +
         plural(r.measured_probes, "probe", "probes") + " that ran steps.";
  t.text = s;
  return t;
}

double recorded_loss_at(const BisectReport& r, int64_t step) {
  auto in = [&](const std::vector<double>& v, int64_t from) {
    const int64_t i = step - from;
    return i >= 0 && i < static_cast<int64_t>(v.size()) ? v[static_cast<size_t>(i)] : NAN;
  };
  double x = in(r.recorded_loss, r.recorded_from);
  if (std::isnan(x) && r.time) x = in(r.time->recorded_loss, r.time->recorded_from);
  return x;
}

Divergence divergence(const BisectReport& r, const ProbeEntry& p) {
  Divergence d;
  const std::vector<double>& loss = p.outcome.loss;
  for (size_t i = 0; i < loss.size(); ++i) {
    const int64_t step = p.spec.from + static_cast<int64_t>(i);
    if (!std::isfinite(loss[i])) {
      d.nonfinite_step = step;
      break;
    }
    const double rec = recorded_loss_at(r, step);
    if (!std::isfinite(rec)) continue;
    const double delta = loss[i] - rec;
    ++d.steps;
    if (!(std::fabs(delta) <= d.max_abs)) {  // NaN (the first) or larger
      d.max_abs = std::fabs(delta);
      d.max_step = step;
    }
    if (i + 1 == loss.size()) d.last = delta;
  }
  return d;
}

std::string divergence_text(const Divergence& d) {
  if (d.nonfinite_step >= 0)
    return "NaN/Inf at " + std::to_string(d.nonfinite_step) +
           (d.steps ? " (max " + fmt("%.3g", d.max_abs) + " before)" : std::string());
  if (d.steps == 0) return "-";
  if (d.max_abs == 0) return "0";
  std::string s = std::isnan(d.last) ? std::string("-") : fmt("%+.3g", d.last);
  return s + " (max " + fmt("%.3g", d.max_abs) + " at " + std::to_string(d.max_step) + ")";
}

}  // namespace rwd::bisect
