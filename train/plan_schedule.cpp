// PlanSchedule: the plan at a step, and the schedule to and from the JSON a store records.
#include "train/plan_schedule.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "common/error.h"
#include "common/json_int.h"

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

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw Error(ExitCode::kData, "recorded plan schedule is not valid: " + key + " " + what);
}

}  // namespace

PlanSchedule PlanSchedule::from_json(const std::string& text) {
  PlanSchedule p;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    j = nullptr;
  }
  if (!j.is_object()) {  // a plain plan string recorded without a schedule
    p.base = text;
    return p;
  }
  // A schedule is what to_json writes; anything else in one is bad data, refused naming the
  // key (a step through get<int64_t>() was a cast of any double, 1.1e28 too: undefined).
  auto base = j.find("base");
  if (base == j.end() || !base->is_string()) bad("base", "must be a string");
  p.base = base->get<std::string>();
  auto changes = j.find("changes");
  if (changes == j.end() || !changes->is_array()) bad("changes", "must be an array of [step, spec] pairs");
  for (size_t i = 0; i < changes->size(); ++i) {
    const nlohmann::json& c = (*changes)[i];
    const std::string key = "changes[" + std::to_string(i) + "]";
    if (!c.is_array() || c.size() != 2) bad(key, "must be a [step, spec] pair");
    const std::optional<int64_t> step = json_int<int64_t>(c[0], 0);
    if (!step) bad(key, "step must be a whole number in 0.." + std::to_string(INT64_MAX));
    if (!c[1].is_string()) bad(key, "spec must be a string");
    p.changes.emplace_back(*step, c[1].get<std::string>());
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
