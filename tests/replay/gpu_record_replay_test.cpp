// On a GPU: record 30 steps of a small GPT with --device cuda, replay --verify bitwise.
// Skips cleanly where there is no CUDA device or the build is CPU-only.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "tests/common/cli_run.h"

namespace {

const std::string kBin = REWIND_BIN;

using rwd::testing::Cmd;

Cmd sh(const std::string& cmd) { return rwd::testing::run_shell(cmd); }

TEST(GpuRecordReplay, ThirtyStepsReplayBitwiseOnTheSameGpu) {
  char tmpl[] = "/tmp/rewind_gpu_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string data = dir + "/d.bin", store = dir + "/g.db";
  ASSERT_EQ(sh(kBin + " data synth --tokens 500000 --vocab 256 -o " + data).code, 0);
  // Head dim 64 (the CUDA kernels take 64 and 128), T = 128: two key tiles.
  const std::string model = " --n-layer 2 --n-head 4 --n-embd 256 --block-size 128 --batch-size 8";
  Cmd rec = sh(kBin + " train --device cuda --data " + data + " --steps 30 --checkpoint-every 10 --record " +
               store + model);
  if (rec.code == 2 && rec.out.find("no CUDA device") != std::string::npos) {
    rwd::testing::remove_tree(dir);
    GTEST_SKIP() << "no CUDA device: " << rec.out;
  }
  ASSERT_EQ(rec.code, 0) << rec.out;
  for (const char* w : {"--from 0 --to 29", "--from 15 --to 25"}) {
    Cmd rp = sh(kBin + " replay --store " + store + " " + w + " --verify");
    EXPECT_EQ(rp.code, 0) << w << "\n" << rp.out;
  }
  rwd::testing::remove_tree(dir);
}

}  // namespace
