// Helpers for the end-to-end bisect tests: run the built `rewind` binary, record small faulty
// runs, read report.json. The binary path comes from the REWIND_BIN compile definition.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/cli_run.h"

namespace rwd::bisect::testing {

using rwd::testing::Cmd;
using rwd::testing::read_json;
using rwd::testing::rewind_cmd;
using rwd::testing::temp_dir;

// The tiny model every test records: 2 layers x 4 heads, width 64, sequence 64, vocab 64.
// Calibrated faults (lr 0.01, fault switched on at step 20 with --plan-from, window 20:39):
// the clean run keeps max(loss) <= 2.25, while o=fault(strength=4096) on one head reaches
// 3.8-5.0 and pv/delta=fault(strength=25600) 3.6-4.2, so `max(loss) > 3` separates them.
// Smaller strengths (o < 1024, pv < 2560) and every qk/softmax fault barely move the loss.
inline std::string train_args(const std::string& data, const std::string& store, int steps,
                              int ckpt_every, const std::string& extra) {
  // --checkpoint-wait: checkpoints exactly every ckpt_every steps (the tests name them), not
  // deferred where the writer is still busy, as a loaded machine may make it.
  return "train --data " + data + " --record " + store + " --steps " + std::to_string(steps) +
         " --checkpoint-every " + std::to_string(ckpt_every) + " --checkpoint-wait --vocab-size 64 --log-every 1000 " +
         extra;
}

// A test suite's temporary folder holding a synthetic corpus (300k tokens, vocab 64) in
// data_; each test binary has one suite, which calls make_data from its SetUpTestSuite.
class TinyRunSuite : public ::testing::Test {
 protected:
  static void make_data(const std::string& tag) {
    dir_ = temp_dir(tag);
    data_ = dir_ + "/data.bin";
    Cmd c = rewind_cmd("data synth -o " + data_ + " --tokens 300000 --vocab 64");
    ASSERT_EQ(c.code, 0) << c.out;
  }
  static void TearDownTestSuite() { rwd::testing::remove_tree(dir_); }
  inline static std::string dir_, data_;
};

inline std::vector<std::string> strings(const nlohmann::json& a) {
  std::vector<std::string> v;
  for (const auto& x : a) v.push_back(x.get<std::string>());
  return v;
}

}  // namespace rwd::bisect::testing
