// report.html's horizon: the verdict's claim in one sentence, and the branches it rests on (the
// recorded plan, the reference, the fixing set, each fix check and each tried set) trained on
// past the window, with the point of no return, the failure step and the horizon marked.
#include "bisect/report_html.h"

#include <cmath>

namespace rwd::bisect::html {

namespace {

struct Style {
  const char* color;
  const char* dash;
};

Style style_of(const std::string& name) {
  if (name == "recorded plan") return {"#d62728", "7,4"};
  if (name == "reference") return {"#1f77b4", "2,2"};
  if (name == "fixing set") return {"#2ca02c", ""};
  return {"#9467bd", "4,2,1,2"};
}

std::vector<double> log10_of(const std::vector<double>& v) {
  std::vector<double> out;
  for (double x : v) out.push_back(std::isfinite(x) && x > 0 ? std::log10(x) : NAN);
  return out;
}

}  // namespace

std::string claim(const BisectReport& r) {
  if (!r.horizon || r.horizon->claim.empty()) return "";
  return "<p class='claim'><strong>Claim.</strong> " + esc(r.horizon->claim) + "</p>\n";
}

std::string horizon_section(const BisectReport& r) {
  if (!r.horizon || r.horizon->branches.empty()) return "";
  const Horizon& h = *r.horizon;
  std::vector<Line> loss, grad;
  std::string verdicts;
  bool tried_legend = false;
  for (const auto& b : h.branches) {
    const ProbeEntry& p = r.probes.at(static_cast<size_t>(b.probe));
    const bool tried = b.name == "tried";
    const Style s = tried ? Style{"#bbb", ""} : style_of(b.name);
    const std::string name = tried ? "other tried sets" : b.name + " " + b.label;
    const bool legend = !tried || !tried_legend;
    tried_legend = tried_legend || tried;
    loss.push_back({name, s.color, p.spec.from, p.outcome.loss, tried ? 1.0 : 2.0, legend, s.dash});
    grad.push_back({name, s.color, p.spec.from, log10_of(p.outcome.grad_norm), tried ? 1.0 : 2.0, legend, s.dash});
    if (!tried)
      verdicts += (verdicts.empty() ? "" : "; ") + b.name + ": " +
                  (b.held ? "held through step " + std::to_string(h.to) +
                                (std::isnan(b.end_ratio) ? std::string()
                                                         : ", ending at " + g4(b.end_ratio) + "x the reference's gradient norm" +
                                                               (b.end_ratio > kHealthyEndRatio ? " (not healthy)" : ""))
                          : b.broke_at >= 0 ? "broke at step " + std::to_string(b.broke_at) : "broke");
  }
  std::vector<std::pair<int64_t, std::string>> marks;
  if (h.point_of_no_return >= 0) marks.push_back({h.point_of_no_return, "no return after " + std::to_string(h.point_of_no_return)});
  else marks.push_back({h.from, "start " + std::to_string(h.from)});
  if (h.fail_step >= 0) marks.push_back({h.fail_step, "F=" + std::to_string(h.fail_step)});
  else if (r.narrowed) marks.push_back({r.to, "window end " + std::to_string(r.to)});
  marks.push_back({h.to, "horizon " + std::to_string(h.to)});
  const std::string what = h.searched ? "every probe judged over the horizon (--hold " + std::to_string(h.hold) + ")"
                                      : "the hold check after the window's search";
  return "<h2>Horizon: steps " + std::to_string(h.from) + "-" + std::to_string(h.to) + "</h2>\n<p class='note'>" +
         esc(what) + ". Each line is a branch trained from step " + std::to_string(h.from) +
         "; a line that ends early broke there (its probe stops at the break).</p>\n" +
         chart("loss of each branch past the window", loss, h.from, h.to, marks, "Verdicts: " + verdicts + ".") +
         chart("log10 gradient norm of each branch past the window", grad, h.from, h.to, marks);
}

}  // namespace rwd::bisect::html
