// `rewind train --resume` end to end through the built binary: every option
// either applies from the resume step on (checkpoint and digest schedule, --plan and
// --plan-from, recorded in the run's plan schedule so replay verifies the resumed steps) or is
// refused in one line (exit 2); a resume with nothing to train is exit 2; and the messages of
// `replay --verify` from a checkpoint before the window and of `export` into a missing folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "store/store.h"
#include "tests/common/cli_run.h"

namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;

// Steps of a few milliseconds on one thread.
const std::string kModel = " --vocab-size 64 --n-embd 32 --block-size 32 --threads 1 --log-every 1000";

class ResumeCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = rwd::testing::temp_dir("resume_cli");
    data_ = dir_ + "/data.bin";
    Cmd c = rewind_cmd("data synth -o " + data_ + " --tokens 100000 --vocab 64");
    ASSERT_EQ(c.code, 0) << c.out;
  }
  static void TearDownTestSuite() { rwd::testing::remove_tree(dir_); }

  // A new recording of `steps` steps, checkpoints exactly every 10 (--checkpoint-wait: a writer
  // slowed by a loaded machine must not defer one, as the checkpoint steps are asserted).
  static std::string record(const std::string& name, int steps) {
    const std::string db = dir_ + "/" + name + ".db";
    Cmd c = rewind_cmd("train --data " + data_ + " --record " + db + " --steps " + std::to_string(steps) +
                       " --checkpoint-every 10 --checkpoint-wait" + kModel);
    EXPECT_EQ(c.code, 0) << c.out;
    return db;
  }
  static Cmd resume(const std::string& db, const std::string& args) {
    return rewind_cmd("train --resume " + db + " --log-every 1000 " + args);
  }
  static rwd::store::Store open(const std::string& db) {
    return rwd::store::Store::open(db, rwd::store::Mode::kReadOnly);
  }
  static std::vector<uint32_t> losses(const std::string& db, int64_t from, int64_t to) {
    std::vector<uint32_t> out;
    for (const auto& s : open(db).steps(1, from, to)) out.push_back(s.loss_bits);
    return out;
  }
  static int lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

  inline static std::string dir_, data_;
};

TEST_F(ResumeCli, CheckpointDigestAndCaptureSettingsApplyOnResume) {
  const std::string db = record("schedule", 20);
  Cmd c = resume(db, "--steps 35 --checkpoint-every 5 --checkpoint-wait --digest-every 5 --capture 'steps=22:22;L0.H1'");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("resuming run 1 from its checkpoint at step 20 (steps 0..19 recorded); training steps 20..34"),
            std::string::npos) << c.out;
  EXPECT_EQ(open(db).checkpoint_steps(1), (std::vector<int64_t>{0, 10, 20, 25, 30, 35}));
  for (const auto& s : open(db).steps(1, 20, 34))
    EXPECT_EQ(s.param_digest.has_value(), (s.step + 1) % 5 == 0) << "step " << s.step;
  bool captured = false;
  for (const auto& t : open(db).tensors(1, 0, 40)) {
    EXPECT_EQ(t.key.step, 22);
    captured |= t.key.name == "q" && t.key.layer == 0 && t.key.head == 1;
  }
  EXPECT_TRUE(captured);
  Cmd v = rewind_cmd("replay --store " + db + " --from 27 --to 34 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
}

