// The near miss of a recording that does not fail: per-step thresholds found by search
// on the series the predicate reads, the direction of failure, and the closest step.
#include "bisect/report_near_miss.h"

#include <gtest/gtest.h>

#include <cmath>

namespace rwd::bisect {
namespace {

Series recording(int64_t first, std::vector<double> loss, std::vector<double> grad = {}) {
  Series s;
  s.first_step = first;
  if (grad.empty()) grad.assign(loss.size(), 1.0);
  s.values["loss"] = std::move(loss);
  s.values["grad_norm"] = std::move(grad);
  return s;
}

TEST(NearMiss, ConstantThresholdAndTheClosestStep) {
  const NearMiss m = near_miss(Predicate::parse("loss > 6"), recording(10, {1, 2, 5, 3}), 10, 13);
  EXPECT_EQ(m.series, "loss");
  EXPECT_EQ(m.from, 10);
  ASSERT_EQ(m.threshold.size(), 4u);
  for (double t : m.threshold) EXPECT_NEAR(t, 6.0, 1e-4);
  EXPECT_TRUE(m.above);
  EXPECT_EQ(m.closest, 12);
  EXPECT_NEAR(m.gap, 1.0, 1e-4);
  for (bool h : m.holds) EXPECT_FALSE(h);
}

TEST(NearMiss, StepsWhereItHoldsAreNotTheClosest) {
  // Aggregates are judged one step at a time: max(loss) over [t, t] is loss[t].
  const NearMiss m = near_miss(Predicate::parse("nan || max(loss) > 6"), recording(0, {1, 7, 5}), 0, 2);
  EXPECT_TRUE(m.holds[1]);
  EXPECT_NEAR(m.threshold[1], 6.0, 1e-4);  // where it stops holding
  EXPECT_EQ(m.closest, 2);
  EXPECT_NEAR(m.gap, 1.0, 1e-4);
}

TEST(NearMiss, FailingBelowAThreshold) {
  const NearMiss m = near_miss(Predicate::parse("min(loss) < 1"), recording(0, {3, 2, 4}), 0, 2);
  EXPECT_FALSE(m.above);
  for (double t : m.threshold) EXPECT_NEAR(t, 1.0, 1e-4);
  EXPECT_EQ(m.closest, 1);
  EXPECT_NEAR(m.gap, -1.0, 1e-4);
}

TEST(NearMiss, MovingThresholdOfARunningMedianWithHistory) {
  // The predicate reads grad_norm, not loss: that is the series drawn. Steps 0-2 have no 3
  // steps before them (rmedian is +inf there): no threshold. Judged from step 2 with steps 0-1
  // as history; the recording's earlier steps are read as history of later ones.
  const Predicate p = Predicate::parse("grad_norm > 10 * rmedian(grad_norm, 3)");
  const NearMiss m = near_miss(p, recording(0, {5, 5, 5, 5, 5, 5}, {1, 1, 1, 2, 3, 1}), 2, 5);
  EXPECT_EQ(m.series, "grad_norm");
  ASSERT_EQ(m.values.size(), 4u);
  EXPECT_TRUE(std::isnan(m.threshold[0]));
  EXPECT_NEAR(m.threshold[1], 10.0, 1e-3);  // step 3: 10 * median(1, 1, 1)
  EXPECT_NEAR(m.threshold[2], 10.0, 1e-3);  // step 4: 10 * median(1, 1, 2)
  EXPECT_NEAR(m.threshold[3], 20.0, 1e-3);  // step 5: 10 * median(1, 2, 3)
  EXPECT_EQ(m.closest, 4);                  // 3 against 10
  EXPECT_NEAR(m.gap, 7.0, 1e-3);
}

TEST(NearMiss, NanAloneHasNoThreshold) {
  const NearMiss m = near_miss(Predicate::parse("nan"), recording(0, {1, 2}), 0, 1);
  EXPECT_EQ(m.closest, -1);
  for (double t : m.threshold) EXPECT_TRUE(std::isnan(t));
  EXPECT_NE(m.note.find("no threshold"), std::string::npos) << m.note;
}

TEST(NearMiss, ANonFiniteStepHasNoThreshold) {
  const NearMiss m = near_miss(Predicate::parse("loss > 6"), recording(0, {1, NAN, 2}), 0, 2);
  EXPECT_TRUE(std::isnan(m.threshold[1]));
  EXPECT_NEAR(m.threshold[2], 6.0, 1e-4);
  EXPECT_EQ(m.closest, 2);
}

TEST(NearMiss, ASeriesTheRecordingLacksIsSaidNotThrown) {
  const NearMiss m = near_miss(Predicate::parse("L0.H0.max_logit > 5"), recording(0, {1, 2}), 0, 1);
  EXPECT_EQ(m.series, "L0.H0.max_logit");
  EXPECT_TRUE(m.values.empty());
  EXPECT_EQ(m.closest, -1);
  EXPECT_NE(m.note.find("no values of L0.H0.max_logit"), std::string::npos) << m.note;
}

}  // namespace
}  // namespace rwd::bisect
