// The SVG line chart of svg_plot.h: a fixed 720x420 canvas, a plot box with a zero line when the
// y range spans zero, and one polyline per series in a fixed colour cycle.
#include "experiments/delta_bias/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace rwd::experiments {
namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 80, kRight = 160, kTop = 40, kBottom = 50;  // margins around the box
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                               "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

// Escapes the XML special characters of a label.
std::string xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace

bool write_svg_lines(const std::string& path, const std::string& title, const std::string& x_label,
                     const std::vector<double>& x, const std::vector<Series>& series) {
  if (x.empty()) return false;
  double x0 = *std::min_element(x.begin(), x.end()), x1 = *std::max_element(x.begin(), x.end());
  double y0 = std::numeric_limits<double>::infinity(), y1 = -y0;
  for (const Series& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) y0 = std::min(y0, v), y1 = std::max(y1, v);
  if (!std::isfinite(y0)) y0 = 0, y1 = 1;
  if (y1 == y0) y0 -= 0.5, y1 += 0.5;
  if (x1 == x0) x1 = x0 + 1;
  const double bw = kWidth - kLeft - kRight, bh = kHeight - kTop - kBottom;
  auto px = [&](double v) { return kLeft + (v - x0) / (x1 - x0) * bw; };
  auto py = [&](double v) { return kTop + (y1 - v) / (y1 - y0) * bh; };

  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n", kWidth, kHeight);
  std::fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  std::fprintf(f, "<text x=\"%g\" y=\"22\" font-size=\"14\">%s</text>\n", kLeft, xml(title).c_str());
  std::fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
                  "stroke=\"black\"/>\n", kLeft, kTop, bw, bh);
  if (y0 < 0 && y1 > 0)
    std::fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#999\" "
                    "stroke-dasharray=\"4 3\"/>\n", kLeft, py(0), kLeft + bw, py(0));
  std::fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.3g</text>\n", kLeft - 4, kTop + 4, y1);
  std::fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.3g</text>\n", kLeft - 4,
               kTop + bh, y0);
  std::fprintf(f, "<text x=\"%g\" y=\"%g\">%.6g</text>\n", kLeft, kTop + bh + 16, x0);
  std::fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.6g</text>\n", kLeft + bw,
               kTop + bh + 16, x1);
  std::fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", kLeft + bw / 2,
               kTop + bh + 34, xml(x_label).c_str());
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    std::fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (size_t j = 0; j < s.y.size() && j < x.size(); ++j)
      if (std::isfinite(s.y[j])) std::fprintf(f, "%.1f,%.1f ", px(x[j]), py(s.y[j]));
    std::fprintf(f, "\"/>\n");
    const double ly = kTop + 14 + 18 * static_cast<double>(i);
    std::fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                 kLeft + bw + 12, ly - 4, kLeft + bw + 32, ly - 4, color);
    std::fprintf(f, "<text x=\"%g\" y=\"%g\">%s</text>\n", kLeft + bw + 38, ly, xml(s.name).c_str());
  }
  std::fprintf(f, "</svg>\n");
  return std::fclose(f) == 0;
}

}  // namespace rwd::experiments