// --monitor-every 4: per-head monitors stored on steps 0, 4, 8 only, the choice in the run's
// metadata, kept by a resume (12) and replaced by one (--monitor-every 3: 15, 18, and the
// metadata says 3 from then on); replay --verify passes over steps without monitors.
TEST_F(ResumeCli, SampledMonitorsAreRecordedAsSuchAndKeptOnResume) {
  const std::string db = dir_ + "/sampled.db";
  Cmd c = rewind_cmd("train --data " + data_ + " --record " + db + " --steps 10 --checkpoint-every 10 "
                     "--checkpoint-wait --monitor-every 4" + kModel);
  ASSERT_EQ(c.code, 0) << c.out;
  Cmd r1 = resume(db, "--steps 14");
  ASSERT_EQ(r1.code, 0) << r1.out;
  EXPECT_EQ(nlohmann::json::parse(open(db).run(1)->meta).value("monitor_every", 0), 4);
  Cmd r2 = resume(db, "--steps 20 --monitor-every 3");
  ASSERT_EQ(r2.code, 0) << r2.out;
  rwd::store::Store st = open(db);
  EXPECT_EQ(nlohmann::json::parse(st.run(1)->meta).value("monitor_every", 0), 3);
  std::vector<int64_t> monitored;
  for (const auto& m : st.metrics(1, 0, 19, "L0.H0.max_logit")) monitored.push_back(m.step);
  EXPECT_EQ(monitored, (std::vector<int64_t>{0, 4, 8, 12, 15, 18}));
  Cmd v = rewind_cmd("replay --store " + db + " --from 0 --to 19 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  Cmd bad = rewind_cmd("train --data " + data_ + " --steps 2 --monitor-every 0" + kModel);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--monitor-every must be at least 1"), std::string::npos) << bad.out;
}

TEST_F(ResumeCli, PlanAppliesFromTheResumeStepAndIsRecorded) {
  const std::string plain = record("plain", 20), fixed = record("fixed", 20), later = record("later", 20);
  ASSERT_EQ(resume(plain, "--steps 30").code, 0);
  Cmd c = resume(fixed, "--steps 30 --plan all=fp32");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("plan from step 20 on: "), std::string::npos) << c.out;
  EXPECT_EQ(losses(fixed, 0, 19), losses(plain, 0, 19));
  const std::vector<uint32_t> a = losses(fixed, 20, 29), b = losses(plain, 20, 29);
  ASSERT_EQ(a.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]) << "step " << 20 + i;
  // The schedule says so: replay and bisect of the resumed steps use the plan they ran under.
  const nlohmann::json sched = nlohmann::json::parse(open(fixed).run(1)->plan);
  EXPECT_EQ(sched["changes"], nlohmann::json::parse(R"([[20, "all=fp32"]])")) << sched.dump();
  EXPECT_EQ(nlohmann::json::parse(open(plain).run(1)->plan)["changes"], nlohmann::json::array());
  Cmd v = rewind_cmd("replay --store " + fixed + " --from 22 --to 29 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("every step from 20 to 29 is bitwise identical to the recording (replayed from the "
                       "checkpoint at step 20, the nearest at or before 22)"),
            std::string::npos) << v.out;
  // A later resume without --plan goes on under the recorded schedule, bitwise.
  ASSERT_EQ(resume(fixed, "--steps 34").code, 0);
  EXPECT_EQ(rewind_cmd("replay --store " + fixed + " --from 30 --to 33 --verify").code, 0);

  // --plan-from on resume: the change at its step, the steps before it as without.
  c = resume(later, "--steps 30 --plan-from 25:all=fp32");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(losses(later, 20, 24), losses(plain, 20, 24));
  EXPECT_NE(losses(later, 25, 25), losses(plain, 25, 25));
  EXPECT_EQ(nlohmann::json::parse(open(later).run(1)->plan)["changes"],
            nlohmann::json::parse(R"([[25, "all=fp32"]])"));
  v = rewind_cmd("replay --store " + later + " --from 20 --to 29 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  // A change before the resume step would rewrite recorded history: refused.
  c = resume(later, "--steps 40 --plan-from 10:all=fp32");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--plan-from 10:all=fp32 cannot apply: step 10 is recorded"), std::string::npos) << c.out;
  EXPECT_EQ(lines(c.out), 1) << c.out;
  c = resume(later, "--steps 40 --plan 'L9.H0.pv=fp32'");  // a bad plan: nothing written
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_EQ(open(later).step_range(1)->second, 29);
}

TEST_F(ResumeCli, NothingToDoIsAUsageError) {
  const std::string db = record("done", 20);
  Cmd c = resume(db, "");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("nothing to do: run 1 is recorded to step 20 (steps 0..19 recorded) and its max_iters is "
                       "20 (no --steps given)"),
            std::string::npos) << c.out;
  c = resume(db, "--steps 15");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("nothing to do: run 1 is recorded to step 20 (steps 0..19 recorded) and --steps 15 asks "
                       "for no step after it"),
            std::string::npos) << c.out;
  EXPECT_EQ(lines(c.out), 1) << c.out;
  EXPECT_EQ(resume(db, "--steps 20").code, 2);
  EXPECT_EQ(open(db).step_range(1)->second, 19);
  EXPECT_EQ(open(db).checkpoint_steps(1), (std::vector<int64_t>{0, 10, 20}));
}

