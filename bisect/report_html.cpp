// report.html: one self-contained page (no scripts, no external files) with inline SVG charts:
// loss per probe over the window, the narrowing tree by level, and the time-probe axis.
#include <algorithm>
#include <cmath>
#include <limits>

#include "bisect/report.h"

namespace rwd::bisect {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

std::string g4(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

struct Line {
  std::string name, color;
  int64_t from = 0;
  std::vector<double> values;
  double width = 2.0;
  bool legend = true;
};

// A line chart over steps; NaN/Inf values end a line and are marked with a cross at the top.
std::string chart(const std::string& title, const std::vector<Line>& lines, int64_t x0, int64_t x1,
                  const std::vector<std::pair<int64_t, std::string>>& marks = {}) {
  const double W = 760, H = 300, L = 60, R = 170, T = 30, B = 40;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& l : lines)
    for (double v : l.values)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  if (x1 <= x0) x1 = x0 + 1;
  auto X = [&](double s) { return L + (s - x0) / double(x1 - x0) * (W - L - R); };
  auto Y = [&](double v) { return T + (hi - v) / (hi - lo) * (H - T - B); };
  // viewBox + max-width: the chart scales down to a phone's width instead of widening the page.
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " + num(W) + " " + num(H) + "' width='" +
                  num(W) + "' height='" + num(H) + "' role='img' aria-label='" + esc(title) +
                  "' font-family='sans-serif' font-size='11'>\n<title>" + esc(title) + "</title>\n";
  s += "<text x='" + num(L) + "' y='18' font-size='13' font-weight='bold'>" + esc(title) + "</text>\n";
  s += "<rect x='" + num(L) + "' y='" + num(T) + "' width='" + num(W - L - R) + "' height='" + num(H - T - B) +
       "' fill='none' stroke='#999'/>\n";
  // One number of decimals for every label of the axis (1.6 2.4 3.3, not 1.63 2.44 3.25).
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10((hi - lo) / 4.0))) + 1, 0, 6);
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4.0;
    char lab[48];
    if (std::fabs(hi) >= 1e6)
      std::snprintf(lab, sizeof lab, "%.3g", v);
    else
      std::snprintf(lab, sizeof lab, "%.*f", decimals, v);
    s += "<text x='" + num(L - 5) + "' y='" + num(Y(v) + 4) + "' text-anchor='end'>" + lab + "</text>\n";
    const double st = x0 + (x1 - x0) * i / 4.0;
    s += "<text x='" + num(X(st)) + "' y='" + num(H - B + 15) + "' text-anchor='middle'>" + g4(std::round(st)) + "</text>\n";
  }
  s += "<text x='" + num((L + W - R) / 2) + "' y='" + num(H - 8) + "' text-anchor='middle'>step</text>\n";
  for (const auto& [step, label] : marks) {
    s += "<line x1='" + num(X(step)) + "' x2='" + num(X(step)) + "' y1='" + num(T) + "' y2='" + num(H - B) +
         "' stroke='#767676' stroke-dasharray='4,3'/>\n<text x='" + num(X(step) + (X(step) > (L + W - R) / 2 ? -3 : 3)) +
         "' y='" + num(T + 12) + "'" + (X(step) > (L + W - R) / 2 ? " text-anchor='end'" : "") + ">" + esc(label) +
         "</text>\n";
  }
  int legend = 0;
  for (const auto& l : lines) {
    std::string pts;
    for (size_t i = 0; i < l.values.size(); ++i) {
      const double step = static_cast<double>(l.from + static_cast<int64_t>(i));
      if (!std::isfinite(l.values[i])) {
        s += "<text x='" + num(X(step) - 4) + "' y='" + num(T + 10) + "' fill='" + l.color + "'>x</text>\n";
        break;
      }
      pts += num(X(step)) + "," + num(Y(l.values[i])) + " ";
    }
    s += "<polyline fill='none' stroke='" + l.color + "' stroke-width='" + num(l.width) + "' points='" + pts + "'/>\n";
    if (l.legend) {
      const double ly = T + 8 + 16 * legend++;
      s += "<line x1='" + num(W - R + 10) + "' x2='" + num(W - R + 30) + "' y1='" + num(ly) + "' y2='" + num(ly) +
           "' stroke='" + l.color + "' stroke-width='3'/><text x='" + num(W - R + 35) + "' y='" + num(ly + 4) + "'>" +
           esc(l.name) + "</text>\n";
    }
  }
  return s + "</svg>\n";
}

