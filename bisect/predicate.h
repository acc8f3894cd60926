// The failure predicate of `rewind bisect --fail`: a small boolean language evaluated over the
// per-step series (loss, grad_norm, monitors) of one replayed window. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rwd::bisect {

// Per-step values of one window: values[key][i] belongs to step first_step + i.
// Keys: "loss", "grad_norm", "lr", "L2.H8.wq_sn", "L2.H8.max_logit", "L2.H8.repmax_rate", ...
struct Series {
  int64_t first_step = 0;
  std::map<std::string, std::vector<double>> values;
};

struct PredicateNode;  // the parsed expression tree (predicate.cpp)

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
//            | max|min|mean|first|last|growth '(' sum ')'   -> number
//            | 'spike' '(' sum ',' sum ')'           -> boolean
//   SERIES  := [A-Za-z_][A-Za-z0-9_.]*  (a key of Series::values)
// Semantics:
//   * A bare series is the vector of its values over the window; + - * / work elementwise
//     (a scalar broadcasts; two series must have the same length). A comparison involving a
//     series is true if it holds at ANY step of the window: `loss > 6` = "loss exceeded 6".
//   * Non-finite values (NaN, +-Inf) read as +inf everywhere except nan(): a NaN loss is
//     "infinitely bad", so `max(loss) > 6` and `loss > 6` are true and `min(loss) < 1` is
//     false for it. Arithmetic that yields NaN (inf - inf, 0/0) also reads as +inf.
//   * `nan` is true if any value of any series in the window is NaN or +-Inf; `nan(x)` only
//     looks at x (before the +inf rule).
//   * first/last/max/min/mean: over the window. growth(x) = last(x) / first(x).
//   * `s[STEP]`: the value at absolute step STEP; a step outside the window is a usage error.
//   * spike(x, k): true if some value x[t] (t >= 1) exceeds k * ema[t-1], where ema[0] = x[0]
//     and ema[t] = 0.9 ema[t-1] + 0.1 x[t] (EMA alpha 0.1). Meant for positive series (loss,
//     grad norm); k must evaluate to a scalar.
// Errors: rwd::UsageError "predicate: position N: ..." for syntax and type errors, unknown
// series (with the available keys) and out-of-window steps; rwd::Error(kData) for a series
// with no values or two series of different lengths.
class Predicate {
 public:
  static Predicate parse(const std::string& text);

  // True if the window counts as a failure.
  bool eval(const Series& series) const;
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
