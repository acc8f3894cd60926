// The JSON readers of a store's runs table (the recorded plan schedule, run metadata, config)
// and their one integer conversion, rwd::json_int / rwd::whole_number (common/json_int.h):
// a number that is no whole number in range is refused with one line naming the key, never
// cast (a step of 1.1e28 is undefined behaviour in get<int64_t>()).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/json_int.h"
#include "train/config.h"
#include "train/plan_schedule.h"
#include "train/run_meta.h"

namespace rwd {
namespace {

using nlohmann::json;

// Runs `f`, expects an rwd::Error with `code` whose one-line message contains `needle`.
template <class F>
void expect_error(F&& f, ExitCode code, const std::string& needle, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << what << ": " << e.what();
  }
}

TEST(JsonInt, WholeNumbersInRange) {
  EXPECT_EQ(json_int<int64_t>(json::parse("10")), 10);
  EXPECT_EQ(json_int<int64_t>(json::parse("-3")), -3);
  EXPECT_EQ(json_int<int64_t>(json::parse("1e3")), 1000);  // a double, but a whole one
  EXPECT_EQ(json_int<int64_t>(json::parse("9223372036854775807")), INT64_MAX);
  EXPECT_EQ(json_int<uint64_t>(json::parse("18446744073709551615")), UINT64_MAX);
  EXPECT_EQ(json_int<int>(json::parse("4096"), 1, 4096), 4096);
  EXPECT_EQ(json_int<int>(json::parse("-2147483648")), std::numeric_limits<int>::min());
}

TEST(JsonInt, RefusesWhatNoCastMayTake) {
  for (const char* t : {"1.1e28", "10999999999999999999999999999", "9223372036854775808",
                        "18446744073709551615", "1.5", "-1e300", "\"10\"", "true", "null", "[1]"})
    EXPECT_FALSE(json_int<int64_t>(json::parse(t))) << t;
  EXPECT_FALSE(json_int<int64_t>(json::parse("-3"), 0)) << "below lo";
  EXPECT_FALSE(json_int<int>(json::parse("4097"), 1, 4096)) << "above hi";
  EXPECT_FALSE(json_int<int>(json::parse("2147483648")));
  EXPECT_FALSE(json_int<int>(json::parse("1e20")));
  EXPECT_FALSE(json_int<uint64_t>(json::parse("-1")));
  EXPECT_FALSE(json_int<uint64_t>(json::parse("18446744073709551616")));  // 2^64, a double
}

TEST(JsonInt, WholeNumberOfADouble) {
  EXPECT_EQ(whole_number<int>(2147483647.0), 2147483647);
  EXPECT_FALSE(whole_number<int>(2147483648.0));
  EXPECT_EQ(whole_number<int64_t>(-9223372036854775808.0), INT64_MIN);
  EXPECT_FALSE(whole_number<int64_t>(9223372036854775808.0));  // 2^63
  EXPECT_FALSE(whole_number<uint64_t>(18446744073709551616.0));  // 2^64
  EXPECT_FALSE(whole_number<int>(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(whole_number<int>(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(whole_number<int>(0.5));
}

TEST(PlanScheduleJson, RefusesAStepThatIsNoWholeNumberInRange) {
  // The two inputs of fuzz/regressions/plan_schedule/step_*, then a fraction, a
  // negative step, one past int64 and steps of the wrong kind.
  for (const std::string step : {"10999999999999999999999999999", "533333333333333333333333333333333",
                                 "1.1e28", "1.5", "-3", "9223372036854775808", "\"10\"", "null"}) {
    const std::string text = R"({"base":"all=fp32","changes":[[5,"tiling=off"],[)" + step + R"(,"L1.H2.o=low"]]})";
    expect_error([&] { train::PlanSchedule::from_json(text); }, ExitCode::kData, "changes[1] step", text);
  }
}

TEST(PlanScheduleJson, RefusesAMalformedSchedule) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"changes":[]})", "base"},
      {R"({"base":7,"changes":[]})", "base"},
      {R"({"base":""})", "changes"},
      {R"({"base":"","changes":{}})", "changes"},
      {R"({"base":"","changes":[[5]]})", "changes[0]"},
      {R"({"base":"","changes":[[5,"a","b"]]})", "changes[0]"},
      {R"({"base":"","changes":[[5,6]]})", "changes[0] spec"},
  };
  for (const auto& [text, key] : cases)
    expect_error([&] { train::PlanSchedule::from_json(text); }, ExitCode::kData, key, text);
}

TEST(PlanScheduleJson, ReadsWhatItWrites) {
  train::PlanSchedule p;
  p.base = "L*.H*.softmax=stable(beta=2)";
  p.add_change("20:L1.H2.o=fault(strength=8)");
  p.add_change(std::to_string(INT64_MAX) + ":L1.H2.o=low");
  const train::PlanSchedule q = train::PlanSchedule::from_json(p.to_json());
  EXPECT_EQ(q.base, p.base);
  EXPECT_EQ(q.changes, p.changes);
  // A whole step written as a double still reads; a plan recorded as plain text is the base.
  EXPECT_EQ(train::PlanSchedule::from_json(R"({"base":"","changes":[[2e1,"x"]]})").changes[0].first, 20);
  EXPECT_EQ(train::PlanSchedule::from_json("L2.H3.pv=fp32").base, "L2.H3.pv=fp32");
  EXPECT_TRUE(train::PlanSchedule::from_json("L2.H3.pv=fp32").changes.empty());
}

TEST(RunMetaJson, RefusesIntegersOutOfRange) {
  for (const char* text : {R"({"threads":1e20})", R"({"threads":1.5})", R"({"threads":0})",
                           R"({"world_size":18446744073709551615})", R"({"checkpoint_every":-1})",
                           R"({"digest_every":"3"})"}) {
    const std::string key = json::parse(text).begin().key();
    expect_error([&] { train::RunMeta::parse(text); }, ExitCode::kData, key, text);
  }
  EXPECT_EQ(train::RunMeta::parse(R"({"threads":4,"world_size":2e0})").world_size, 2);
}

TEST(ConfigJson, RefusesIntegersOutOfRange) {
  for (const char* text : {R"({"n_layer":2222222222})", R"({"n_layer":1.1e28})", R"({"seed":1e30})",
                           R"({"seed":-1})", R"({"batch_size":2.5})"}) {
    const std::string key = json::parse(text).begin().key();
    expect_error([&] { train::Config::from_json(text); }, ExitCode::kUsage, key, text);
  }
  EXPECT_EQ(train::Config::from_json(R"({"n_layer":3e0})").n_layer, 3);
}

}  // namespace
}  // namespace rwd
