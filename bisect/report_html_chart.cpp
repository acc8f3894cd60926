// report.html's inline SVG line chart: scaled to the page width, one number of decimals per
// axis, lines told apart by dash as well as colour, long curves thinned to their bucket extremes,
// and a note for every line another one hides.
#include <algorithm>
#include <cmath>
#include <limits>

#include "bisect/report_html.h"

namespace rwd::bisect::html {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else if (c == '\'') o += "&#39;";
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

namespace {

constexpr size_t kMaxPoints = 1200;  // per line; a longer curve keeps each bucket's min and max

// Indices of the values drawn: all of them, or per bucket the first, min and max (in order).
std::vector<size_t> thinned(const std::vector<double>& v) {
  std::vector<size_t> out;
  if (v.size() <= kMaxPoints) {
    for (size_t i = 0; i < v.size(); ++i) out.push_back(i);
    return out;
  }
  const size_t buckets = kMaxPoints / 3;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * v.size() / buckets, hi = (b + 1) * v.size() / buckets;
    size_t mn = lo, mx = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(v[i])) {  // a non-finite value is kept: it ends or breaks the line
        mn = mx = i;
        break;
      }
      if (v[i] < v[mn]) mn = i;
      if (v[i] > v[mx]) mx = i;
    }
    for (size_t i : {lo, std::min(mn, mx), std::max(mn, mx)})
      if (out.empty() || out.back() < i) out.push_back(i);
  }
  return out;
}

// Whether line a is hidden under b (drawn later): b has a value at each of a's steps, within
// `tolerance` (a pixel's worth of the y axis), and a's non-finite steps are b's.
bool hidden_under(const Line& a, const Line& b, double tolerance) {
  if (a.values.empty() || a.from < b.from ||
      a.from + static_cast<int64_t>(a.values.size()) > b.from + static_cast<int64_t>(b.values.size()))
    return false;
  for (size_t i = 0; i < a.values.size(); ++i) {
    const double x = a.values[i], y = b.values[static_cast<size_t>(a.from - b.from) + i];
    if (std::isfinite(x) != std::isfinite(y)) return false;
    if (std::isfinite(x) && std::fabs(x - y) > tolerance) return false;
  }
  return true;
}

// Round ticks inside [lo, hi]: a step of 1, 2 or 5 times a power of ten giving about `n`
// intervals, every label with the step's decimals (1.5 2.0 2.5, not 1.63 2.4 3.25).
struct Ticks {
  std::vector<double> at;
  std::vector<std::string> labels;
};
Ticks nice_ticks(double lo, double hi, int n) {
  Ticks t;
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {2.0, 5.0, 10.0})
    if (step < raw) step = f * mag;
  const double span = std::max(std::fabs(lo), std::fabs(hi));
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 6);
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) {
    char lab[48];
    if (span >= 1e6 || span < 1e-3)
      std::snprintf(lab, sizeof lab, "%.2e", v);  // the same mantissa digits on every label
    else
      std::snprintf(lab, sizeof lab, "%.*f", decimals, std::fabs(v) < 1e-9 * step ? 0.0 : v);
    t.at.push_back(v);
    t.labels.push_back(lab);
  }
  return t;
}

// An SVG's opening with its accessible name, the title text and the plot's frame. viewBox +
// max-width: the chart scales down to a phone's width instead of widening the page.
std::string frame(const char* cls, const std::string& title, double W, double H, double L, double R, double T,
                  double B) {
  return "<svg xmlns='http://www.w3.org/2000/svg' class='" + std::string(cls) + "' viewBox='0 0 " + num(W) + " " +
         num(H) + "' width='" + num(W) + "' height='" + num(H) + "' role='img' aria-label='" + esc(title) +
         "' font-family='sans-serif' font-size='11'>\n<title>" + esc(title) + "</title>\n<text x='" + num(L) +
         "' y='18' font-size='13' font-weight='bold'>" + esc(title) + "</text>\n<rect x='" + num(L) + "' y='" +
         num(T) + "' width='" + num(W - L - R) + "' height='" + num(H - T - B) + "' fill='none' stroke='#999'/>\n";
}

}  // namespace

