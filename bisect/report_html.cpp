// report.html: one self-contained page (no scripts, no external files): the verdict and one probe
// count with its breakdown, the near miss of a run that does not fail, the time axis, the
// narrowing (plan, phases, fix options), loss per probe, the narrowing tree and every probe.
#include <algorithm>
#include <cmath>

#include "bisect/report.h"
#include "bisect/report_html.h"
#include "bisect/report_probes.h"

namespace rwd::bisect {

namespace {

using html::esc;
using html::Line;

const ProbeEntry* find_probe(const BisectReport& r, const std::string& label, const std::string& kind) {
  for (const auto& p : r.probes)
    if (p.spec.label() == label && p.spec.kind == kind && p.spec.from == r.from && p.spec.to == r.to) return &p;
  return nullptr;
}

constexpr const char* kFailColor = "#d62728";
constexpr const char* kPassColor = "#2ca02c";
constexpr const char* kFailDash = "7,4";  // a failing time probe's line is dashed, a passing one solid

// Not reproducible: the recorded series with the threshold the predicate needed and the step
// where it came closest (what a user needs to choose a threshold).
std::string near_miss_section(const BisectReport& r) {
  const NearMiss& m = *r.near_miss;
  std::string h = "<h2>The run is not reproducible: where the recording came closest to failing</h2>\n<p>" +
                  esc(near_miss_text(m)) + "</p>\n";
  if (m.values.empty()) return h;
  std::vector<Line> lines = {{"recorded " + m.series, "#000", m.from, m.values, 2.0, true, "", true}};
  if (r.narrowed && m.series == "loss")
    if (const ProbeEntry* b = find_probe(r, "fp32{}", "window"))
      lines.push_back({"replay, recorded plan", "#1f77b4", b->spec.from, b->outcome.loss, 1.5, true, "2,3", false});
  lines.push_back({"threshold", "#c45000", m.from, m.threshold, 2.0, true, "7,4", true});
  std::vector<std::pair<int64_t, std::string>> marks;
  if (m.closest >= 0) marks.push_back({m.closest, "closest: " + std::to_string(m.closest)});
  const int64_t to = m.from + std::max<int64_t>(0, static_cast<int64_t>(m.values.size()) - 1);
  const bool gaps = std::any_of(m.threshold.begin(), m.threshold.end(), [](double x) { return std::isnan(x); });
  h += html::chart("recorded " + m.series + " and the threshold of '" + r.predicate + "'", lines, m.from, to, marks,
                   gaps ? "The dashed threshold is missing at steps that cannot be judged (e.g. the first step of a "
                          "spike, or before an rmedian has its steps)." : "");
  return h;
}

std::string time_section(const BisectReport& r) {
  const TimeSearch& t = *r.time;
  std::vector<Line> lines = {{"recorded run", "#000", t.recorded_from, t.recorded_loss, 2.0, true}};
  bool pass_legend = false, fail_legend = false;
  for (int i : t.probes) {
    const auto& p = r.probes[i];
    bool& shown = p.outcome.fails ? fail_legend : pass_legend;
    lines.push_back({p.outcome.fails ? "time probe: still fails" : "time probe: avoids it",
                     p.outcome.fails ? kFailColor : kPassColor, p.spec.from, p.outcome.loss, 1.5, !shown,
                     p.outcome.fails ? kFailDash : ""});
    shown = true;
  }
  std::vector<std::pair<int64_t, std::string>> marks;
  const bool hold = r.horizon && r.horizon->searched;
  if (t.status == TimeSearch::Status::kWindow)
    marks.push_back({t.c_star, (hold ? "no return after " : "c*=") + std::to_string(t.c_star)});
  marks.push_back({t.fail_step, "F=" + std::to_string(t.fail_step)});
  // With --hold the time probes run past the failure step, to the horizon.
  const int64_t end = r.horizon && r.horizon->searched ? std::max(t.fail_step, r.horizon->to) : t.fail_step;
  if (end > t.fail_step) marks.push_back({end, "horizon " + std::to_string(end)});
  return "<h2>Time axis: fix replays from checkpoints</h2>\n" +
         html::chart("loss: recorded vs replays under the fix plan from each probed checkpoint", lines, t.recorded_from,
                     end, marks, "Dashed: the replay still fails; solid: it avoids the failure.");
}

// What report.md says of the narrowing: the recorded plan, the reference, the space, the
// probes per phase and the fix options.
std::string narrowing_section(const BisectReport& r) {
  std::string h = "<h2>Narrowing: window " + std::to_string(r.from) + ":" + std::to_string(r.to) + "</h2>\n";
  h += "<p>Recorded plan at the window start: <code>" +
       esc(r.recorded_plan.empty() ? std::string("(defaults)") : r.recorded_plan) + "</code></p>\n";
  std::string space;
  for (const auto& w : r.space) space += (space.empty() ? "" : " ") + w;
  h += "<p>Reference (what a promoted element becomes): " +
       (r.reference.empty() ? std::string("all-FP32") : "<code>" + esc(r.reference) + "</code>") +
       "; searched: <code>" + esc(space.empty() ? "-" : space) + "</code></p>\n";
  h += "<h3>Probes per phase of the search engine</h3>\n<table><tr><th>phase</th><th>probes</th></tr>\n";
  for (const auto& p : r.search.phases)
    h += "<tr><td>" + esc(p.phase) + "</td><td>" + std::to_string(p.probes) + "</td></tr>\n";
  h += "</table>\n";
  if (!r.fixes.empty()) {
    h += "<h3>Fix options checked on the window</h3>\n<div class='scroll' tabindex='0' role='region' "
         "aria-label='fix options'><table><tr><th>fix option</th><th>plan</th><th>result</th><th>probe</th></tr>\n";
    for (const auto& f : r.fixes)
      h += std::string("<tr class='") + (f.fixes ? "pass" : "fail") + "'><td>" + esc(f.name) + "</td><td><code>" +
           esc(f.spec.empty() ? "fp32" + to_string(r.search.fixing_set) : f.spec) + "</code></td><td>" +
           (f.fixes ? "\u2713 fixes" : "\u2717 does not fix") + "</td><td>" +
           (f.probe >= 0 ? "#" + std::to_string(f.probe) : std::string("-")) + "</td></tr>\n";
    h += "</table></div>\n";
  }
  std::vector<Line> lines;
  for (const auto& p : r.probes)
    if (p.spec.kind == "window" && p.spec.from == r.from)
      lines.push_back({"", "#ccc", p.spec.from, p.outcome.loss, 1.0, false});
  lines.push_back({"recorded", "#000", r.recorded_from, r.recorded_loss, 2.0, true});
  // Each named line has its own dash besides its colour; the note says which ones fail.
  std::string verdicts;
  auto named = [&](const ProbeEntry& p, const std::string& name, const char* color, const char* dash, const char* look) {
    lines.push_back({name, color, p.spec.from, p.outcome.loss, 2.0, true, dash});
    verdicts += std::string(verdicts.empty() ? "" : "; ") + name + " (" + look + "): " + (p.outcome.fails ? "fails" : "passes");
  };
  if (const ProbeEntry* b = find_probe(r, "fp32{}", "window"))
    named(*b, "baseline (recorded plan)", kFailColor, "7,4", "red, dashed");
  if (const ProbeEntry* a = find_probe(r, "low{}", "window"))
    named(*a, r.reference.empty() ? "all-FP32" : "reference", "#1f77b4", "2,2", "blue, dotted");
  if (!r.fixes.empty() && r.fixes.front().probe >= 0)
    named(r.probes[r.fixes.front().probe], "fix: fp32" + to_string(r.search.fixing_set), kPassColor, "", "green, solid");
  lines.push_back({"other probes", "#ccc", r.from, {}, 1.0, true});
  return h + "<h2>Loss per probe over the window " + std::to_string(r.from) + ":" + std::to_string(r.to) + "</h2>\n" +
         html::chart("loss per step (grey: every narrowing probe)", lines, r.from, r.to, {},
                     verdicts.empty() ? "" : "Verdicts: " + verdicts + ".");
}

// How far each probe's loss went from the recorded one, at a glance.
std::string divergence_section(const BisectReport& r) {
  std::vector<html::Dot> dots;
  for (const auto& p : r.probes) {
    if (p.outcome.cut) continue;  // no verdict, no curve
    const Divergence d = divergence(r, p);
    dots.push_back({p.index, d.nonfinite_step >= 0 ? INFINITY : d.steps ? d.max_abs : NAN, p.outcome.fails});
  }
  return "<h2>Divergence from the recorded run</h2>\n" +
         html::dot_chart("largest |loss - recorded loss| of each probe over its steps", dots) +
         "<p class='note'>A probe replays recorded steps under another plan; how far its loss moved from the recorded "
         "one (log axis; 0 and NaN/Inf on rows of their own; a probe with no recorded step to compare is left out). "
         "The table below gives each value and the difference at the probe's last step.</p>\n";
}

std::string probe_table(const BisectReport& r) {
  std::string h =
      "<h2>Every probe</h2>\n<p class='note'>Split from: the probe whose set this one's is part of (the tree above). "
      "Divergence: the probe's loss minus the recorded loss at its last step (the largest |difference| over its "
      "steps in brackets).</p>\n<div class='scroll' tabindex='0' role='region' aria-label='every probe, scrolls "
      "sideways'><table><tr><th>#</th><th>phase</th><th>split from</th><th>candidate / plan</th><th>window</th>"
      "<th>verdict</th><th>steps run</th><th>cached</th><th>wall s</th><th>predicted cost</th><th>measured cost</th>"
      "<th>last loss</th><th>divergence</th><th>device</th></tr>\n";
  for (const auto& p : r.probes) {
    const char* v = p.outcome.cut ? "cut" : p.outcome.fails ? "fail" : "pass";
    const double last = p.outcome.loss.empty() ? NAN : p.outcome.loss.back();
    h += "<tr class='" + std::string(v) + "'><td>" + std::to_string(p.index) + "</td><td>" + esc(p.phase) + "</td><td>" +
         (p.parent >= 0 ? "#" + std::to_string(p.parent) : std::string("-")) + "</td><td><code>" +
         esc(p.spec.label()) + "</code></td><td>" + std::to_string(p.spec.from) + ":" + std::to_string(p.spec.to) +
         "</td><td>" + (p.outcome.cut ? "\u2013 cut short" : p.outcome.fails ? "\u2717 fail" : "\u2713 pass") + "</td><td>" +
         std::to_string(p.outcome.steps) +
         (p.outcome.stopped_at >= 0 ? " (stopped at " + std::to_string(p.outcome.stopped_at) + ")" : "") + "</td><td>" +
         (p.outcome.cached ? "yes" : "no") + "</td><td>" + html::g4(p.outcome.wall_s) + "</td><td>" +
         cost_text(p.predicted_cost) + "</td><td>" + cost_text(p.measured_cost) + "</td><td>" + html::g4(last) +
         "</td><td>" + esc(divergence_text(divergence(r, p))) + "</td><td>" + esc(p.outcome.device) + "</td></tr>\n";
  }
  return h + "</table></div>\n";
}

// The outcome in words above the verdict's text: the status without dashes and the culprits.
std::string result_line(const BisectReport& r) {
  std::string status;
  if (r.narrowed) status = status_name(r.search.status);
  else if (r.time) status = r.time->status == TimeSearch::Status::kWindow ? "causal window found"
                            : r.time->status == TimeSearch::Status::kBakedIn ? "baked into the earliest checkpoint"
                            : r.time->status == TimeSearch::Status::kNotPrecision ? "not a precision failure"
                                                                                   : "not reproducible";
  if (status.empty()) return "";
  std::replace(status.begin(), status.end(), '-', ' ');
  std::string h = "<p><strong>Result: " + esc(status) + "</strong>";
  if (r.narrowed && !r.search.failing_set.empty())
    h += "; failing set <code>" + esc(to_string(r.search.failing_set)) + "</code>";
  if (r.narrowed && !r.search.fixing_set.empty())
    h += "; fixing set <code>" + esc(to_string(r.search.fixing_set)) + "</code>";
  return h + "</p>\n";
}

}  // namespace

std::string report_html(const BisectReport& r) {
  // Readable on a phone and a laptop: the page never gets wider than the screen (the verdict,
  // long plans and the tree wrap, charts scale, the probe table scrolls inside its own box).
  std::string h =
      "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
      "<meta name='viewport' content='width=device-width, initial-scale=1'>"
      "<title>rewind bisect report</title>\n"
      "<style>body{font-family:sans-serif;margin:0 auto;padding:12px;max-width:1100px}"
      "pre{background:#f5f5f5;padding:10px;white-space:pre-wrap;overflow-wrap:anywhere}"
      "code{overflow-wrap:anywhere}svg{max-width:100%;height:auto}.scroll{overflow-x:auto}"
      "table{border-collapse:collapse;margin:6px 0}caption{text-align:left;font-size:13px;padding:2px 0}"
      "td,th{border:1px solid #ccc;padding:3px 8px;font-size:12px}.note{font-size:13px;color:#444}"
      ".claim{border-left:4px solid #2ca02c;padding:6px 10px;background:#f3faf3}.fail{background:#fbe0e0}.pass{background:#e0f4e0}"
      ".tree ul{list-style:none;margin:0;padding-left:9px;border-left:1px solid #999}"
      ".tree>ul{padding-left:0;border-left:none}.tree li{margin:3px 0 3px 3px;font-size:13px;overflow-wrap:anywhere}"
      ".tree .v{padding:0 4px;border-radius:3px;white-space:nowrap}.tree .meta{color:#555;font-size:12px}"
      "</style></head><body><main>\n";
  h += "<h1>rewind bisect report</h1>\n<p>store <code>" + esc(r.store_path) + "</code>, run " + std::to_string(r.run) +
       ", predicate <code>" + esc(r.predicate) + "</code>, model " + std::to_string(r.n_layer) + " layers x " +
       std::to_string(r.n_head) + " heads" +
       (r.narrowed ? ", reference <code>" + esc(r.reference.empty() ? std::string("all-FP32") : r.reference) + "</code>"
                   : std::string()) +
       "</p>\n" +
       (r.pending.empty() ? std::string()
                          : "<p class='claim fail'><strong>Interim.</strong> This bisect had not finished when this page was "
                            "written; still to run: " + esc(r.pending) + ".</p>\n") +
       html::claim(r) + "<h2>Verdict</h2>\n" + result_line(r) + "<pre>" + esc(r.verdict) +
       "</pre>\n<p><strong>Probes.</strong> " + esc(tally(r).text) + "</p>\n";
  if (r.near_miss) h += near_miss_section(r);
  if (r.time && !r.time->probes.empty()) h += time_section(r);
  if (r.narrowed) h += narrowing_section(r);
  h += html::horizon_section(r);
  if (r.probes.empty()) return h + "<p>No probe ran.</p>\n</main></body></html>\n";
  h += "<h2>Narrowing tree (\u2717 fails, \u2713 passes)</h2>\n" + html::tree(r);
  return h + divergence_section(r) + probe_table(r) + "</main></body></html>\n";
}

}  // namespace rwd::bisect
