// The plan schedule of a run (`--plan` plus `--plan-from STEP:SPEC` changes) and its JSON form
// in a store's runs table. Torch-free, so it is fuzzed cheaply (fuzz/fuzz_plan_schedule.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"

namespace rwd::train {

// A plan that changes at given steps: `base` from step 0, then each (step, spec) applied on
// top of the base from that step on (the last one whose step <= s wins).
struct PlanSchedule {
  std::string base;
  std::vector<std::pair<int64_t, std::string>> changes;  // sorted by step

  plan::Plan at(int64_t step, int n_layer, int n_head) const;
  std::string to_json() const;
  static PlanSchedule from_json(const std::string& text);
  // "STEP:SPEC" as given to --plan-from; throws UsageError.
  void add_change(const std::string& step_colon_spec);
};

}  // namespace rwd::train
