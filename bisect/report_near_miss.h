// Where a recording that does not fail its predicate came closest to failing, for the
// report of a "not reproducible" bisect: the series the predicate reads, the threshold it had to
// cross at each step, and the step with the smallest gap. Torch-free.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bisect/predicate.h"

namespace rwd::bisect {

struct NearMiss {
  std::string series;             // "loss" when the predicate reads it, else the first it reads
  int64_t from = 0;               // the step of values[0]
  std::vector<double> values;     // recorded, steps from, from + 1, ...
  // Per step: the value the series would have had to take there (everything else as recorded)
  // for the predicate, judged on that step, to hold; NaN where no finite value does (the step
  // cannot be judged yet, or the predicate does not depend on this series there).
  std::vector<double> threshold;
  std::vector<bool> holds;        // the predicate holds at the recorded value
  bool above = true;              // the series fails by rising above the threshold (else below)
  int64_t closest = -1;           // the step of the smallest relative gap where it does not hold
  double gap = NAN;               // threshold - value at `closest`
  std::string note;               // how to read it, or why there is no threshold
};

// Judges every step of [from, to] of `recording` (its first_step <= from; steps before `from`
// are history) as Predicate::eval_step does, and searches each step's threshold on the chosen
// series by doubling and bisection (relative precision ~1e-5).
NearMiss near_miss(const Predicate& pred, const Series& recording, int64_t from, int64_t to);

}  // namespace rwd::bisect
