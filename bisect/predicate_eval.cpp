// Failure predicate: the evaluator over a window's series and its history (semantics in
// predicate.h), with the trailing medians of rmedian() and the history a predicate reads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "bisect/predicate_internal.h"
#include "bisect/series_names.h"
#include "common/error.h"

namespace rwd::bisect::predicate_internal {
namespace {

// History counts in steps; kAll: every recorded step before the window.
constexpr size_t kAll = std::numeric_limits<size_t>::max();
size_t add_sat(size_t a, size_t b) { return a > kAll - b ? kAll : a + b; }

// Median of values already read through clean() (no NaN, no -inf); even count: the mean of the
// two middle values. Reorders v.
double median_of(std::vector<double>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<long>(mid));
  return clean(0.5 * lower + 0.5 * upper);  // halves first: no overflow of two large values
}

// out[t - begin] = median of x[t-n, t) for t in [begin, x.size()); +inf where t < n.
std::vector<double> trailing_medians(const std::vector<double>& x, size_t begin, size_t n) {
  std::vector<double> out;
  out.reserve(x.size() - begin);
  size_t t = begin;
  for (; t < x.size() && t < n; ++t) out.push_back(kInf);
  if (x.size() - t <= 32) {  // a few steps (a step judgement): a selection per step, O(n) each
    std::vector<double> buf;
    for (; t < x.size(); ++t) {
      buf.assign(x.begin() + static_cast<long>(t - n), x.begin() + static_cast<long>(t));
      out.push_back(median_of(buf));
    }
    return out;
  }
  // Many steps: a sliding window in two halves, lo <= hi, lo holding the lower middle.
  std::multiset<double> lo, hi;
  auto rebalance = [&] {
    if (lo.size() > hi.size() + 1) {
      hi.insert(*lo.rbegin());
      lo.erase(std::prev(lo.end()));
    } else if (hi.size() > lo.size()) {
      lo.insert(*hi.begin());
      hi.erase(hi.begin());
    }
  };
  auto add = [&](double v) {
    (lo.empty() || v <= *lo.rbegin() ? lo : hi).insert(v);
    rebalance();
  };
  auto remove = [&](double v) {  // v <= max(lo) is in lo: an equal value in hi is max(lo) too
    std::multiset<double>& side = v <= *lo.rbegin() ? lo : hi;
    side.erase(side.find(v));
    rebalance();
  };
  for (size_t i = t - n; i < t; ++i) add(x[i]);
  for (; t < x.size(); ++t) {
    out.push_back(n % 2 ? *lo.rbegin() : clean(0.5 * *lo.rbegin() + 0.5 * *hi.begin()));
    add(x[t]);
    remove(x[t - n]);
  }
  return out;
}

// A scalar, or a series over history + window: v[0, ctx) is history, v[ctx, end) the window.
// A series evaluated for `need` history steps holds min(need, all it has) of them.
struct Num {
  bool is_series = false;
  double scalar = 0;
  std::vector<double> v;
  size_t ctx = 0;
  const std::vector<double>& values() {
    if (!is_series) v.assign(1, scalar);
    return v;
  }
  std::vector<double> window() {
    values();
    return {v.begin() + static_cast<long>(ctx), v.end()};
  }
};

class Evaluator {
 public:
  explicit Evaluator(const Series& s) : s_(s) {}

  bool truth(const PredicateNode& n) {
    switch (n.kind) {
      case NodeKind::kOr: return truth(*n.args[0]) || truth(*n.args[1]);
      case NodeKind::kAnd: return truth(*n.args[0]) && truth(*n.args[1]);
      case NodeKind::kNot: return !truth(*n.args[0]);
      case NodeKind::kNanAny:  // the window only: the history is the recording before it
        for (const auto& [key, vals] : s_.values) {
          // recorded_loss is the recording's, not the probe's: a NaN there is the failure under
          // bisection, which every probe (the all-FP32 one too) would otherwise inherit.
          if (key == "recorded_loss") continue;
          for (double x : vals) if (!std::isfinite(x)) return true;
        }
        return false;
      case NodeKind::kCompare: return compare(n);
      default: break;
    }
    // nan(x) and spike(x, k).
    if (n.name == "nan") {
      for (double x : raw(*n.args[0])) if (!std::isfinite(x)) return true;
      return false;
    }
    Num k = value(*n.args[1], 0);
    if (k.is_series) fail_at(n.args[1]->pos, "spike(): k must be a scalar, got a series");
    nonempty(value(*n.args[0], kAll), n);
    const std::vector<double>& x = held_.values();
    // The EMA runs over history and window; only steps of the window can spike.
    double ema = x[0];
    for (size_t t = 1; t < x.size(); ++t) {
      if (t >= held_.ctx && x[t] > k.scalar * ema) return true;
      ema = 0.9 * ema + 0.1 * x[t];  // EMA with alpha 0.1
    }
    return false;
  }