// The narrowing tree: one row per phase (levels top to bottom), one box per probe.
std::string tree(const BisectReport& r) {
  std::vector<std::string> rows;
  for (const auto& p : r.probes)
    if (std::find(rows.begin(), rows.end(), p.phase) == rows.end()) rows.push_back(p.phase);
  const double rowh = 46, boxh = 26, left = 120;
  double width = 760;
  std::vector<double> cursor(rows.size(), left);
  std::string boxes;
  for (const auto& p : r.probes) {
    const size_t row = std::find(rows.begin(), rows.end(), p.phase) - rows.begin();
    std::string label = p.spec.label();
    if (label.size() > 46) label = label.substr(0, 43) + "...";
    label = (p.outcome.fails ? "\u2717 " : "\u2713 ") + label;  // fail/pass not by colour alone
    const double w = 14 + 6.2 * label.size();
    const double x = cursor[row], y = 10 + row * rowh;
    cursor[row] += w + 8;
    width = std::max(width, cursor[row] + 10);
    const char* fill = p.outcome.fails ? "#f4b6b6" : "#b9e4b9";
    boxes += "<g><title>probe " + std::to_string(p.index) + ": " + esc(p.spec.label()) + " -> " +
             (p.outcome.fails ? "fail" : "pass") + (p.outcome.cached ? " (cached)" : "") + "</title><rect x='" + num(x) +
             "' y='" + num(y) + "' width='" + num(w) + "' height='" + num(boxh) + "' rx='4' fill='" + fill +
             "' stroke='#555'/><text x='" + num(x + 7) + "' y='" + num(y + 17) + "' font-family='monospace'>" +
             esc(label) + "</text></g>\n";
  }
  const double height = 20 + rows.size() * rowh;
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' class='tree' width='" + num(width) + "' height='" +
                  num(height) + "' role='img' aria-label='narrowing tree: one row per phase, one box per probe' "
                  "font-family='sans-serif' font-size='11'>\n";
  for (size_t i = 0; i < rows.size(); ++i)
    s += "<text x='4' y='" + num(10 + i * rowh + 17) + "' font-weight='bold'>" + esc(rows[i]) + "</text>\n";
  return s + boxes + "</svg>\n";
}

const ProbeEntry* find_probe(const BisectReport& r, const std::string& label, const std::string& kind) {
  for (const auto& p : r.probes)
    if (p.spec.label() == label && p.spec.kind == kind && p.spec.from == r.from && p.spec.to == r.to) return &p;
  return nullptr;
}

}  // namespace

