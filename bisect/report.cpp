// report.json and report.md of a bisect, and writing the report folder.
#include "bisect/report.h"

#include "bisect/report_probes.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace rwd::bisect {

namespace {

nlohmann::json curve(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
  return a;
}

nlohmann::json elements(const std::vector<Element>& set) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& e : set) a.push_back(to_string(e));
  return a;
}

const char* time_status(TimeSearch::Status s) {
  switch (s) {
    case TimeSearch::Status::kWindow: return "window";
    case TimeSearch::Status::kBakedIn: return "baked-into-earliest-checkpoint";
    case TimeSearch::Status::kNotPrecision: return "not-a-precision-failure";
    case TimeSearch::Status::kNoFailure: return "not-reproducible";
  }
  return "unknown";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(ExitCode::kData, "bisect: cannot write '" + path + "'");
  f << text;
  if (!f) throw Error(ExitCode::kData, "bisect: write failed for '" + path + "'");
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

nlohmann::json cost_json(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

nlohmann::ordered_json near_miss_json(const NearMiss& m) {
  nlohmann::ordered_json j;
  j["series"] = m.series;
  j["from"] = m.from;
  j["values"] = curve(m.values);
  j["threshold"] = curve(m.threshold);
  j["fails"] = m.above ? "above the threshold" : "below the threshold";
  j["closest_step"] = m.closest >= 0 ? nlohmann::json(m.closest) : nlohmann::json(nullptr);
  j["closest_gap"] = cost_json(m.gap);
  int holds = 0;
  for (bool h : m.holds) holds += h;
  j["steps_where_it_holds"] = holds;
  j["note"] = m.note;
  return j;
}

}  // namespace

std::string cost_text(double x) { return std::isfinite(x) ? fmt("%.2f", x) : "-"; }

// The near miss in words: the closest step, its value and threshold.
std::string near_miss_text(const NearMiss& m) {
  int holds = 0;
  for (bool h : m.holds) holds += h;
  if (m.closest < 0 && holds > 0)
    return "It holds at " + std::to_string(holds) + " of " + std::to_string(m.holds.size()) +
           " steps (true from the start, it marks no failure: a failure turns it from false to true); no step "
           "where it does not hold has a threshold to come close to. " + m.note;
  if (m.closest < 0) return m.note;
  const size_t i = static_cast<size_t>(m.closest - m.from);
  return "Closest at step " + std::to_string(m.closest) + ": " + m.series + " " + fmt("%.4g", m.values[i]) +
         ", threshold " + fmt("%.4g", m.threshold[i]) + " (gap " + fmt("%+.3g", m.gap) + "). " + m.note;
}

std::string report_json(const BisectReport& r) {
  nlohmann::ordered_json j;
  j["format"] = "rewind-bisect-report-v1";
  j["store"] = r.store_path;
  j["run"] = r.run;
  j["predicate"] = r.predicate;
  j["model"] = {{"n_layer", r.n_layer}, {"n_head", r.n_head}};
  j["exit_code"] = r.exit_code;
  j["verdict_text"] = r.verdict;
  if (!r.pending.empty()) j["pending"] = r.pending;  // an interim report: what has not run yet
  if (r.time) {
    const TimeSearch& t = *r.time;
    nlohmann::ordered_json tj;
    tj["status"] = time_status(t.status);
    tj["fail_step"] = t.fail_step;
    tj["fail_step_given"] = t.fail_step_given;
    tj["fail_reason"] = t.fail_reason;
    tj["checkpoints_before_failure"] = t.checkpoints;
    tj["c_star"] = t.c_star;
    tj["time_probes"] = t.probes.size();
    tj["log2_checkpoints"] = t.checkpoints.empty() ? 0.0 : std::log2(static_cast<double>(t.checkpoints.size()));
    tj["message"] = t.message;
    tj["recorded_from"] = t.recorded_from;
    tj["recorded_loss"] = curve(t.recorded_loss);
    tj["probes"] = t.probes;
    j["time"] = tj;
  }
  if (r.near_miss) j["near_miss"] = near_miss_json(*r.near_miss);
  j["widened"] = r.widenings;
  if (r.narrowed) {
    const SearchResult& s = r.search;
    nlohmann::ordered_json w;
    w["window"] = {r.from, r.to};
    w["recorded_plan"] = r.recorded_plan;
    w["reference"] = r.reference.empty() ? std::string("all-FP32") : r.reference;
    w["space"] = r.space;
    w["status"] = status_name(s.status);
    w["summary"] = s.summary;
    w["failing_set"] = elements(s.failing_set);
    w["fixing_set"] = elements(s.fixing_set);
    SearchSpace space;
    space.n_layer = r.n_layer;
    space.n_head = r.n_head;
    w["naive_sweep"] = space.sweep_size();
    w["engine_probes"] = s.probes.size();
    w["batches"] = s.batches;
    nlohmann::json phases = nlohmann::json::array();
    for (const auto& p : s.phases) phases.push_back({{"phase", p.phase}, {"probes", p.probes}});
    w["phases"] = phases;
    nlohmann::json fixes = nlohmann::json::array();
    for (const auto& f : r.fixes)
      fixes.push_back({{"name", f.name}, {"spec", f.spec}, {"fixes", f.fixes}, {"probe", f.probe}});
    w["fix_checks"] = fixes;
    if (!r.checks_note.empty()) w["fix_checks_left_out"] = r.checks_note;
    w["recorded_from"] = r.recorded_from;
    w["recorded_loss"] = curve(r.recorded_loss);
    j["narrowing"] = w;
  }
  if (r.horizon) {
    const Horizon& h = *r.horizon;
    nlohmann::ordered_json hj;
    hj["searched"] = h.searched;
    hj["from"] = h.from;
    hj["to"] = h.to;
    hj["fail_step"] = h.fail_step >= 0 ? nlohmann::json(h.fail_step) : nlohmann::json(nullptr);
    hj["hold"] = h.hold;
    hj["capped"] = h.capped;
    hj["point_of_no_return"] = h.point_of_no_return >= 0 ? nlohmann::json(h.point_of_no_return) : nlohmann::json(nullptr);
    hj["granularity"] = h.granularity;
    hj["depth_note"] = h.depth_note;
    nlohmann::json branches = nlohmann::json::array();
    for (const auto& b : h.branches)
      branches.push_back({{"name", b.name}, {"label", b.label}, {"probe", b.probe}, {"held", b.held},
                          {"broke_at", b.broke_at >= 0 ? nlohmann::json(b.broke_at) : nlohmann::json(nullptr)},
                          {"end_grad_norm_ratio", std::isnan(b.end_ratio) ? nlohmann::json(nullptr) : nlohmann::json(b.end_ratio)},
                          {"end_steps", b.end_steps}});
    hj["branches"] = branches;
    hj["claim"] = h.claim;
    hj["fork_command"] = h.fork_command;
    j["horizon"] = hj;
  }
  if (r.early) {
    const BisectReport::EarlyCalls& c = *r.early;
    j["early"] = {{"band_k", c.k}, {"steps", c.steps}, {"stop", c.stop}, {"called_failed", c.called_failed},
                  {"called_held", c.called_held}, {"missed", c.missed}, {"quiet_held", c.quiet_held},
                  {"judged_early", c.judged}, {"lead_steps", c.lead_steps}, {"after_call", c.after_call},
                  {"steps_run", c.steps_run}};
  }
  nlohmann::ordered_json probes = nlohmann::ordered_json::array();
  for (const auto& p : r.probes) {
    nlohmann::ordered_json pj;
    pj["index"] = p.index;
    pj["phase"] = p.phase;
    pj["kind"] = p.spec.kind;
    pj["candidate"] = p.spec.label();
    pj["window"] = {p.spec.from, p.spec.to};
    pj["verdict"] = verdict_word(p.outcome);
    pj["cached"] = p.outcome.cached;
    pj["wall_s"] = p.outcome.wall_s;
    pj["step_s"] = p.outcome.step_s;
    pj["restore_s"] = p.outcome.restore_s;
    if (p.outcome.sent_s >= 0) {
      pj["sent_s"] = p.outcome.sent_s;
      pj["done_s"] = p.outcome.done_s;
    }
    pj["step_median_s"] = p.outcome.step_median_s;
    pj["steps"] = p.outcome.steps;
    if (p.outcome.stopped_at >= 0) pj["stopped_at"] = p.outcome.stopped_at;
    if (p.outcome.indicator_at >= 0) pj["indicator_at"] = p.outcome.indicator_at;
    if (p.outcome.judged_early) pj["judged_early"] = true;
    pj["predicted_cost"] = cost_json(p.predicted_cost);
    pj["measured_cost"] = cost_json(p.measured_cost);
    pj["device"] = p.outcome.device;
    pj["key"] = p.outcome.key;
    pj["plan"] = p.outcome.plan;
    pj["parent"] = p.parent >= 0 ? nlohmann::json(p.parent) : nlohmann::json(nullptr);
    pj["last_loss"] = p.outcome.loss.empty() ? nlohmann::json(nullptr) : cost_json(p.outcome.loss.back());
    const Divergence d = divergence(r, p);
    pj["divergence"] = {{"steps_compared", d.steps},
                        {"last", cost_json(d.last)},
                        {"max_abs", cost_json(d.max_abs)},
                        {"max_step", d.max_step >= 0 ? nlohmann::json(d.max_step) : nlohmann::json(nullptr)},
                        {"nonfinite_step", d.nonfinite_step >= 0 ? nlohmann::json(d.nonfinite_step) : nlohmann::json(nullptr)}};
    pj["loss"] = curve(p.outcome.loss);
    pj["grad_norm"] = curve(p.outcome.grad_norm);
    probes.push_back(pj);
  }
  j["probes"] = probes;
  j["probes_total"] = r.probes.size();
  j["probes_run"] = r.executed;
  j["probes_cached"] = r.cached;
  const ProbeTally t = tally(r);
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& p : t.phases) phases.push_back({{"phase", p.phase}, {"probes", p.probes}});
  j["probe_count"] = {{"total", t.total}, {"run", t.run}, {"cached", t.cached}, {"repeated_in_batch", t.repeated}, {"cut_short", t.cut}, {"not_started", t.skipped},
                      {"time", t.time}, {"narrowing", t.narrowing}, {"narrowing_phases", phases},
                      {"windows", t.windows}, {"fix", t.fix}, {"text", t.text}};
  j["jobs"] = r.jobs;
  j["ranks"] = r.ranks;
  j["gpus"] = r.gpus;
  j["wall_s"] = r.wall_s;
  // Costs in recorded steps (one step of the recorded plan = 1).
  j["cost"] = {{"model", r.cost_model},
               {"recorded_step_s", r.recorded_step_s},
               {"predicted_total", r.predicted_cost},
               {"predicted_probes", r.predicted_probes},
               {"measured_total", r.measured_cost},
               {"measured_probes", r.measured_probes},
               {"reference_step_ratio", r.reference_step_ratio},
               {"calibrated_total", r.calibrated_cost}};
  return j.dump(2);
}

