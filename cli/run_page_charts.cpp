// The run page's inline SVG: a line chart over steps (linear or log axis, checkpoints, plan
// changes, non-finite steps marked) and layer x head heatmaps with their colour scale. Every
// chart has a <title>, a <desc> and role='img', and scales to the width it is given (viewBox).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cli/run_page.h"

namespace rwd::cli {

namespace {

std::string fmt(const char* f, double x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}
std::string px(double x) { return fmt("%.1f", x); }

// Tick values of a linear axis over [lo, hi]: steps of 1, 2 or 5 times a power of ten, about
// `want` of them, with the decimals that step needs (so labels are even: 0.5 1.0 1.5).
struct Ticks {
  std::vector<double> at;
  std::vector<std::string> text;
};

Ticks linear_ticks(double lo, double hi, int want, bool integers) {
  const double raw = (hi - lo) / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integers) step = std::max(1.0, std::round(step));
  const bool sci = !integers && (std::max(std::fabs(lo), std::fabs(hi)) >= 1e5 || step < 1e-4);
  const int decimals = integers ? 0 : std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  Ticks t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) {
    const double x = std::fabs(v) < step * 1e-9 ? 0.0 : v;
    char buf[48];
    if (sci)
      std::snprintf(buf, sizeof buf, "%.1e", x);
    else
      std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
    t.at.push_back(x);
    t.text.push_back(buf);
  }
  return t;
}

// Decades of a log axis over [lo, hi] (log10 values), at most ~7 labels.
Ticks log_ticks(double lo, double hi) {
  const int a = static_cast<int>(std::ceil(lo - 1e-9)), b = static_cast<int>(std::floor(hi + 1e-9));
  const int stride = std::max(1, (b - a + 6) / 7);
  Ticks t;
  for (int k = a; k <= b; k += stride) {
    t.at.push_back(k);
    t.text.push_back(k == -2 ? "0.01" : k == -1 ? "0.1" : k >= 0 && k <= 4 ? fmt("%.0f", std::pow(10.0, k))
                                                                          : "1e" + std::to_string(k));
  }
  return t;
}

// Viridis at five stops, interpolated: dark blue (low) to yellow (high); readable in grey too.
std::string viridis(double f) {
  static const double kStops[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  f = std::clamp(f, 0.0, 1.0) * 4.0;
  const int i = std::min(3, static_cast<int>(f));
  const double u = f - i;
  char buf[8];
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = static_cast<int>(std::lround(kStops[i][k] + u * (kStops[i + 1][k] - kStops[i][k])));
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c[0], c[1], c[2]);
  return buf;
}

std::string svg_open(double w, double h, const std::string& title, const std::string& desc,
                     const std::string& cls) {
  return "<svg xmlns='http://www.w3.org/2000/svg' class='" + cls + "' viewBox='0 0 " + px(w) + " " + px(h) +
         "' width='" + px(w) + "' height='" + px(h) + "' role='img' aria-label='" + html_escape(title) + "' font-family='sans-serif' font-size='12' fill='#222'>\n<title>" +
         html_escape(title) + "</title>\n<desc>" + html_escape(desc) + "</desc>\n";
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string short_num(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt("%.4g", x);
}

Curve downsample(const Curve& c, size_t max_points) {
  const size_t n = c.values.size();
  if (n <= max_points || max_points < 3) return c;
  const size_t buckets = max_points / 3;
  Curve out;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t i0 = n * b / buckets, i1 = n * (b + 1) / buckets;
    size_t lo = n, hi = n, bad = n;
    for (size_t i = i0; i < i1; ++i) {
      const double v = c.values[i];
      if (!std::isfinite(v)) {
        if (bad == n) bad = i;
        continue;
      }
      if (lo == n || v < c.values[lo]) lo = i;
      if (hi == n || v > c.values[hi]) hi = i;
    }
    std::vector<size_t> keep;
    for (size_t i : {lo, hi, bad})
      if (i != n && std::find(keep.begin(), keep.end(), i) == keep.end()) keep.push_back(i);
    std::sort(keep.begin(), keep.end());
    for (size_t i : keep) {
      out.steps.push_back(c.steps[i]);
      out.values.push_back(c.values[i]);
    }
  }
  return out;
}

