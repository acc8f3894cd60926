// Predicates end to end: one meaning per predicate through `rewind bisect --find-window` on
// one recording (3 layers x 4 heads, width 64, vocab 64, lr 0.01, 80 steps, checkpoint
// every 10, L1.H2.pv faulted from step 40): spike, max, x[STEP], growth and mean predicates
// each find the failure step where the predicate turns true, and localize the planted op.
#include <gtest/gtest.h>

#include <string>

#include "bisect_test_util.h"

namespace rwd::bisect::testing {
namespace {

class BisectPredicate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("bisect_predicate"));
    const std::string data = *dir_ + "/data.bin";
    Cmd d = rewind_cmd("data synth -o " + data + " --tokens 300000 --vocab 64");
    ASSERT_EQ(d.code, 0) << d.out;
    store_ = new std::string(*dir_ + "/run.db");
    // Recorded losses: 4.2 at step 0, below 3 from step 12 (2.0-2.3 by steps 20-39), 2.91 at
    // step 40 when the fault switches on, 3.27 at 46, 4.1 at 47, 3.6-4.4 after.
    Cmd c = rewind_cmd(train_args(data, *store_, 80, 10,
                                  "--n-layer 3 --learning-rate 0.01 --plan-from '40:L1.H2.pv=fault(strength=25600)'"));
    ASSERT_EQ(c.code, 0) << c.out;
  }
  static void TearDownTestSuite() {
    rwd::testing::remove_tree(*dir_);
    delete dir_;
    delete store_;
  }

  // --find-window with `fail`; checks the exit code and that the planted op is found exactly.
  nlohmann::json localize(const std::string& name, const std::string& fail, std::string* out = nullptr) {
    const std::string report = *dir_ + "/" + name;
    Cmd c = rewind_cmd("bisect --store " + *store_ + " --find-window --fail '" + fail + "' --quiet --report " + report);
    EXPECT_EQ(c.code, 4) << c.out;
    if (out) *out = c.out;
    nlohmann::json r = read_json(report + "/report.json");
    EXPECT_EQ(r["narrowing"]["status"], "localized") << c.out;
    EXPECT_EQ(r["narrowing"]["failing_set"], nlohmann::json::array({"L1.H2.pv"})) << c.out;
    EXPECT_EQ(r["narrowing"]["fixing_set"], nlohmann::json::array({"L1.H2.pv"})) << c.out;
    EXPECT_LE(r["narrowing"]["engine_probes"].get<int>(), 30) << c.out;
    return r;
  }

  static std::string* dir_;
  static std::string* store_;
};
std::string* BisectPredicate::dir_ = nullptr;
std::string* BisectPredicate::store_ = nullptr;

// The time search finds 40:47, and the window probe judges the spike with the EMA started in
// the recorded history (against a fresh EMA it would call the run not reproducible).
TEST_F(BisectPredicate, SpikeJudgedWithTheRecordedEma) {
  std::string out;
  nlohmann::json r = localize("spike", "spike(loss, 1.4) || nan", &out);
  EXPECT_EQ(r["time"]["c_star"], 40);
  EXPECT_EQ(r["time"]["fail_step"], 47);
  EXPECT_NE(out.find("failure at step 47: the first step where"), std::string::npos) << out;
  EXPECT_EQ(r["widened"].size(), 0u);
}

// The initial loss (4.2) is above 3, which is no failure at step 0.
TEST_F(BisectPredicate, MaxWithALossThatStartsHigh) {
  std::string out;
  nlohmann::json r = localize("max", "max(loss) > 3 || nan", &out);
  EXPECT_EQ(r["time"]["fail_step"], 41);
  EXPECT_FALSE(r["time"]["fail_step_given"].get<bool>());
  const std::string why = r["time"]["fail_reason"];
  EXPECT_NE(why.find("turns true"), std::string::npos) << why;
  EXPECT_NE(why.find("held at steps 0..8 at the start of the recording"), std::string::npos) << why;
  EXPECT_NE(out.find(why), std::string::npos) << out;
}

// loss[35] lies before the window 40:46: the probes read it from the recorded history.
TEST_F(BisectPredicate, StepReferenceIntoTheHistory) {
  nlohmann::json r = localize("index", "max(loss) > 1.5 * loss[35]");
  EXPECT_EQ(r["time"]["fail_step"], 46);
  EXPECT_EQ(r["narrowing"]["window"], nlohmann::json::array({40, 46}));
}

// growth's baseline is the recorded loss at the step before the window (step 29 for 30:40).
TEST_F(BisectPredicate, GrowthAgainstTheRecordedBaseline) {
  nlohmann::json r = localize("growth", "growth(loss) > 1.3");
  EXPECT_EQ(r["time"]["fail_step"], 40);
  EXPECT_EQ(r["narrowing"]["window"], nlohmann::json::array({30, 40}));
}

// mean over the one-step window [40, 40] exceeds 2.6, over 30:40 it does not: the recorded
// plan passes there, so the window is widened to the next checkpoint (50) and narrowed there.
TEST_F(BisectPredicate, PassingWindowIsWidenedAndReported) {
  std::string out;
  nlohmann::json r = localize("mean", "mean(loss) > 2.6", &out);
  EXPECT_EQ(r["time"]["fail_step"], 40);
  ASSERT_EQ(r["widened"].size(), 1u) << out;
  EXPECT_NE(r["widened"][0].get<std::string>().find("widened to 30:50 (the next checkpoint)"), std::string::npos);
  EXPECT_NE(out.find("widened: window 30:40 passes under the recorded plan"), std::string::npos) << out;
  EXPECT_EQ(r["narrowing"]["window"], nlohmann::json::array({30, 50}));
}

// A predicate that holds from the start and never turns false is no failure in time.
TEST_F(BisectPredicate, PredicateTrueFromTheStartIsNotAFailure) {
  Cmd c = rewind_cmd("bisect --store " + *store_ + " --find-window --fail 'max(loss) > 1' --quiet");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("never turns from false to true"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("from the start"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace rwd::bisect::testing