std::string chart(const std::string& title, const std::vector<Line>& lines, int64_t x0, int64_t x1,
                  const std::vector<std::pair<int64_t, std::string>>& marks, const std::string& desc) {
  const double W = 760, H = 300, L = 72, R = 190, T = 30, B = 40;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& l : lines)
    for (double v : l.values)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-9 * std::max(1.0, std::fabs(hi))) hi = lo + std::max(1.0, std::fabs(lo) * 0.1);
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  if (x1 <= x0) x1 = x0 + 1;
  auto X = [&](double s) { return L + (s - x0) / double(x1 - x0) * (W - L - R); };
  auto Y = [&](double v) { return T + (hi - v) / (hi - lo) * (H - T - B); };
  std::string s = frame("chart", title, W, H, L, R, T, B);
  const Ticks yt = nice_ticks(lo, hi, 5);
  for (size_t i = 0; i < yt.at.size(); ++i)
    s += "<text x='" + num(L - 5) + "' y='" + num(Y(yt.at[i]) + 4) + "' text-anchor='end'>" + yt.labels[i] + "</text>\n";
  // Steps: whole numbers only (a window of 3 steps gets 3 ticks, not 1.5).
  const Ticks xt = nice_ticks(static_cast<double>(x0), static_cast<double>(x1), 4);
  for (double st : xt.at)
    if (st == std::floor(st))
      s += "<text x='" + num(X(st)) + "' y='" + num(H - B + 15) + "' text-anchor='middle'>" +
           std::to_string(static_cast<long long>(st)) + "</text>\n";
  s += "<text x='" + num((L + W - R) / 2) + "' y='" + num(H - 8) + "' text-anchor='middle'>step</text>\n";
  for (const auto& [step, label] : marks) {
    const bool right = X(step) > (L + W - R) / 2;
    s += "<line x1='" + num(X(step)) + "' x2='" + num(X(step)) + "' y1='" + num(T) + "' y2='" + num(H - B) +
         "' stroke='#767676' stroke-dasharray='4,3'/>\n<text x='" + num(X(step) + (right ? -3 : 3)) + "' y='" +
         num(T + 12) + "'" + (right ? " text-anchor='end'" : "") + ">" + esc(label) + "</text>\n";
  }
  int legend = 0;
  const std::string dash_attr = "' stroke-dasharray='";
  for (const auto& l : lines) {
    std::vector<std::string> runs(1);
    for (size_t i : thinned(l.values)) {
      const double step = static_cast<double>(l.from + static_cast<int64_t>(i));
      if (!std::isfinite(l.values[i])) {
        if (l.gaps) {
          if (!runs.back().empty()) runs.emplace_back();
          continue;
        }
        s += "<text x='" + num(X(step) - 4) + "' y='" + num(T + 10) + "' fill='" + l.color + "'>x</text>\n";
        break;
      }
      runs.back() += num(X(step)) + "," + num(Y(l.values[i])) + " ";
    }
    for (const auto& pts : runs)
      if (!pts.empty())
        s += "<polyline fill='none' stroke='" + l.color + "' stroke-width='" + num(l.width) +
             (l.dash.empty() ? "" : dash_attr + l.dash) + "' points='" + pts + "'/>\n";
    if (l.legend) {
      const double ly = T + 8 + 16 * legend++;
      s += "<line x1='" + num(W - R + 10) + "' x2='" + num(W - R + 34) + "' y1='" + num(ly) + "' y2='" + num(ly) +
           "' stroke='" + l.color + "' stroke-width='3" + (l.dash.empty() ? "" : dash_attr + l.dash) + "'/><text x='" +
           num(W - R + 39) + "' y='" + num(ly + 4) + "'>" + esc(l.name) + "</text>\n";
    }
  }
  s += "</svg>\n";
  // Lines drawn later cover earlier ones: say which labelled line is hidden under which (the
  // same values, or within a pixel of the plot's height at every step).
  std::vector<std::string> notes;
  const double pixel = (hi - lo) / (H - T - B);
  for (size_t i = 0; i < lines.size(); ++i)
    for (size_t j = lines.size(); j-- > i + 1;)
      if (lines[i].legend && lines[j].legend && hidden_under(lines[i], lines[j], pixel)) {
        notes.push_back("'" + lines[i].name + "' is hidden under '" + lines[j].name + "': " +
                        (hidden_under(lines[i], lines[j], 0) ? "the same value" : "less than a pixel apart") +
                        " at every step.");
        break;
      }
  if (!desc.empty()) notes.insert(notes.begin(), desc);
  if (!notes.empty()) {
    s += "<p class='note'>";
    for (size_t i = 0; i < notes.size(); ++i) s += (i ? " " : "") + esc(notes[i]);
    s += "</p>\n";
  }
  return s;
}