std::string line_chart_svg(const LineChart& c) {
  const double W = 640, H = 250, L = 66, R = 14, T = 14, B = 40;
  const double pw = W - L - R, ph = H - T - B;
  const Curve& cv = c.curve;
  auto plottable = [&](double v) { return std::isfinite(v) && (!c.log_y || v > 0); };
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  int64_t x0 = cv.steps.empty() ? 0 : cv.steps.front(), x1 = cv.steps.empty() ? 1 : cv.steps.back();
  for (double v : cv.values)
    if (plottable(v)) {
      const double y = c.log_y ? std::log10(v) : v;
      lo = std::min(lo, y), hi = std::max(hi, y);
    }
  for (const auto& e : c.extra) {
    for (double v : e.curve.values)
      if (plottable(v)) {
        const double y = c.log_y ? std::log10(v) : v;
        lo = std::min(lo, y), hi = std::max(hi, y);
      }
    if (!e.curve.steps.empty()) {
      x0 = cv.steps.empty() ? e.curve.steps.front() : std::min(x0, e.curve.steps.front());
      x1 = std::max(x1, e.curve.steps.back());
    }
  }
  for (const auto& m : c.marks) x1 = std::max(x1, m.first);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + (c.log_y ? 1.0 : std::max(1e-6, std::fabs(lo) * 0.1));
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  if (x1 <= x0) x1 = x0 + 1;
  auto X = [&](double s) { return L + (s - x0) / double(x1 - x0) * pw; };
  auto Y = [&](double y) { return T + (hi - y) / (hi - lo) * ph; };
  std::string s = svg_open(W, H, c.title, c.desc, "chart");
  s += "<rect x='" + px(L) + "' y='" + px(T) + "' width='" + px(pw) + "' height='" + px(ph) +
       "' fill='#fff' stroke='#767676'/>\n";
  const Ticks yt = c.log_y ? log_ticks(lo, hi) : linear_ticks(lo, hi, 4, false);
  for (size_t i = 0; i < yt.at.size(); ++i) {
    const double y = Y(yt.at[i]);
    s += "<line x1='" + px(L) + "' x2='" + px(L + pw) + "' y1='" + px(y) + "' y2='" + px(y) + "' stroke='#e3e3e3'/>"
         "<text x='" + px(L - 6) + "' y='" + px(y + 4) + "' text-anchor='end'>" + yt.text[i] + "</text>\n";
  }
  const Ticks xt = linear_ticks(double(x0), double(x1), 5, true);
  for (size_t i = 0; i < xt.at.size(); ++i)
    s += "<text x='" + px(X(xt.at[i])) + "' y='" + px(T + ph + 16) + "' text-anchor='middle'>" + xt.text[i] + "</text>\n";
  s += "<text x='" + px(L + pw / 2) + "' y='" + px(H - 6) + "' text-anchor='middle'>step</text>\n";
  s += "<text transform='translate(14," + px(T + ph / 2) + ") rotate(-90)' text-anchor='middle'>" +
       html_escape(c.y_label + (c.log_y ? " (log)" : "")) + "</text>\n";
  // Checkpoints: short purple ticks on the bottom edge; plan changes: dashed orange lines.
  if (!c.checkpoints.empty()) {
    std::string d, list;
    for (int64_t k : c.checkpoints) {
      if (k < x0 || k > x1) continue;
      d += "M" + px(X(double(k))) + " " + px(T + ph) + "v-9";
      if (list.size() < 200) list += (list.empty() ? "" : ", ") + std::to_string(k);
    }
    s += "<path d='" + d + "' stroke='#6a3d9a' stroke-width='2'><title>checkpoints at steps " + list +
         "</title></path>\n";
  }
  for (const auto& [step, spec] : c.changes) {
    if (step < x0 || step > x1) continue;
    const double x = X(double(step));
    s += "<line x1='" + px(x) + "' x2='" + px(x) + "' y1='" + px(T) + "' y2='" + px(T + ph) +
         "' stroke='#b35900' stroke-width='1.5' stroke-dasharray='5,3'><title>plan change at step " +
         std::to_string(step) + ": " + html_escape(spec) + "</title></line>\n";
  }
  // The curve: a polyline per finite stretch; non-finite steps as a red band along the top.
  std::string pts;
  auto flush = [&] {
    if (!pts.empty())
      s += "<polyline fill='none' stroke='" + c.color + "' stroke-width='1.6' points='" + pts + "'/>\n";
    pts.clear();
  };
  size_t bad_from = cv.values.size();
  for (size_t i = 0; i <= cv.values.size(); ++i) {
    const bool end = i == cv.values.size();
    const bool ok = !end && plottable(cv.values[i]);
    if (!end && !ok && !std::isfinite(cv.values[i]) && bad_from == cv.values.size()) bad_from = i;
    if ((ok || end) && bad_from != cv.values.size()) {
      const int64_t a = cv.steps[bad_from], b = cv.steps[i - 1];
      s += "<rect x='" + px(X(double(a)) - 1) + "' y='" + px(T + 1) + "' width='" + px(std::max(2.0, X(double(b)) - X(double(a)) + 2)) +
           "' height='7' fill='#c0392b'><title>non-finite " + html_escape(c.y_label) + " at steps " + std::to_string(a) +
           ".." + std::to_string(b) + "</title></rect>\n";
      bad_from = cv.values.size();
    }
    if (ok) {
      pts += px(X(double(cv.steps[i]))) + "," + px(Y(c.log_y ? std::log10(cv.values[i]) : cv.values[i])) + " ";
    } else {
      flush();
    }
  }
  for (const auto& e : c.extra) {  // finite stretches only: a branch ends where its probe stopped
    for (size_t i = 0; i <= e.curve.values.size(); ++i) {
      if (i < e.curve.values.size() && plottable(e.curve.values[i])) {
        const double v = e.curve.values[i];
        pts += px(X(double(e.curve.steps[i]))) + "," + px(Y(c.log_y ? std::log10(v) : v)) + " ";
        continue;
      }
      if (!pts.empty())
        s += "<polyline fill='none' stroke='" + e.color + "' stroke-width='1.6'" +
             (e.dash.empty() ? "" : " stroke-dasharray='" + e.dash + "'") + " points='" + pts + "'/>\n";
      pts.clear();
    }
  }
  for (const auto& [step, label] : c.marks) {
    const double x = X(double(step));
    s += "<line x1='" + px(x) + "' x2='" + px(x) + "' y1='" + px(T) + "' y2='" + px(T + ph) +
         "' stroke='#555' stroke-dasharray='2,3'/>";
    const bool right = x > L + pw - 70;  // near the right edge the label goes left of its line
    s += "<text x='" + px(right ? x - 3 : x + 3) + "' y='" + px(T + 11) + "'" + (right ? " text-anchor='end'" : "") +
         ">" + html_escape(label) + "</text>\n";
  }
  if (c.highlight >= 0) {
    for (size_t i = 0; i < cv.steps.size(); ++i) {
      if (cv.steps[i] != c.highlight || !plottable(cv.values[i])) continue;
      const double x = X(double(c.highlight)), y = Y(c.log_y ? std::log10(cv.values[i]) : cv.values[i]);
      s += "<circle cx='" + px(x) + "' cy='" + px(y) + "' r='5' fill='none' stroke='#c0392b' stroke-width='2'/>"
           "<text x='" + px(x - 8) + "' y='" + px(std::max(T + 12, y - 8)) + "' text-anchor='end'>peak, step " +
           std::to_string(c.highlight) + "</text>\n";
      break;
    }
  }
  return s + "</svg>\n";
}

