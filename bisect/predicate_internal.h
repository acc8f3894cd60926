// Internals of the failure predicate shared by its parser (predicate.cpp) and its evaluator
// (predicate_eval.cpp): the expression tree and the error and +inf helpers. Not a public API.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bisect/predicate.h"
#include "common/error.h"

namespace rwd::bisect {

enum class NodeKind { kNumber, kSeries, kIndex, kFunc, kNanAny, kNeg, kNot, kArith, kCompare,
                      kAnd, kOr };

struct PredicateNode {
  NodeKind kind = NodeKind::kNumber;
  size_t pos = 0;          // 0-based offset of the node's first character, printed 1-based
  bool boolean = false;    // result type: boolean or number (scalar or series)
  bool series = false;     // a number that is a series (bare series, rmedian, arithmetic of one)
  double number = 0;       // kNumber
  int64_t step = 0;        // kIndex: the step; rmedian: its N
  std::string name;        // series name, function name or operator
  std::vector<std::shared_ptr<const PredicateNode>> args;
  int depth = 1;           // levels of the tree below and including this node
};

namespace predicate_internal {

constexpr double kInf = std::numeric_limits<double>::infinity();

[[noreturn]] inline void fail_at(size_t pos, const std::string& msg) {
  throw UsageError("predicate: position " + std::to_string(pos + 1) + ": " + msg);
}

// Non-finite reads as +inf (predicate.h): a NaN loss is a failure, never silently "small".
inline double clean(double x) { return std::isfinite(x) ? x : kInf; }

// How many recorded steps before the window evaluating `root` reads (SIZE_MAX: all of them).
size_t history_need(const PredicateNode& root);
// The judgement of one window (predicate_eval.cpp).
bool evaluate(const PredicateNode& root, const Series& series);

}  // namespace predicate_internal
}  // namespace rwd::bisect
