// Checkpoint retention through the `rewind` binary: `train --keep-last --keep-every`
// keeps the rule's checkpoints while every step stays, replay --verify and bisect work from the
// kept ones, a resume keeps the stored rule (a given one replaces it), bad values are exit 2 in
// one line, and `store thin` keeps what a bisect needs and refuses a store being recorded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "store/store.h"
#include "tests/common/cli_run.h"
#include "tests/common/store_poll.h"

namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;
using Steps = std::vector<int64_t>;

// 2 layers x 4 heads, width 64 (a step is milliseconds); a checkpoint every 5 steps, exactly
// (the writer is waited for: on a loaded machine it may otherwise take one a step or two late).
const std::string kModel =
    " --vocab-size 64 --threads 1 --log-every 1000 --checkpoint-every 5 --checkpoint-wait --learning-rate 0.01";

class RetentionCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = rwd::testing::temp_dir("retention_cli");
    data_ = dir_ + "/data.bin";
    Cmd c = rewind_cmd("data synth -o " + data_ + " --tokens 300000 --vocab 64");
    ASSERT_EQ(c.code, 0) << c.out;
  }
  static void TearDownTestSuite() { rwd::testing::remove_tree(dir_); }

  static Cmd record(const std::string& db, int steps, const std::string& extra) {
    return rewind_cmd("train --data " + data_ + " --record " + db + " --steps " + std::to_string(steps) + kModel +
                      " " + extra);
  }
  static rwd::store::Store open(const std::string& db) {
    return rwd::store::Store::open(db, rwd::store::Mode::kReadOnly);
  }
  static Steps checkpoints(const std::string& db) { return open(db).checkpoint_steps(1); }
  static nlohmann::json meta(const std::string& db) { return nlohmann::json::parse(open(db).run(1)->meta); }
  static int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

  inline static std::string dir_, data_;
};

// A delta fault from step 22 (bisect_time_test's calibration): with the last 2 checkpoints and
// the first of every 20 steps kept, the causal window still starts at checkpoint 20.
TEST_F(RetentionCli, ReplayAndBisectWorkFromTheKeptCheckpoints) {
  const std::string db = dir_ + "/fault.db";
  Cmd c = record(db, 40, "--keep-last 2 --keep-every 20 --plan-from '22:L1.H2.delta=fault(strength=1e30)'");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("retention (--keep-last 2 --keep-every 20): 5 older checkpoints deleted"), std::string::npos)
      << c.out;
  EXPECT_EQ(checkpoints(db), (Steps{0, 20, 35, 40}));
  EXPECT_EQ(open(db).steps(1, 0, 100).size(), 40u);  // every step stays, and its metrics
  EXPECT_EQ(open(db).metrics(1, 0, 100, "lr").size(), 40u);
  EXPECT_EQ(meta(db)["keep_last"], 2);
  EXPECT_EQ(meta(db)["keep_every"], 20);
  EXPECT_EQ(rewind_cmd("store verify " + db).code, 0);

  Cmd v = rewind_cmd("replay --store " + db + " --from 12 --to 31 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("every step from 0 to 31 is bitwise identical to the recording (replayed from the checkpoint "
                       "at step 0, the nearest at or before 12)"),
            std::string::npos) << v.out;

  const std::string report = dir_ + "/fault_report";
  Cmd b = rewind_cmd("bisect --store " + db + " --find-window --fail 'nan || spike(loss, 1.4)' --quiet --report " +
                     report);
  EXPECT_EQ(b.code, 4) << b.out;
  const nlohmann::json r = rwd::testing::read_json(report + "/report.json");
  EXPECT_EQ(r["time"]["c_star"], 20) << b.out;
  EXPECT_EQ(r["narrowing"]["failing_set"], nlohmann::json::array({"L1.H2.delta"}));

  // Thinning further keeps the checkpoint the bisect's probes start from, unless --force.
  Cmd t = rewind_cmd("store thin " + db + " --keep-last 1");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("run 1: removed 1 of 4 checkpoints (steps 35)"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("kept beyond the rule: step 20: bisect probe window 20:"), std::string::npos) << t.out;
  EXPECT_EQ(checkpoints(db), (Steps{0, 20, 40}));
  EXPECT_EQ(rewind_cmd("store verify " + db).code, 0);
  v = rewind_cmd("replay --store " + db + " --from 25 --to 39 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
}