double ColourScale::at(double v) const {
  if (log) return hi > lo && v > 0 ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : 0.0;
  return hi > lo ? (v - lo) / (hi - lo) : 0.5;
}

std::string heatmap_svg(const std::string& monitor, const HeadGrid& g, const ColourScale& scale) {
  const int layers = static_cast<int>(g.values.size());
  const int heads = layers ? static_cast<int>(g.values[0].size()) : 0;
  const double cw = std::clamp(320.0 / std::max(1, heads), 12.0, 40.0), ch = std::min(26.0, cw * 0.8);
  const double L = 34, T = 40;
  const double W = L + heads * cw + 6, H = T + layers * ch + 6;
  // Where the grid is extreme, said in words for a screen reader.
  int bl = -1, bh = -1, sl = -1, sh = -1;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      const double v = g.values[l][h];
      if (!std::isfinite(v)) continue;
      if (bl < 0 || v > g.values[bl][bh]) bl = l, bh = h;
      if (sl < 0 || v < g.values[sl][sh]) sl = l, sh = h;
    }
  const std::string title = monitor + " per layer (rows) and head (columns) at step " + std::to_string(g.step);
  const std::string desc =
      bl < 0 ? "no finite value"
             : "highest " + short_num(g.values[bl][bh]) + " at L" + std::to_string(bl) + ".H" + std::to_string(bh) +
                   ", lowest " + short_num(g.values[sl][sh]) + " at L" + std::to_string(sl) + ".H" + std::to_string(sh);
  std::string s = svg_open(W, H, title + ": " + desc, desc, "heat");
  s += "<text x='0' y='14' font-weight='bold'>step " + std::to_string(g.step) + "</text>\n";
  const int every = cw >= 22 ? 1 : cw >= 14 ? 2 : 4;
  for (int h = 0; h < heads; h += every)
    s += "<text x='" + px(L + (h + 0.5) * cw) + "' y='" + px(T - 6) + "' text-anchor='middle' font-size='10'>H" +
         std::to_string(h) + "</text>\n";
  for (int l = 0; l < layers; ++l) {
    s += "<text x='" + px(L - 4) + "' y='" + px(T + (l + 0.5) * ch + 4) + "' text-anchor='end' font-size='10'>L" +
         std::to_string(l) + "</text>\n";
    for (int h = 0; h < heads; ++h) {
      const double v = g.values[l][h];
      const std::string fill = std::isfinite(v) ? viridis(scale.at(v)) : "#bdbdbd";
      s += "<rect x='" + px(L + h * cw) + "' y='" + px(T + l * ch) + "' width='" + px(cw - 1) + "' height='" +
           px(ch - 1) + "' fill='" + fill + "'><title>L" + std::to_string(l) + ".H" + std::to_string(h) + " " +
           html_escape(monitor) + " = " + short_num(v) + "</title></rect>\n";
    }
  }
  return s + "</svg>\n";
}

std::string colour_scale_svg(const std::string& monitor, const ColourScale& scale) {
  const int n = 24;
  const double W = 300, bw = 160.0 / n;
  const std::string lo = short_num(scale.lo), hi = short_num(scale.hi);
  std::string s = svg_open(W, 30, "colour scale of " + monitor + ": dark blue " + lo + " to yellow " + hi +
                                      (scale.log ? " (log)" : ""),
                           "the same scale for every step shown", "scale");
  s += "<text x='0' y='19'>" + lo + "</text>\n";
  for (int i = 0; i < n; ++i)
    s += "<rect x='" + px(50 + i * bw) + "' y='6' width='" + px(bw + 0.5) + "' height='16' fill='" +
         viridis((i + 0.5) / n) + "'/>";
  s += "\n<text x='" + px(50 + 160 + 6) + "' y='19'>" + hi + (scale.log ? " (log)" : "") + "</text>\n";
  return s + "</svg>\n";
}

}  // namespace rwd::cli
