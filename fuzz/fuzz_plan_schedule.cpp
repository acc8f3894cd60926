// Fuzz target: the plan schedule a store's runs table records (train::PlanSchedule::from_json,
// read by replay, step, bisect and resume) and the `--plan-from STEP:SPEC` flag (add_change).
// A schedule whose plans parse must survive to_json -> from_json and give the same plan at
// each step; any other must still write and read back without a crash.
#include "fuzz/fuzz_util.h"
#include "train/plan_schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = rwd::fuzz::as_text(data, size);
  rwd::fuzz::expect_clean([&] {
    const rwd::train::PlanSchedule p = rwd::train::PlanSchedule::from_json(text);
    const rwd::train::PlanSchedule again = rwd::train::PlanSchedule::from_json(p.to_json());
    p.at(INT64_MAX, 4, 4);  // the rest holds for schedules whose every plan parses
    rwd::fuzz::require(again.base == p.base && again.changes == p.changes,
                       "to_json/from_json round trip differs", text);
    for (int64_t step : {int64_t(0), int64_t(20), INT64_MAX}) {
      rwd::fuzz::expect_clean([&] {
        const std::string canon = p.at(step, 4, 4).canonical();
        rwd::fuzz::require(again.at(step, 4, 4).canonical() == canon, "plan differs", text);
      });
    }
  });
  rwd::fuzz::expect_clean([&] {
    rwd::train::PlanSchedule p;
    p.add_change(text);
  });
  return 0;
}
