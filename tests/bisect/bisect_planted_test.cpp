// Planted faults beyond bisect_cli_test's (which also plants in other layers,
// heads and ops), each localized exactly on the tiny model (2 layers x 4 heads, lr 0.01), with
// every probe's predicted and measured cost in the report:
// faults that switch on between checkpoints (--plan-from STEP, checkpoints every 10), and two
// faults in different layers switched on at different steps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bisect_test_util.h"

namespace rwd::bisect::testing {
namespace {

// Calibrated strengths (bisect_test_util.h, docs/plan.md "Faults for testing"); a clean run keeps
// max(loss) <= 2.25 after step 20.
const char* kFail = "'nan || max(loss) > 3'";
const std::string kStrong = "fault(strength=25600)";

class BisectPlanted : public TinyRunSuite {
 protected:
  static void SetUpTestSuite() { make_data("bisect_planted"); }

  // Records `steps` steps, a checkpoint every 10, with the --plan-from schedule `plan_from`.
  std::string record(const std::string& name, int steps, const std::string& plan_from) {
    const std::string store = dir_ + "/" + name + ".db";
    Cmd c = rewind_cmd(train_args(data_, store, steps, 10, "--learning-rate 0.01" + plan_from));
    EXPECT_EQ(c.code, 0) << c.out;
    return store;
  }

  nlohmann::json bisect(const std::string& store, const std::string& name, const std::string& how) {
    const std::string report = dir_ + "/" + name;
    Cmd c = rewind_cmd("bisect --store " + store + " " + how + " --fail " + kFail + " --quiet --report " + report);
    EXPECT_EQ(c.code, 4) << name << ": " << c.out;
    nlohmann::json r = read_json(report + "/report.json");
    expect_costs(r, c.out);
    return r;
  }

  // Every window probe has a predicted cost, every probe run here a measured one
  // (the baseline probe measures the recorded step, cost 1 per step), and the totals add up
  // in report.json and in the summary the command prints.
  static void expect_costs(const nlohmann::json& r, const std::string& out) {
    const auto& cost = r["cost"];
    EXPECT_EQ(cost["model"], "h100");
    EXPECT_GT(cost["recorded_step_s"].get<double>(), 0);
    double predicted = 0, measured = 0;
    for (const auto& p : r["probes"]) {
      if (p["kind"] == "window") EXPECT_TRUE(p["predicted_cost"].is_number()) << p["candidate"];
      if (p["kind"] == "window" && p["candidate"] == "fp32{}") {
        const double steps = p["window"][1].get<double>() - p["window"][0].get<double>() + 1;
        EXPECT_DOUBLE_EQ(p["predicted_cost"].get<double>(), steps);  // the recorded plan
      }
      ASSERT_TRUE(p["measured_cost"].is_number()) << p["candidate"];
      // Measured from the warm (median) step time: its steps x median / the recorded plan's.
      const double median = p["step_median_s"].get<double>();
      EXPECT_GT(median, 0) << p["candidate"];
      EXPECT_LE(median * p["steps"].get<double>(), 2.0 * p["step_s"].get<double>() + 1e-9) << p["candidate"];  // half the steps take >= the median
      EXPECT_NEAR(p["measured_cost"].get<double>(),
                  median * p["steps"].get<double>() / cost["recorded_step_s"].get<double>(),
                  1e-9 * p["measured_cost"].get<double>() + 1e-12)
          << p["candidate"];
      if (p["predicted_cost"].is_number()) predicted += p["predicted_cost"].get<double>();
      measured += p["measured_cost"].get<double>();
    }
    EXPECT_NEAR(cost["predicted_total"].get<double>(), predicted, 1e-6);
    EXPECT_NEAR(cost["measured_total"].get<double>(), measured, 1e-6);
    EXPECT_NE(out.find("cost: predicted "), std::string::npos) << out;
    EXPECT_NE(out.find(", measured "), std::string::npos) << out;
  }

};

using Names = std::vector<std::string>;

// Faults that switch on between checkpoints (steps 23 and 27, checkpoints every 10). From 23
// the loss passes 3 at once: c* = 20 and the narrowing replays the schedule change inside
// 20:23. From 27 the loss passes 3 only at step 36 and FP32 from checkpoint 30 still avoids
// it: c* = 30, the fault is on throughout the window.
TEST_F(BisectPlanted, FaultsSwitchedOnBetweenCheckpoints) {
  struct Case {
    int step;
    std::string loc;
    int c_star;
  };
  for (const Case& c : {Case{23, "L1.H3.pv", 20}, Case{27, "L0.H2.delta", 30}}) {
    const std::string name = "between_" + std::to_string(c.step);
    const std::string store = record(name, 50, " --plan-from '" + std::to_string(c.step) + ":" + c.loc + "=" + kStrong + "'");
    nlohmann::json r = bisect(store, name + "_report", "--find-window");
    EXPECT_EQ(r["time"]["c_star"], c.c_star) << c.loc;
    EXPECT_GE(r["time"]["fail_step"].get<int>(), c.step) << c.loc;
    EXPECT_EQ(r["narrowing"]["status"], "localized") << c.loc;
    EXPECT_EQ(strings(r["narrowing"]["failing_set"]), Names{c.loc});
    EXPECT_EQ(strings(r["narrowing"]["fixing_set"]), Names{c.loc});
  }
}

// Two faults in different layers, switched on at different steps between checkpoints, each
// failing alone: the failing set is one of them, the fixing set exactly both.
TEST_F(BisectPlanted, TwoFaultsInDifferentLayersBetweenCheckpoints) {
  const std::string store = record("two", 40, " --plan-from '22:L0.H2.pv=" + kStrong + "' --plan-from '26:L1.H0.delta=" + kStrong + "'");
  nlohmann::json r = bisect(store, "two_report", "--window 20:39");
  const auto& w = r["narrowing"];
  EXPECT_EQ(w["status"], "separate-fix");
  EXPECT_EQ(strings(w["fixing_set"]), (Names{"L0.H2.pv", "L1.H0.delta"}));
  const Names f = strings(w["failing_set"]);
  EXPECT_TRUE(f == Names{"L0.H2.pv"} || f == Names{"L1.H0.delta"}) << w["summary"];
  EXPECT_LE(w["engine_probes"].get<int>(), 40);
}

}  // namespace
}  // namespace rwd::bisect::testing
