// The switch table: each type's parsing and refusal, a changed environment read again, the
// recorded-switch check, docs/switches.md against the table, and through the `rewind` binary
// the one-line refusal and a run refused on replay under another bit-changing value.
#include "common/switches.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/error.h"
#include "tests/common/cli_run.h"

namespace rwd::switches {
namespace {

using rwd::testing::rewind_cmd;
using rwd::testing::run_shell;

// Sets one variable for the scope of a test and restores the environment after it.
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was, had_ = true;
    setenv(name, value, 1);
  }
  ~Env() {
    if (had_) setenv(name_.c_str(), was_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, was_;
  bool had_ = false;
};

std::string refusal(Switch s) {
  try {
    check_all();
    (void)value_text(s);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Switches, TableIsInSwitchOrderWithUniqueNamesAndValidDefaults) {
  ASSERT_EQ(table().size(), static_cast<size_t>(Switch::kCount));
  std::set<std::string> names;
  for (size_t i = 0; i < table().size(); ++i) {
    const Spec& sp = table()[i];
    EXPECT_EQ(static_cast<size_t>(sp.id), i) << sp.name;
    EXPECT_EQ(std::string(sp.name).rfind("REWIND_", 0), 0u) << sp.name;
    EXPECT_TRUE(names.insert(sp.name).second) << sp.name << " twice";
    unsetenv(sp.name);
    EXPECT_NO_THROW(value_text(sp.id)) << sp.name << "'s default";
    EXPECT_FALSE(is_set(sp.id)) << sp.name;
  }
}

TEST(Switches, Bool) {
  EXPECT_TRUE(on(Switch::kFusedLoss));  // the default
  {
    Env e("REWIND_FUSED_LOSS", "0");
    EXPECT_FALSE(on(Switch::kFusedLoss));
    EXPECT_TRUE(is_set(Switch::kFusedLoss));
  }
  {
    Env e("REWIND_FUSED_LOSS", "");  // empty counts as unset
    EXPECT_TRUE(on(Switch::kFusedLoss));
    EXPECT_FALSE(is_set(Switch::kFusedLoss));
  }
  Env e("REWIND_FUSED_LOSS", "yes");
  EXPECT_EQ(refusal(Switch::kFusedLoss), "REWIND_FUSED_LOSS=yes: expected 0 or 1");
  EXPECT_THROW(on(Switch::kFusedLoss), UsageError);
}

TEST(Switches, IntWithRange) {
  EXPECT_EQ(integer(Switch::kWriterNice), 10);
  {
    Env e("REWIND_WRITER_NICE", "0");
    EXPECT_EQ(integer(Switch::kWriterNice), 0);
  }
  for (const char* bad : {"20", "-1", "abc", "5x", "99999999999999999999"}) {
    Env e("REWIND_WRITER_NICE", bad);
    EXPECT_EQ(refusal(Switch::kWriterNice),
              std::string("REWIND_WRITER_NICE=") + bad + ": expected a whole number in 0..19");
  }
  Env e("REWIND_WARM_BYTES", "17179869184");  // beyond 32 bits
  EXPECT_EQ(integer(Switch::kWarmBytes), int64_t{16} << 30);
}

TEST(Switches, Number) {
  EXPECT_EQ(number(Switch::kGradBucketMb), 25.0);
  {
    Env e("REWIND_GRAD_BUCKET_MB", "0.5");
    EXPECT_EQ(number(Switch::kGradBucketMb), 0.5);
  }
  for (const char* bad : {"lots", "-1", "nan", "inf"}) {
    Env e("REWIND_GRAD_BUCKET_MB", bad);
    EXPECT_NE(refusal(Switch::kGradBucketMb).find("expected a number in 0.."), std::string::npos) << bad;
  }
}

TEST(Switches, Enum) {
  EXPECT_EQ(text(Switch::kFp32Gemm), "simt");
  {
    Env e("REWIND_FP32_GEMM", "3xtf32");
    EXPECT_EQ(text(Switch::kFp32Gemm), "3xtf32");
  }
  Env e("REWIND_FP32_GEMM", "fast");
  EXPECT_EQ(refusal(Switch::kFp32Gemm), "REWIND_FP32_GEMM=fast: expected simt or 3xtf32");
}

TEST(Switches, StringAndInternal) {
  EXPECT_EQ(text(Switch::kTokenFileFacts), "");
  Env e("REWIND_TOKEN_FILE_FACTS", "1,2,3,4,5,abc,9");
  EXPECT_EQ(text(Switch::kTokenFileFacts), "1,2,3,4,5,abc,9");
  EXPECT_TRUE(spec(Switch::kTokenFileFacts).internal);
}

TEST(Switches, List) {
  EXPECT_FALSE(listed(Switch::kTimes, "phase"));
  {
    Env e("REWIND_TIMES", "phase,restore");
    EXPECT_TRUE(listed(Switch::kTimes, "phase"));
    EXPECT_TRUE(listed(Switch::kTimes, "restore"));
    EXPECT_FALSE(listed(Switch::kTimes, "bisect"));
  }
  Env e("REWIND_TIMES", "phase,oops");
  EXPECT_EQ(refusal(Switch::kTimes),
            "REWIND_TIMES=phase,oops: expected a comma-separated list of phase, restore, bisect, record, probe");
}

TEST(Switches, AChangedEnvironmentIsReadAgain) {
  for (int i = 0; i < 3; ++i) {
    Env e("REWIND_CUDA_GRAPHS", std::to_string(i).c_str());
    EXPECT_EQ(integer(Switch::kCudaGraphs), i);
  }
  EXPECT_EQ(integer(Switch::kCudaGraphs), 16);
}

TEST(Switches, RecordedBitChangingValuesAreRequiredUnlessTheyFollowTheRecord) {
  const std::map<std::string, std::string> now = bit_values();
  EXPECT_EQ(now.count("REWIND_FUSED_LOSS"), 1u);
  EXPECT_EQ(now.count("REWIND_CUDA_GRAPHS"), 0u) << "same bits: not recorded";
  EXPECT_EQ(now.count("REWIND_PLAN"), 0u) << "read by Python: not recorded here";
  EXPECT_NO_THROW(check_recorded(now, {}));
  EXPECT_NO_THROW(check_recorded({}, {}));  // a store older than the key
  EXPECT_NO_THROW(check_recorded({{"REWIND_GONE", "1"}}, {}));
  try {
    check_recorded({{"REWIND_FUSED_LOSS", "0"}}, {});
    ADD_FAILURE() << "a differing bit-changing switch was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "REWIND_FUSED_LOSS=1 (the default), but the run was recorded with REWIND_FUSED_LOSS=0: "
                           "it changes the bits, so replay the run with REWIND_FUSED_LOSS=0");
  }
  // Unset, the GEMM follows the recorded one; set to another, it is refused.
  EXPECT_NO_THROW(check_recorded({{"REWIND_FP32_GEMM", "3xtf32"}}, {Switch::kFp32Gemm}));
  Env e("REWIND_FP32_GEMM", "simt");
  EXPECT_THROW(check_recorded({{"REWIND_FP32_GEMM", "3xtf32"}}, {Switch::kFp32Gemm}), UsageError);
}

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// docs/switches.md is generated from the table (`rewind --help-env markdown > docs/switches.md`).
TEST(Switches, DocsMatchTheTable) {
  const std::string docs = file_text(std::string(REWIND_SOURCE_DIR) + "/docs/switches.md");
  EXPECT_EQ(docs, markdown()) << "regenerate: build/rewind --help-env markdown > docs/switches.md";
  const testing::Cmd md = rewind_cmd("--help-env markdown");
  EXPECT_EQ(md.code, 0);
  EXPECT_EQ(md.out, markdown());
  const testing::Cmd help = rewind_cmd("--help-env");
  EXPECT_EQ(help.code, 0);
  EXPECT_EQ(help.out, help_text());
  for (const Spec& sp : table()) EXPECT_NE(help.out.find(sp.name), std::string::npos) << sp.name;
}

TEST(SwitchesCli, ABadValueIsOneLineAndExitCode2) {
  const testing::Cmd c = run_shell("REWIND_FUSED_NORM=yes " + std::string(REWIND_BIN) + " store info /nonexistent.db");
  EXPECT_EQ(c.code, 2);
  EXPECT_EQ(c.out, "rewind: error: REWIND_FUSED_NORM=yes: expected 0 or 1\n");
}

// A run recorded under REWIND_FUSED_LOSS=0 keeps the value in its meta; replaying it under the
// default is refused in one line naming both values, and under the recorded value it replays.
TEST(SwitchesCli, ABitChangingSwitchIsRecordedAndRequiredOnReplay) {
  const std::string dir = testing::temp_dir("switches");
  const std::string data = dir + "/train.bin", store = dir + "/run.db";
  const std::string bin = REWIND_BIN;
  ASSERT_EQ(rewind_cmd("data synth --tokens 20000 --vocab 64 -o " + data).code, 0);
  const testing::Cmd rec = run_shell("REWIND_FUSED_LOSS=0 " + bin + " train --data " + data + " --record " + store +
                                     " --steps 6 --vocab-size 64 --n-embd 32 --block-size 32 --threads 1"
                                     " --log-every 1000 --checkpoint-every 3");
  ASSERT_EQ(rec.code, 0) << rec.out;
  const testing::Cmd plain = rewind_cmd("replay --store " + store + " --from 3 --to 5 --verify");
  EXPECT_EQ(plain.code, 2) << plain.out;
  EXPECT_NE(plain.out.find("rewind: error: REWIND_FUSED_LOSS=1 (the default), but the run was recorded with "
                           "REWIND_FUSED_LOSS=0"),
            std::string::npos)
      << plain.out;
  const testing::Cmd same =
      run_shell("REWIND_FUSED_LOSS=0 " + bin + " replay --store " + store + " --from 3 --to 5 --verify");
  EXPECT_EQ(same.code, 0) << same.out;
  testing::remove_tree(dir);
}

}  // namespace
}  // namespace rwd::switches