 private:
  const std::vector<double>& series(const PredicateNode& n) {
    auto it = s_.values.find(n.name);
    if (it == s_.values.end()) {
      std::vector<std::string> keys;
      for (const auto& kv : s_.values) keys.push_back(kv.first);
      fail_at(n.pos, "unknown series '" + n.name + "' (" + describe_keys(n.name, keys) + ")");
    }
    return it->second;
  }
  const std::vector<double>& history(const std::string& name) {
    static const std::vector<double> kNone;
    auto it = s_.history.find(name);
    return it == s_.history.end() ? kNone : it->second;
  }
  // Values as recorded in the window (for nan()): a series, an indexed value or an expression.
  std::vector<double> raw(const PredicateNode& n) {
    if (n.kind == NodeKind::kSeries) return series(n);
    if (n.kind == NodeKind::kIndex) return {index(n)};
    return value(n, 0).window();
  }
  // x[STEP]: from the window, else from the history before it.
  double index(const PredicateNode& n) {
    const auto& v = series(n);
    const auto& h = history(n.name);
    const int64_t i = n.step - s_.first_step;
    if (i >= 0 && i < static_cast<int64_t>(v.size())) return v[static_cast<size_t>(i)];
    if (i < 0 && -i <= static_cast<int64_t>(h.size())) return h[h.size() - static_cast<size_t>(-i)];
    fail_at(n.pos, "step " + std::to_string(n.step) + " is outside the window and its history (" +
                       n.name + " has steps " +
                       std::to_string(s_.first_step - static_cast<int64_t>(h.size())) + ".." +
                       std::to_string(s_.first_step + static_cast<int64_t>(v.size()) - 1) + ")");
  }
  // The window part of x (kept whole, history included, in held_).
  std::vector<double> nonempty(Num&& x, const PredicateNode& at) {
    held_ = std::move(x);
    std::vector<double> w = held_.window();
    if (w.empty())
      throw Error(ExitCode::kData, "predicate: position " + std::to_string(at.pos + 1) + ": " +
                                       at.name + "() over a series with no values in the window");
    return w;
  }

  // The value of a number node with (up to) `need` steps of history before the window.
  Num value(const PredicateNode& n, size_t need) {
    Num r;
    switch (n.kind) {
      case NodeKind::kNumber: r.scalar = n.number; return r;
      case NodeKind::kIndex: r.scalar = clean(index(n)); return r;
      case NodeKind::kSeries: {
        r.is_series = true;
        const std::vector<double>& h = history(n.name);
        r.ctx = std::min(need, h.size());
        for (size_t i = h.size() - r.ctx; i < h.size(); ++i) r.v.push_back(clean(h[i]));
        for (double x : series(n)) r.v.push_back(clean(x));
        return r;
      }
      case NodeKind::kNeg: {
        r = value(*n.args[0], need);
        r.scalar = clean(-r.scalar);
        for (double& x : r.v) x = clean(-x);
        return r;
      }
      case NodeKind::kArith: return arith(n, need);
      default: break;
    }
    if (n.name == "rmedian") {
      // Values at the last `need` history steps and the window, each from the n steps before.
      const size_t len = static_cast<size_t>(n.step);
      Num x = value(*n.args[0], add_sat(need, len));
      if (!x.is_series) throw Error(ExitCode::kInternal, "predicate: rmedian() of a scalar");
      r.is_series = true;
      r.ctx = std::min(need, x.ctx);
      r.v = trailing_medians(x.v, x.ctx - r.ctx, len);
      return r;
    }
    // max/min/mean/median/first/last/growth
    std::vector<double> x = nonempty(value(*n.args[0], n.name == "growth" ? 1 : 0), n);
    if (n.name == "max") r.scalar = *std::max_element(x.begin(), x.end());
    if (n.name == "min") r.scalar = *std::min_element(x.begin(), x.end());
    if (n.name == "first") r.scalar = x.front();
    if (n.name == "last") r.scalar = x.back();
    if (n.name == "growth") r.scalar = x.back() / (held_.ctx ? held_.v[held_.ctx - 1] : x.front());
    if (n.name == "median") r.scalar = median_of(x);
    if (n.name == "mean") {
      double sum = 0;
      for (double y : x) sum += y;
      r.scalar = sum / static_cast<double>(x.size());
    }
    r.scalar = clean(r.scalar);
    return r;
  }

  static double apply(const std::string& op, double a, double b) {
    if (op == "+") return clean(a + b);
    if (op == "-") return clean(a - b);
    if (op == "*") return clean(a * b);
    return clean(a / b);
  }
  static bool holds(const std::string& op, double a, double b) {
    if (op == ">") return a > b;
    if (op == "<") return a < b;
    if (op == ">=") return a >= b;
    if (op == "<=") return a <= b;
    if (op == "==") return a == b;
    return a != b;
  }

