// `rewind bisect --find-window` on tiny recorded runs: a fault switched on at step s
// yields the window starting at the last checkpoint before s; a fault from the start yields the
// earliest checkpoint; time probes ~ log2(#checkpoints); the edge cases give clear answers.
#include <gtest/gtest.h>

#include <cmath>

#include "bisect_test_util.h"

namespace rwd::bisect::testing {
namespace {

// Calibrated: lr 0.01; the delta fault at 1e30 replaces the head's gradient by a huge biased
// one (clipping keeps it finite), the loss jumps by >40% over its EMA within ~4 steps.
const char* kFail = "'nan || spike(loss, 1.4)'";
const char* kFault = "L1.H2.delta=fault(strength=1e30)";

class BisectTime : public TinyRunSuite {
 protected:
  static void SetUpTestSuite() { make_data("bisect_time"); }

  // 40 steps, a checkpoint every 10, lr 0.01 unless `extra` sets it.
  std::string record(const std::string& name, const std::string& extra) {
    const std::string store = dir_ + "/" + name + ".db";
    const bool lr = extra.find("learning-rate") != std::string::npos;
    Cmd c = rewind_cmd(train_args(data_, store, 40, 10, extra + (lr ? "" : " --learning-rate 0.01")));
    EXPECT_EQ(c.code, 0) << c.out;
    return store;
  }

  nlohmann::json find(const std::string& store, const std::string& name, const std::string& extra, int want_code,
                      std::string* out = nullptr) {
    const std::string report = dir_ + "/" + name;
    const std::string fail = extra.find("--fail") == std::string::npos ? std::string(" --fail ") + kFail : "";
    Cmd c = rewind_cmd("bisect --store " + store + " --find-window" + fail + " --quiet --report " + report + " " + extra);
    EXPECT_EQ(c.code, want_code) << c.out;
    if (out) *out = c.out;
    return read_json(report + "/report.json");
  }

};

// The fault starts at step 22 (a plan change recorded in the store): the causal window starts
// at checkpoint 20, the last one before 22, and contains 22; then narrowing finds the head.
TEST_F(BisectTime, FaultSwitchedOnMidRunGivesTheWindowAroundIt) {
  const std::string store = record("mid", std::string("--plan-from '22:") + kFault + "'");
  std::string out;
  nlohmann::json r = find(store, "mid_report", "", 4, &out);
  const auto& t = r["time"];
  EXPECT_EQ(t["status"], "window");
  EXPECT_EQ(t["c_star"], 20) << out;
  EXPECT_GE(t["fail_step"].get<int>(), 22);
  const int n = static_cast<int>(t["checkpoints_before_failure"].size());
  EXPECT_LE(t["time_probes"].get<int>(), static_cast<int>(std::ceil(std::log2(n + 1.0))));
  EXPECT_NE(out.find("time probe(s)"), std::string::npos);
  ASSERT_TRUE(r.contains("narrowing"));
  EXPECT_EQ(r["narrowing"]["window"][0], 20);
  EXPECT_EQ(r["narrowing"]["failing_set"], nlohmann::json::array({"L1.H2.delta"}));
  // The all-FP32 probe of the narrowing is the time probe at c*: shared through the cache.
  int cached_all_fp32 = 0;
  for (const auto& p : r["probes"])
    if (p["phase"] == "check" && p["candidate"] == "low{}" && p["cached"]) ++cached_all_fp32;
  EXPECT_EQ(cached_all_fp32, 1);
}

// With the fault on from step 0 the earliest checkpoint is c*, and the report says so.
TEST_F(BisectTime, FaultFromTheStartGivesTheEarliestCheckpoint) {
  const std::string store = record("start", std::string("--plan '") + kFault + "'");
  std::string out;
  nlohmann::json r = find(store, "start_report", "--window-only --until 8 --fail 'last(loss) > 3.6'", 4, &out);
  EXPECT_EQ(r["time"]["status"], "window");
  EXPECT_EQ(r["time"]["c_star"], 0);
  EXPECT_NE(out.find("earliest checkpoint"), std::string::npos) << out;
  EXPECT_FALSE(r.contains("narrowing"));
}

// Edge cases: F outside the recording (usage), no checkpoint before F (data), a failure that
// all-FP32 from step 0 also has (not a precision failure, exit 0), a clean run (exit 0).
TEST_F(BisectTime, EdgeCasesHaveClearAnswers) {
  const std::string store = record("edge", std::string("--plan-from '22:") + kFault + "'");
  Cmd outside = rewind_cmd("bisect --store " + store + " --find-window --until 500 --fail " + kFail + " --quiet");
  EXPECT_EQ(outside.code, 2) << outside.out;
  EXPECT_NE(outside.out.find("outside the recording"), std::string::npos) << outside.out;
  Cmd none = rewind_cmd("bisect --store " + store + " --find-window --until 0 --fail " + kFail + " --quiet");
  EXPECT_EQ(none.code, 3) << none.out;
  EXPECT_NE(none.out.find("no checkpoint before the failure step"), std::string::npos) << none.out;

  const std::string hot = record("hot", "--learning-rate 0.5 --warmup-iters 0");
  nlohmann::json r = find(hot, "hot_report", "--until 30 --fail 'last(loss) > 3'", 0);
  EXPECT_EQ(r["time"]["status"], "not-a-precision-failure");

  const std::string clean = record("clean", "");
  nlohmann::json c = find(clean, "clean_report", "", 0);
  EXPECT_EQ(c["time"]["status"], "not-reproducible");
  EXPECT_EQ(c["probes_total"], 0);
}

}  // namespace
}  // namespace rwd::bisect::testing
