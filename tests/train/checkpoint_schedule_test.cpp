// CheckpointSchedule: on schedule while the writer has room; late (and folded) while it is
// full, unless the recording waits; the end takes what is due or deferred.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "train/checkpoint_schedule.h"

namespace rwd::train {
namespace {

// Steps 0..n-1 with the writer full exactly at the steps in `full`; returns the steps at which
// a checkpoint is taken (the writer's state does not change when one is queued here).
std::vector<int64_t> run(CheckpointSchedule& s, int64_t n, const std::vector<int64_t>& full) {
  std::vector<int64_t> taken;
  for (int64_t step = 0; step < n; ++step) {
    const bool room = std::find(full.begin(), full.end(), step) == full.end();
    if (s.due(step, room)) {
      s.taken(step);
      taken.push_back(step);
    }
  }
  return taken;
}

TEST(CheckpointSchedule, EveryKStepsWhileTheWriterHasRoom) {
  CheckpointSchedule s(10, false);
  EXPECT_EQ(run(s, 35, {}), (std::vector<int64_t>{0, 10, 20, 30}));
  EXPECT_EQ(s.late(), 0);
  EXPECT_EQ(s.folded(), 0);
  EXPECT_EQ(s.max_late(), 0);
}

TEST(CheckpointSchedule, ABusyWriterMakesOneLateAndFoldsTheDueOnesMeanwhile) {
  CheckpointSchedule s(10, false);
  // Full from step 10 to 23: the checkpoint due at 10 is taken at 24, the one due at 20
  // folds into it; 30 is on time again.
  std::vector<int64_t> full;
  for (int64_t i = 10; i <= 23; ++i) full.push_back(i);
  EXPECT_EQ(run(s, 35, full), (std::vector<int64_t>{0, 24, 30}));
  EXPECT_EQ(s.late(), 1);
  EXPECT_EQ(s.folded(), 1);
  EXPECT_EQ(s.max_late(), 14);
  // Full only at steps between checkpoints: nothing changes.
  CheckpointSchedule t(10, false);
  EXPECT_EQ(run(t, 35, {5, 6, 15}), (std::vector<int64_t>{0, 10, 20, 30}));
  EXPECT_EQ(t.late(), 0);
}

TEST(CheckpointSchedule, WaitingForTheWriterKeepsTheSchedule) {
  CheckpointSchedule s(10, true);
  EXPECT_EQ(run(s, 35, {10, 11, 20}), (std::vector<int64_t>{0, 10, 20, 30}));
  EXPECT_EQ(s.late(), 0);
}

TEST(CheckpointSchedule, TheEndTakesADueOrDeferredCheckpointWhateverTheWriter) {
  CheckpointSchedule due_at_end(10, false);
  run(due_at_end, 40, {});
  EXPECT_TRUE(due_at_end.due(40, false, /*at_end=*/true));
  EXPECT_FALSE(due_at_end.due(41, false, /*at_end=*/true));  // neither due nor deferred

  CheckpointSchedule deferred(10, false);
  EXPECT_EQ(run(deferred, 35, {30, 31, 32, 33, 34}), (std::vector<int64_t>{0, 10, 20}));
  EXPECT_EQ(deferred.late(), 0);  // deferred, not yet taken
  EXPECT_EQ(deferred.pending(), 30);
  EXPECT_TRUE(deferred.due(35, false, /*at_end=*/true));
  deferred.taken(35);
  EXPECT_EQ(deferred.late(), 1);
  EXPECT_EQ(deferred.max_late(), 5);
  EXPECT_EQ(deferred.pending(), -1);

  CheckpointSchedule never(0, false);  // K = 0: no checkpoints at all
  EXPECT_TRUE(run(never, 20, {}).empty());
  EXPECT_FALSE(never.due(20, true, /*at_end=*/true));
}

}  // namespace
}  // namespace rwd::train