  // Broadcasts two numbers to a common length (1 if both scalars); two series keep the
  // history they share (their windows are the same steps).
  std::pair<Num, Num> pair_of(const PredicateNode& n, size_t need) {
    Num a = value(*n.args[0], need), b = value(*n.args[1], need);
    if (a.is_series && b.is_series) {
      for (Num* x : {&a, &b}) {
        const size_t drop = x->ctx - std::min(a.ctx, b.ctx);
        x->v.erase(x->v.begin(), x->v.begin() + static_cast<long>(drop));
        x->ctx -= drop;
      }
      if (a.v.size() != b.v.size())
        throw Error(ExitCode::kData, "predicate: position " + std::to_string(n.pos + 1) +
                                         ": series of different lengths (" +
                                         std::to_string(a.v.size() - a.ctx) + " and " +
                                         std::to_string(b.v.size() - b.ctx) + " steps)");
    }
    if ((a.is_series && a.v.size() == a.ctx) || (b.is_series && b.v.size() == b.ctx))
      throw Error(ExitCode::kData, "predicate: position " + std::to_string(n.pos + 1) +
                                       ": a series has no values in the window");
    return {std::move(a), std::move(b)};
  }
  Num arith(const PredicateNode& n, size_t need) {
    auto [a, b] = pair_of(n, need);
    Num r;
    r.is_series = a.is_series || b.is_series;
    r.ctx = a.is_series ? a.ctx : b.ctx;
    if (!r.is_series) {
      r.scalar = apply(n.name, a.scalar, b.scalar);
      return r;
    }
    size_t len = a.is_series ? a.v.size() : b.v.size();
    for (size_t i = 0; i < len; ++i)
      r.v.push_back(
          apply(n.name, a.is_series ? a.v[i] : a.scalar, b.is_series ? b.v[i] : b.scalar));
    return r;
  }
  bool compare(const PredicateNode& n) {
    auto [a, b] = pair_of(n, 0);
    size_t len = a.is_series ? a.v.size() : (b.is_series ? b.v.size() : 1);
    const size_t from = a.is_series ? a.ctx : b.ctx;
    for (size_t i = from; i < len; ++i)  // a series comparison holds if it holds at any step
      if (holds(n.name, a.is_series ? a.v[i] : a.scalar, b.is_series ? b.v[i] : b.scalar))
        return true;
    return false;
  }

  const Series& s_;
  Num held_;
};

// The history steps the evaluator reads from a bare series under n when n's value is asked for
// with `need` steps of history: the same rules as Evaluator::value.
size_t need_below(const PredicateNode& n, size_t need) {
  switch (n.kind) {
    case NodeKind::kSeries: return need;
    case NodeKind::kIndex: return kAll;  // any recorded step may be named
    case NodeKind::kCompare: need = 0; break;
    case NodeKind::kFunc:
      if (n.name == "spike")
        return std::max(need_below(*n.args[0], kAll), need_below(*n.args[1], 0));
      if (n.name == "rmedian")
        return need_below(*n.args[0], add_sat(need, static_cast<size_t>(n.step)));
      need = n.name == "growth" ? 1 : 0;
      break;
    default: break;
  }
  size_t most = 0;
  for (const auto& a : n.args) most = std::max(most, need_below(*a, need));
  return most;
}

}  // namespace

size_t history_need(const PredicateNode& root) { return need_below(root, 0); }

bool evaluate(const PredicateNode& root, const Series& series) {
  return Evaluator(series).truth(root);
}

}  // namespace rwd::bisect::predicate_internal

namespace rwd::bisect {

using predicate_internal::evaluate;
using predicate_internal::history_need;

bool Predicate::eval(const Series& series) const {
  if (!root_) throw Error(ExitCode::kInternal, "predicate: evaluating an empty predicate");
  return evaluate(*root_, series);
}

bool Predicate::eval_step(const Series& recording, int64_t step) const {
  Series one;
  one.first_step = step;
  const size_t i = static_cast<size_t>(step - recording.first_step);
  const std::vector<std::string> used = series_used();
  // Only the history the predicate reads (all of it for spike and x[STEP], N steps for
  // rmedian(x, N), one for growth, none for comparisons and aggregates): no O(step) copy per
  // judged step for `grad_norm > 10 * rmedian(grad_norm, 500)`.
  const size_t need = root_ ? history_need(*root_) : 0;
  for (const auto& [key, v] : recording.values) {
    if (i >= v.size()) continue;
    one.values[key] = {v[i]};
    if (std::binary_search(used.begin(), used.end(), key))  // only what the predicate reads
      one.history[key].assign(v.begin() + static_cast<long>(i - std::min(i, need)),
                              v.begin() + static_cast<long>(i));
  }
  return eval(one);
}

}  // namespace rwd::bisect
