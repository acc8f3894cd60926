// `rewind train --device cuda` with a head dim the CUDA kernels lack: one line naming the
// supported dims, exit 2, no store, before any device work (so it runs in CPU builds too);
// the CPU device keeps taking that head dim.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <string>

#include "tests/common/cli_run.h"

namespace rwd::testing {
namespace {

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(HeadDimCli, CudaRejectsUnsupportedHeadDimBeforeTraining) {
  const std::string dir = temp_dir("headdim");
  const std::string data = dir + "/d.bin", store = dir + "/s.db";
  ASSERT_EQ(rewind_cmd("data synth --tokens 20000 --vocab 64 -o " + data).code, 0);
  const std::string model = " --vocab-size 64 --n-embd 96 --n-head 2 --n-layer 1 --block-size 16"
                            " --batch-size 2 --threads 1 --steps 1 --data " + data;
  const Cmd cuda = rewind_cmd("train --device cuda --record " + store + model);
  EXPECT_EQ(cuda.code, 2) << cuda.out;
  EXPECT_NE(cuda.out.find("rewind: error: config: --device cuda runs attention heads of dim 32, 64, 80, 96, 128 or 256"),
            std::string::npos) << cuda.out;
  EXPECT_NE(cuda.out.find("96 / 2 = 48"), std::string::npos) << cuda.out;
  EXPECT_EQ(cuda.out.find('\n'), cuda.out.size() - 1) << "one line: " << cuda.out;
  EXPECT_FALSE(exists(store));
  // PyTorch's attention takes any head dim; so does the CPU emulation.
  const Cmd cpu = rewind_cmd("train --device cpu --record " + store + model);
  EXPECT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_TRUE(exists(store));
  remove_tree(dir);
}

}  // namespace
}  // namespace rwd::testing
