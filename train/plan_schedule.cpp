// PlanSchedule: the plan at a step, and the schedule to and from the JSON a store records.
#include "train/plan_schedule.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/error.h"

namespace rwd::train {

plan::Plan PlanSchedule::at(int64_t step, int n_layer, int n_head) const {
  plan::Plan p = plan::parse(base, n_layer, n_head);
  for (const auto& [from, spec] : changes)
    if (from <= step) p = plan::apply(p, spec);
  return p;
}

std::string PlanSchedule::to_json() const {
  nlohmann::json j;
  j["base"] = base;
  j["changes"] = nlohmann::json::array();
  for (const auto& [s, spec] : changes) j["changes"].push_back({s, spec});
  // Text that is not UTF-8 is no plan (parse rejects it); writing it must not throw a JSON
  // library error all the same (found by fuzz/fuzz_plan_schedule.cpp).
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

PlanSchedule PlanSchedule::from_json(const std::string& text) {
  PlanSchedule p;
  try {
    auto j = nlohmann::json::parse(text);
    if (!j.is_object()) {  // a plain plan string recorded without a schedule
      p.base = text;
      return p;
    }
    p.base = j.at("base").get<std::string>();
    // at(): a recorded change that is not a [step, spec] pair is bad data, not a crash.
    for (const auto& c : j.at("changes")) {
      p.changes.emplace_back(c.at(0).get<int64_t>(), c.at(1).get<std::string>());
    }
  } catch (const nlohmann::json::exception&) {
    p.base = text;
    p.changes.clear();
  }
  return p;
}

void PlanSchedule::add_change(const std::string& arg) {
  auto colon = arg.find(':');
  if (colon == std::string::npos || colon == 0)
    throw UsageError("--plan-from: expected STEP:SPEC, got '" + arg + "'");
  int64_t step = 0;
  try {
    size_t used = 0;
    step = std::stoll(arg.substr(0, colon), &used);
    if (used != colon || step < 0) throw std::invalid_argument(arg);
  } catch (const std::logic_error&) {
    throw UsageError("--plan-from: bad step in '" + arg + "'");
  }
  changes.emplace_back(step, arg.substr(colon + 1));
  std::stable_sort(changes.begin(), changes.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
}

}  // namespace rwd::train
