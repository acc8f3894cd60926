// Pieces of report.html shared by its files (not a public API): HTML escaping, number labels,
// the inline SVG line chart (report_html_chart.cpp) and the narrowing tree (report_html_tree.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bisect/driver.h"

namespace rwd::bisect::html {

std::string esc(const std::string& s);
std::string num(double x);  // "%.1f": SVG coordinates
std::string g4(double x);   // "%.4g"

struct Line {
  std::string name, color;
  int64_t from = 0;
  std::vector<double> values;
  double width = 2.0;
  bool legend = true;
  std::string dash;   // SVG stroke-dasharray ("" solid): what tells lines apart besides colour
  bool gaps = false;  // a NaN is a gap in the line (else the line ends there, marked with an x)
};

// A line chart over steps, scaled to the page width, with a <title>, role=img and aria-label.
// After the SVG, a note for every labelled line that another one hides (the same values at
// every step), and `desc` when given.
std::string chart(const std::string& title, const std::vector<Line>& lines, int64_t x0, int64_t x1,
                  const std::vector<std::pair<int64_t, std::string>>& marks = {}, const std::string& desc = "");

// One probe's divergence for the dot chart: its largest |loss - recorded loss| (0: none, +inf:
// the probe's loss went NaN/Inf, NaN: nothing to compare) and its verdict.
struct Dot {
  int probe = 0;
  double value = NAN;
  bool fails = false;
};
// The probes' divergences on a log axis, one mark per probe (a cross fails, a circle passes),
// zero on a row of its own at the bottom and NaN/Inf on one at the top.
std::string dot_chart(const std::string& title, const std::vector<Dot>& dots);

// The verdict's claim about its horizon as a paragraph ("" without one), and the horizon's
// branches as loss and gradient-norm charts (report_html_horizon.cpp).
std::string claim(const BisectReport& r);
std::string horizon_section(const BisectReport& r);

// The narrowing tree as nested lists: every probe under the probe whose set it was split from.
std::string tree(const BisectReport& r);

}  // namespace rwd::bisect::html
