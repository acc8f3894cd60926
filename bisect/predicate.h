// The failure predicate of `rewind bisect --fail`: a small boolean language evaluated over the
// per-step series (loss, grad_norm, monitors) of one replayed window. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rwd::bisect {

// Per-step values of one judged window: values[key][i] belongs to step first_step + i.
// Keys: "loss", "grad_norm", "lr", "L2.H8.wq_sn", "L2.H8.max_logit", "L2.H8.repmax_rate", ...
// history[key] holds the recorded values of the steps just before the window (its last value
// belongs to step first_step - 1): the context of spike's EMA, x[STEP] and growth's baseline.
struct Series {
  int64_t first_step = 0;
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::vector<double>> history;
};

struct PredicateNode;  // the parsed expression tree (predicate_internal.h)

// Grammar (whitespace anywhere between tokens; positions in errors are 1-based):
//   expr    := or
//   or      := and ('||' and)*                       booleans only
//   and     := cmp ('&&' cmp)*                       booleans only
//   cmp     := sum (('>'|'<'|'>='|'<='|'=='|'!=') sum)?   numbers -> boolean, not chained
//   sum     := product (('+'|'-') product)*
//   product := unary (('*'|'/') unary)*
//   unary   := '-' unary | '!' unary | primary       '!' negates a boolean
//   primary := NUMBER | '(' expr ')' | SERIES | SERIES '[' STEP ']'
//            | 'nan' | 'nan' '(' sum ')'             boolean atoms
//            | max|min|mean|median|first|last|growth '(' sum ')'   -> number
//            | 'rmedian' '(' sum ',' NUMBER ')'   -> series; NUMBER a positive integer literal
//            | 'spike' '(' sum ',' sum ')'           -> boolean
//   SERIES  := [A-Za-z_][A-Za-z0-9_.]*  (a key of Series::values)
// Semantics (one meaning wherever a predicate is judged: a window probe judges the replayed
// window with the recorded history before it as context; the time search judges each recorded
// step t as the one-step window [t, t] with the recorded steps before t as context):
//   * A bare series is the vector of its values over the window; + - * / work elementwise
//     (a scalar broadcasts; two series must have the same length). A comparison involving a
//     series is true if it holds at ANY step of the window: `loss > 6` = "loss exceeded 6".
//   * Non-finite values (NaN, +-Inf) read as +inf everywhere except nan(): a NaN loss is
//     "infinitely bad", so `max(loss) > 6` and `loss > 6` are true and `min(loss) < 1` is
//     false for it. Arithmetic that yields NaN (inf - inf, 0/0) also reads as +inf.
//   * `nan` is true if any value of any series in the window but recorded_loss (the
//     recording's, not the replay's) is NaN or +-Inf; `nan(x)` only looks at x (before the
//     +inf rule).
//   * first/last/max/min/mean/median: over the window (history does not count); the median of
//     an even count is the mean of the two middle values. growth(x) =
//     last(x) / the value of x at the step before the window (from the history; without
//     history: first(x)).
//   * `s[STEP]`: the value at absolute step STEP, in the window or the history; a step in
//     neither is a usage error.
//   * spike(x, k): true if some value x[t] of the window exceeds k * ema[t-1], where the EMA
//     runs over history and window: ema[0] = x[0] of the earliest step, ema[t] = 0.9 ema[t-1] +
//     0.1 x[t] (alpha 0.1). Meant for positive series (loss, grad norm); k must be a scalar.
//   * `nan` and nan(x) look at the window only.
//   * rmedian(x, N): a series like a bare one (x must be series-valued): at step t, the median
//     of x over the N steps t-N..t-1 before it, read from history and window (non-finite values
//     count as +inf in it); +inf where fewer than N recorded steps precede t, so that
//     `grad_norm > 10 * rmedian(grad_norm, 500)` ("the grad norm leaves its range") makes no
//     judgement until there is a range to leave. Its values at history steps (+inf as well
//     where fewer than N steps precede) are context for spike and growth as a bare series' are.
//     A step judgement of `x > k * rmedian(x, N)` reads only the N steps before it.
// Errors: rwd::UsageError "predicate: position N: ..." for syntax and type errors, unknown
// series (with the available keys) and out-of-window steps; rwd::Error(kData) for a series
// with no values or two series of different lengths.
class Predicate {
 public:
  static Predicate parse(const std::string& text);

  // True if the window counts as a failure.
  bool eval(const Series& series) const;
  // The judgement of step `step` of a recording: the one-step window [step, step] with the
  // steps of `recording` before it as history (steps after it are ignored).
  bool eval_step(const Series& recording, int64_t step) const;
  // True when truth is kept as the window grows: if eval() holds on a prefix [from, from+k] of
  // a window (same history), it holds on every longer prefix, so a bisect probe may stop
  // replaying at the first step where it holds (an early verdict). Decided on the syntax and
  // conservatively (false when unsure). Constants: numbers, x[STEP] and + - * / of them.
  // Elementwise-causal: constants, bare series, rmedian(e, N) of an elementwise-causal e, and
  // unary - and + - * / of those (the value at a step depends on it and earlier steps only;
  // max/min/mean/median/first/last/growth are window aggregates, neither). Monotone:
  //   * `nan`; nan(e) and spike(e, k) with e elementwise-causal and k constant;
  //   * a comparison with '>', '<', '>=' or '<=' of two elementwise-causal sides (a series
  //     comparison holds if it holds at any step, and earlier steps keep their values);
  //   * max(e) > c, max(e) >= c, c < max(e), c <= max(e), min(e) < c, min(e) <= c,
  //     c > min(e), c >= min(e), with e elementwise-causal and c constant;
  //   * a && b and a || b of monotone a and b.
  // Everything else is not: '!', '==' and '!=', first/last/mean/median/growth in a comparison,
  // max(e) < c, min(e) > c, and a comparison against an aggregate that is not constant.
  // An error is no verdict: a longer prefix may raise one in a branch a shorter one skipped
  // (x[STEP] of a step past its end), never turn a true verdict false.
  bool monotone() const;
  // Throws UsageError if a series the predicate uses is not among `keys`.
  void validate(const std::vector<std::string>& keys) const;

  // Normalized text (single spaces, minimal parentheses); parse(text()).text() == text().
  std::string text() const;
  // The text as given to parse().
  const std::string& source() const { return source_; }
  // Sorted, duplicate-free names of the series the predicate reads (not counting bare `nan`).
  std::vector<std::string> series_used() const;

 private:
  std::shared_ptr<const PredicateNode> root_;
  std::string source_;
};

}  // namespace rwd::bisect