std::string report_html(const BisectReport& r) {
  // Readable on a phone and a laptop: the page never gets wider than the screen (the verdict and
  // long plans wrap, charts scale, the tree and the probe table scroll inside their own box).
  std::string h = "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
                  "<meta name='viewport' content='width=device-width, initial-scale=1'>"
                  "<title>rewind bisect report</title>\n"
                  "<style>body{font-family:sans-serif;margin:0 auto;padding:12px;max-width:1100px}"
                  "pre{background:#f5f5f5;padding:10px;white-space:pre-wrap;overflow-wrap:anywhere}"
                  "code{overflow-wrap:anywhere}svg{max-width:100%;height:auto}svg.tree{max-width:none}"
                  ".scroll{overflow-x:auto}table{border-collapse:collapse}"
                  "td,th{border:1px solid #ccc;padding:3px 8px;font-size:12px}"
                  ".fail{background:#fbe0e0}.pass{background:#e0f4e0}</style></head><body><main>\n";
  h += "<h1>rewind bisect report</h1>\n<p>store <code>" + esc(r.store_path) + "</code>, run " + std::to_string(r.run) +
       ", predicate <code>" + esc(r.predicate) + "</code>, model " + std::to_string(r.n_layer) + " layers x " +
       std::to_string(r.n_head) + " heads" +
       (r.narrowed ? ", reference <code>" + esc(r.reference.empty() ? std::string("all-FP32") : r.reference) + "</code>"
                   : std::string()) +
       "</p>\n<h2>Verdict</h2>\n<pre>" + esc(r.verdict) + "</pre>\n";
  if (r.time && !r.time->probes.empty()) {
    const TimeSearch& t = *r.time;
    std::vector<Line> lines = {{"recorded run", "#000", t.recorded_from, t.recorded_loss, 2.0, true}};
    bool pass_legend = false, fail_legend = false;
    for (int i : t.probes) {
      const auto& p = r.probes[i];
      bool& shown = p.outcome.fails ? fail_legend : pass_legend;
      lines.push_back({p.outcome.fails ? "time probe: still fails" : "time probe: avoids it",
                       p.outcome.fails ? "#d62728" : "#2ca02c", p.spec.from, p.outcome.loss, 1.5, !shown});
      shown = true;
    }
    std::vector<std::pair<int64_t, std::string>> marks;
    if (t.status == TimeSearch::Status::kWindow) marks.push_back({t.c_star, "c*=" + std::to_string(t.c_star)});
    marks.push_back({t.fail_step, "F=" + std::to_string(t.fail_step)});
    h += "<h2>Time axis: fix replays from checkpoints</h2>\n" +
         chart("loss: recorded vs replays under the fix plan from each probed checkpoint", lines, t.recorded_from,
               t.fail_step, marks);
  }
  if (r.narrowed) {
    std::vector<Line> lines;
    for (const auto& p : r.probes)
      if (p.spec.kind == "window" && p.spec.from == r.from)
        lines.push_back({"", "#ccc", p.spec.from, p.outcome.loss, 1.0, false});
    lines.push_back({"recorded", "#000", r.recorded_from, r.recorded_loss, 2.0, true});
    if (const ProbeEntry* b = find_probe(r, "fp32{}", "window"))
      lines.push_back({"baseline (recorded plan)", "#d62728", b->spec.from, b->outcome.loss, 2.0, true});
    if (const ProbeEntry* a = find_probe(r, "low{}", "window"))
      lines.push_back({r.reference.empty() ? "all-FP32" : "reference", "#1f77b4", a->spec.from, a->outcome.loss, 2.0, true});
    if (!r.fixes.empty() && r.fixes.front().probe >= 0) {
      const auto& f = r.probes[r.fixes.front().probe];
      lines.push_back({"fix: fp32" + to_string(r.search.fixing_set), "#2ca02c", f.spec.from, f.outcome.loss, 2.0, true});
    }
    lines.push_back({"other probes", "#ccc", r.from, {}, 1.0, true});
    h += "<h2>Loss per probe over the window " + std::to_string(r.from) + ":" + std::to_string(r.to) + "</h2>\n" +
         chart("loss per step (grey: every narrowing probe)", lines, r.from, r.to);
  }
  h += "<h2>Narrowing tree (red \u2717: fails, green \u2713: passes)</h2>\n<div class='scroll' tabindex='0' role='region' "
       "aria-label='narrowing tree, scrolls sideways'>" + tree(r) + "</div>\n";
  h += "<h2>Every probe</h2>\n<div class='scroll' tabindex='0' role='region' aria-label='every probe, scrolls sideways'><table><tr><th>#</th><th>phase</th><th>candidate / plan</th>"
       "<th>window</th><th>verdict</th><th>steps run</th><th>cached</th><th>wall s</th><th>predicted cost</th>"
       "<th>measured cost</th><th>device</th></tr>\n";
  for (const auto& p : r.probes) {
    const char* v = p.outcome.fails ? "fail" : "pass";
    h += "<tr class='" + std::string(v) + "'><td>" + std::to_string(p.index) + "</td><td>" + esc(p.phase) +
         "</td><td><code>" + esc(p.spec.label()) + "</code></td><td>" + std::to_string(p.spec.from) + ":" +
         std::to_string(p.spec.to) + "</td><td>" + v + "</td><td>" + std::to_string(p.outcome.steps) +
         (p.outcome.stopped_at >= 0 ? " (stopped at " + std::to_string(p.outcome.stopped_at) + ")" : "") + "</td><td>" +
         (p.outcome.cached ? "yes" : "no") + "</td><td>" +
         g4(p.outcome.wall_s) + "</td><td>" + cost_text(p.predicted_cost) + "</td><td>" + cost_text(p.measured_cost) +
         "</td><td>" + esc(p.outcome.device) + "</td></tr>\n";
  }
  return h + "</table></div>\n</main></body></html>\n";
}

}  // namespace rwd::bisect