TEST_F(RetentionCli, AResumeKeepsTheStoredRuleAndAGivenOneReplacesIt) {
  const std::string db = dir_ + "/resume.db";
  ASSERT_EQ(record(db, 30, "--keep-last 2").code, 0);
  EXPECT_EQ(checkpoints(db), (Steps{0, 25, 30}));
  Cmd c = rewind_cmd("train --resume " + db + " --steps 50 --log-every 1000 --checkpoint-wait");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(checkpoints(db), (Steps{0, 45, 50}));
  // --keep-every on a resume: stored with the run beside the recorded --keep-last.
  c = rewind_cmd("train --resume " + db + " --steps 70 --keep-every 20 --log-every 1000 --checkpoint-wait");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(meta(db)["keep_last"], 2);
  EXPECT_EQ(meta(db)["keep_every"], 20);
  EXPECT_EQ(meta(db)["rewind_version"], "0.3.0");  // the rest of the meta as recorded
  c = rewind_cmd("train --resume " + db + " --steps 80 --log-every 1000 --checkpoint-wait");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(checkpoints(db), (Steps{0, 45, 60, 75, 80}));
  EXPECT_EQ(open(db).steps(1, 0, 100).size(), 80u);
  Cmd v = rewind_cmd("replay --store " + db + " --from 62 --to 79 --verify");
  EXPECT_EQ(v.code, 0) << v.out;

  for (const std::string& bad : {"--keep-last 0", "--keep-every -1", "--keep-last x"}) {
    c = rewind_cmd("train --resume " + db + " --steps 90 --log-every 1000 " + bad);
    EXPECT_EQ(c.code, 2) << bad << ": " << c.out;
    EXPECT_EQ(lines(c.out), 1) << c.out;
  }
  c = record(dir_ + "/bad.db", 10, "--keep-every 0");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_EQ(lines(c.out), 1) << c.out;
  EXPECT_EQ(open(db).step_range(1)->second, 79);  // nothing written
}

// A running recording holds the store's writer lock: thin and a second recording are refused
// in one line; once it is killed (-9) the store verifies, thins and resumes.
TEST_F(RetentionCli, AStoreBeingRecordedIsNotThinned) {
  const std::string db = dir_ + "/running.db";
  const pid_t pid = rwd::testing::spawn_shell(std::string(REWIND_BIN) + " train --data " + data_ + " --record " +
                                              db + " --steps 100000" + kModel + " --keep-last 3 > /dev/null");
  ASSERT_TRUE(rwd::testing::wait_for_step(db, 12));
  Cmd t = rewind_cmd("store thin " + db + " --keep-last 1");
  EXPECT_EQ(t.code, 3) << t.out;
  EXPECT_EQ(t.out, "rewind: error: store " + db + ": a recording (rewind train), pid " + std::to_string(pid) +
                       " is writing it; try again once that has finished\n");
  Cmd r = rewind_cmd("train --resume " + db + " --steps 200000 --log-every 1000 --checkpoint-wait");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("is writing it"), std::string::npos) << r.out;
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_EQ(rewind_cmd("store verify " + db).code, 0);
  EXPECT_LE(checkpoints(db).size(), 5u);  // the first, the last 3, perhaps one not yet deleted
  t = rewind_cmd("store thin " + db + " --keep-last 1");
  EXPECT_EQ(t.code, 0) << t.out;
  EXPECT_EQ(checkpoints(db).size(), 2u);
  const int64_t last = open(db).step_range(1)->second;
  r = rewind_cmd("train --resume " + db + " --steps " + std::to_string(last + 8) +
                 " --log-every 1000 --checkpoint-wait");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(rewind_cmd("store verify " + db).code, 0);
}

}  // namespace