namespace {
std::string join_words(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& w : v) out += (out.empty() ? "" : " ") + w;
  return out.empty() ? "-" : out;
}
}  // namespace

std::string report_markdown(const BisectReport& r) {
  std::string m = "# rewind bisect report\n\n";
  m += "- store: `" + r.store_path + "`, run " + std::to_string(r.run) + "\n";
  m += "- predicate: `" + r.predicate + "`\n";
  m += "- model: " + std::to_string(r.n_layer) + " layers x " + std::to_string(r.n_head) + " heads\n\n";
  if (!r.pending.empty()) m += "**Interim.** Not finished; still to run: " + r.pending + ".\n\n";
  if (r.horizon && !r.horizon->claim.empty()) m += "**Claim.** " + r.horizon->claim + "\n\n";
  m += "## Verdict\n\n```\n" + r.verdict + "```\n\n";  m += tally(r).text + "\n\n";
  if (r.near_miss) m += "## Not reproducible: where the recording came closest\n\n" + near_miss_text(*r.near_miss) + "\n\n";
  if (r.time) {
    m += "## Time bisection\n\n| probe | from checkpoint | to | verdict | wall s |\n|---|---|---|---|---|\n";
    for (int i : r.time->probes) {
      const auto& p = r.probes[i];
      m += "| " + std::to_string(i) + " | " + std::to_string(p.spec.from) + " | " + std::to_string(p.spec.to) + " | " +
           (p.outcome.fails ? "fail" : "pass") + " | " + fmt("%.2f", p.outcome.wall_s) + " |\n";
    }
    m += "\n";
  }
  if (r.narrowed) {
    m += "## Narrowing (window " + std::to_string(r.from) + ":" + std::to_string(r.to) + ")\n\n";
    m += "Recorded plan at the window start: `" + (r.recorded_plan.empty() ? std::string("(defaults)") : r.recorded_plan) + "`\n\n";
    m += "Reference (what a promoted element becomes): " +
         (r.reference.empty() ? std::string("all-FP32") : "`" + r.reference + "`") + "; searched: " + join_words(r.space) + "\n\n";
    m += "| phase | probes |\n|---|---|\n";
    for (const auto& p : r.search.phases) m += "| " + p.phase + " | " + std::to_string(p.probes) + " |\n";
    if (!r.fixes.empty()) {
      m += "\n| fix option | result |\n|---|---|\n";
      for (const auto& f : r.fixes) m += "| " + f.name + (f.spec.empty() ? "" : " (`" + f.spec + "`)") + " | " + (f.fixes ? "fixes" : "does not fix") + " |\n";
    }
    m += "\n";
  }
  m += "## Every probe\n\nCosts in recorded steps (predicted: " + r.cost_model +
       " model; measured: step time over the recorded plan's in this bisect).\n\n"
       "Split from: the probe whose set this one's is part of (the narrowing tree). Divergence: loss minus the recorded "
       "loss at the probe's last step (max |difference| over its steps).\n\n"
       "| # | phase | split from | candidate / plan | window | verdict | steps run | cached | wall s | predicted cost | measured cost | last loss | divergence |\n"
       "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : r.probes) {
    const double last = p.outcome.loss.empty() ? NAN : p.outcome.loss.back();
    m += "| " + std::to_string(p.index) + " | " + p.phase + " | " + (p.parent >= 0 ? std::to_string(p.parent) : "-") + " | `" + p.spec.label() + "` | " + std::to_string(p.spec.from) +
         ":" + std::to_string(p.spec.to) + " | " + verdict_word(p.outcome) + " | " +
         std::to_string(p.outcome.steps) + (p.outcome.stopped_at >= 0 ? " (stopped at " + std::to_string(p.outcome.stopped_at) + ")" : "") + " | " +
         (p.outcome.cached ? "yes" : "no") + " | " + fmt("%.2f", p.outcome.wall_s) + " | " + cost_text(p.predicted_cost) +
         " | " + cost_text(p.measured_cost) + " | " + fmt("%.4g", last) + " | " + divergence_text(divergence(r, p)) + " |\n";
  }
  return m;
}

void write_report(const BisectReport& r, const std::string& dir) {
  if (mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error(ExitCode::kData, "bisect: cannot create report folder '" + dir + "': " + std::strerror(errno));
  write_file(dir + "/report.json", report_json(r));
  write_file(dir + "/report.md", report_markdown(r));
  write_file(dir + "/report.html", report_html(r));
}

}  // namespace rwd::bisect