std::string dot_chart(const std::string& title, const std::vector<Dot>& dots) {
  const double W = 760, H = 240, L = 72, R = 190, T = 30, B = 40;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& d : dots)
    if (std::isfinite(d.value) && d.value > 0) lo = std::min(lo, d.value), hi = std::max(hi, d.value);
  if (!std::isfinite(lo)) lo = hi = 1;
  const int e0 = static_cast<int>(std::floor(std::log10(lo))), e1 = std::max(e0 + 1, static_cast<int>(std::ceil(std::log10(hi))));
  const double row = 20;  // the rows of zero (bottom) and NaN/Inf (top), outside the log axis
  const double top = T + row + 8, bottom = H - B - row - 8;
  const int n = std::max<int>(1, static_cast<int>(dots.size()));
  auto X = [&](double i) { return L + 10 + i / std::max(1, n - 1) * (W - L - R - 20); };
  auto Y = [&](double v) {
    if (!std::isfinite(v)) return T + row / 2;
    if (v <= 0) return H - B - row / 2;
    return bottom - (std::log10(v) - e0) / (e1 - e0) * (bottom - top);
  };
  std::string s = frame("dots", title, W, H, L, R, T, B);
  for (double y : {T + row, H - B - row})  // the rows' borders
    s += "<line x1='" + num(L) + "' x2='" + num(W - R) + "' y1='" + num(y) + "' y2='" + num(y) + "' stroke='#ddd'/>\n";
  const int every = std::max(1, (e1 - e0 + 3) / 4);
  for (int e = e0; e <= e1; e += every)
    s += "<text x='" + num(L - 5) + "' y='" + num(Y(std::pow(10.0, e)) + 4) + "' text-anchor='end'>" +
         g4(std::pow(10.0, e)) + "</text>\n";
  s += "<text x='" + num(L - 5) + "' y='" + num(Y(0) + 4) + "' text-anchor='end'>0</text>\n<text x='" + num(L - 5) +
       "' y='" + num(Y(INFINITY) + 4) + "' text-anchor='end'>NaN/Inf</text>\n";
  const int step = std::max(1, n / 10);
  for (int i = 0; i < n; i += step)
    s += "<text x='" + num(X(i)) + "' y='" + num(H - B + 15) + "' text-anchor='middle'>#" + std::to_string(dots.empty() ? 0 : dots[i].probe) + "</text>\n";
  s += "<text x='" + num((L + W - R) / 2) + "' y='" + num(H - 8) + "' text-anchor='middle'>probe</text>\n";
  for (size_t i = 0; i < dots.size(); ++i) {
    const Dot& d = dots[i];
    if (std::isnan(d.value)) continue;
    const double x = X(static_cast<double>(i)), y = Y(d.value);
    s += "<g><title>probe " + std::to_string(d.probe) + ": " + (d.fails ? "fails" : "passes") + ", " +
         (std::isfinite(d.value) ? "max |d loss| " + g4(d.value) : std::string("NaN/Inf loss")) + "</title>";
    if (d.fails)
      s += "<path d='M" + num(x - 4) + "," + num(y - 4) + "L" + num(x + 4) + "," + num(y + 4) + "M" + num(x - 4) + "," +
           num(y + 4) + "L" + num(x + 4) + "," + num(y - 4) + "' stroke='#d62728' stroke-width='2'/></g>\n";
    else
      s += "<circle cx='" + num(x) + "' cy='" + num(y) + "' r='4' fill='none' stroke='#2ca02c' stroke-width='2'/></g>\n";
  }
  const double ly = T + 8;
  s += "<path d='M" + num(W - R + 16) + "," + num(ly - 4) + "L" + num(W - R + 24) + "," + num(ly + 4) + "M" +
       num(W - R + 16) + "," + num(ly + 4) + "L" + num(W - R + 24) + "," + num(ly - 4) +
       "' stroke='#d62728' stroke-width='2'/><text x='" + num(W - R + 32) + "' y='" + num(ly + 4) + "'>fails</text>\n";
  s += "<circle cx='" + num(W - R + 20) + "' cy='" + num(ly + 16) + "' r='4' fill='none' stroke='#2ca02c' "
       "stroke-width='2'/><text x='" + num(W - R + 32) + "' y='" + num(ly + 20) + "'>passes</text>\n";
  return s + "</svg>\n";
}

}  // namespace rwd::bisect::html
