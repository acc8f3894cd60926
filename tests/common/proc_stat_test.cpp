// /proc/PID/stat as common/proc_stat.h reads it: this process runs, and started before now.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "common/proc_stat.h"

namespace rwd {
namespace {

TEST(ProcStat, ReadsThisProcessAndNoOther) {
  const std::optional<ProcStat> self = read_proc_stat("self");
  if (!self) GTEST_SKIP() << "no /proc here";
  EXPECT_EQ(self->state, 'R');
  EXPECT_GT(self->start_ticks, 0u);
  const std::optional<ProcStat> by_pid = read_proc_stat(std::to_string(::getpid()));
  ASSERT_TRUE(by_pid);
  EXPECT_EQ(by_pid->start_ticks, self->start_ticks);
  EXPECT_FALSE(read_proc_stat("0"));
  EXPECT_FALSE(read_proc_stat("2147483647"));  // above any pid_max
}

}  // namespace
}  // namespace rwd