TEST_F(ResumeCli, OptionsThatCannotApplyAreRefusedInOneLine) {
  const std::string db = record("refuse", 10);
  const std::pair<std::string, std::string> cases[] = {
      {"--n-layer 3", "--n-layer cannot apply"},
      {"--learning-rate 0.1", "--learning-rate cannot apply"},
      {"--preset small-cpu", "--preset cannot apply"},
      {"--config x.json", "--config cannot apply"},
      {"--threads 2", "--threads 2 cannot apply: run 1 was recorded with 1 thread(s)"},
      {"--attention torch", "--attention torch cannot apply"},
      {"--record " + dir_ + "/other.db", "--record cannot apply"},
  };
  for (const auto& [args, said] : cases) {
    Cmd c = resume(db, "--steps 20 " + args);
    EXPECT_EQ(c.code, 2) << args << ": " << c.out;
    EXPECT_NE(c.out.find(said), std::string::npos) << args << ": " << c.out;
    EXPECT_EQ(lines(c.out), 1) << args << ": " << c.out;
  }
  EXPECT_EQ(open(db).step_range(1)->second, 9);
  // --fork refuses them as well, and a branch with nothing to train.
  Cmd f = rewind_cmd("train --fork " + db + " --at 5 --n-layer 3 --steps 20");
  EXPECT_EQ(f.code, 2) << f.out;
  EXPECT_NE(f.out.find("train --fork: --n-layer cannot apply"), std::string::npos) << f.out;
  f = rewind_cmd("train --fork " + db + " --at 5 --steps 5");
  EXPECT_EQ(f.code, 2) << f.out;
  EXPECT_NE(f.out.find("nothing to do: the branch starts at step 5 and --steps 5"), std::string::npos) << f.out;
  // The recorded value and --max-iters (the same as --steps) are taken.
  Cmd c = resume(db, "--threads 1 --max-iters 12");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(open(db).step_range(1)->second, 11);
}

TEST_F(ResumeCli, ARunWithNoStepYetSaysSo) {
  const std::string db = record("empty", 0);
  EXPECT_EQ(open(db).checkpoint_steps(1), std::vector<int64_t>{0});
  Cmd c = resume(db, "--steps 3");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("resuming run 1 from its checkpoint at step 0 (no step recorded yet); training steps 0..2"),
            std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("-1"), std::string::npos) << c.out;
}

TEST_F(ResumeCli, ExportNamesTheOutputAndWhyItCannotBeWritten) {
  const std::string db = record("export", 10);
  const std::string missing = dir_ + "/no/such/folder/ckpt.pt";
  Cmd c = rewind_cmd("export nanogpt --store " + db + " --step 10 -o " + missing);
  EXPECT_EQ(c.code, 3) << c.out;
  EXPECT_NE(c.out.find("export: cannot write '" + missing + "': No such file or directory"), std::string::npos)
      << c.out;
  EXPECT_EQ(c.out.find(".partial"), std::string::npos) << c.out;
  const std::string out = dir_ + "/ckpt.pt";
  ASSERT_EQ(rewind_cmd("export nanogpt --store " + db + " --step 10 -o " + out).code, 0);
  // An existing output is never overwritten, with the code of an existing --record store.
  c = rewind_cmd("export nanogpt --store " + db + " --step 5 -o " + out);
  EXPECT_EQ(c.code, 3) << c.out;
  EXPECT_NE(c.out.find("already exists; refusing to overwrite it"), std::string::npos) << c.out;
  c = rewind_cmd("train --data " + data_ + " --record " + db + " --steps 2" + kModel);
  EXPECT_EQ(c.code, 3) << c.out;
  EXPECT_NE(c.out.find("already exists; refusing to overwrite it"), std::string::npos) << c.out;
  EXPECT_EQ(rwd::testing::run_shell("ls " + dir_ + " | grep -c partial").out, "0\n");
}

}  // namespace
