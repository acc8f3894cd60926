// nanoGPT interop against PyTorch: checkpoints written by a nanoGPT-equivalent model under
// python3 + torch (nanogpt_fixture.py) are imported, compared with PyTorch's FP32 loss,
// exported back bit for bit, resumed by train.py's procedure, and refused when damaged.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>

#include "interop/nanogpt.h"
#include "tests/common/cli_run.h"
#include "train/data.h"
#include "train/trainer.h"

namespace rwd::interop {
namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;
using rwd::testing::run_shell;

std::string python(const std::string& args) {
  return std::string(REWIND_PYTHON) + " " + REWIND_FIXTURE + " " + args;
}

bool have_torch() {
  static const bool ok = run_shell(std::string(REWIND_PYTHON) + " -c 'import torch, numpy'").code == 0;
  return ok;
}

bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// (bias, _orig_mod. prefix, causal-mask buffers)
class NanoGpt : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {
 protected:
  void SetUp() override {
    if (!have_torch()) GTEST_SKIP() << REWIND_PYTHON << " cannot import torch (install python3-torch)";
    dir_ = rwd::testing::temp_dir("nanogpt");
    auto [bias, prefix, mask] = GetParam();
    const std::string flags = std::string(bias ? " --bias" : "") + (prefix ? " --prefix" : "") + (mask ? " --mask" : "");
    Cmd c = run_shell(python("make " + dir_ + flags));
    ASSERT_EQ(c.code, 0) << c.out;
  }
  void TearDown() override {
    if (!dir_.empty()) rwd::testing::remove_tree(dir_);
  }
  // The loss rewind computes on the fixture's batch under `plan_spec`, and PyTorch's.
  std::pair<double, double> losses(const std::string& plan_spec) {
    NanoGptCheckpoint ck = read_nanogpt(dir_ + "/ckpt.pt");
    train::TokenFile data(dir_ + "/train.bin");
    const plan::Plan plan = plan::parse(plan_spec, ck.config.n_layer, ck.config.n_head);
    train::Trainer t(ck.config, plan, data);
    t.load_state(ck.state);
    const nlohmann::json b = rwd::testing::read_json(dir_ + "/batch.json");
    train::Batch batch = train::batch_from_offsets(data, b["offsets"].get<std::vector<int64_t>>(), ck.config.block_size);
    const int64_t rows = static_cast<int64_t>(batch.offsets.size());
    torch::NoGradGuard no_grad;
    torch::Tensor x = torch::tensor(batch.x).view({rows, -1}), y = torch::tensor(batch.y).view({rows, -1});
    return {t.model()->loss(x, y, plan, nullptr).item<double>(), b["loss"].get<double>()};
  }
  std::string dir_;
};

TEST_P(NanoGpt, LossEqualsPyTorchFp32AndBf16WithinTolerance) {
  auto [fp32, torch_loss] = losses("all=fp32");
  EXPECT_LE(std::fabs(fp32 - torch_loss) / torch_loss, 1e-5) << fp32 << " vs " << torch_loss;
  auto [bf16, torch_again] = losses("");
  EXPECT_LE(std::fabs(bf16 - torch_again) / torch_again, 1e-2) << bf16 << " vs " << torch_again;
  EXPECT_NE(bf16, fp32);  // the default plan really rounds
  std::printf("loss: PyTorch FP32 %.8f, rewind all=fp32 %.8f (rel %.2e), default plan %.8f (rel %.2e)\n",
              torch_loss, fp32, std::fabs(fp32 - torch_loss) / torch_loss, bf16,
              std::fabs(bf16 - torch_loss) / torch_loss);
}

TEST_P(NanoGpt, ExportOfImportIsBitIdenticalAndResumable) {
  const std::string store = dir_ + "/run.db", out = dir_ + "/out.pt", again = dir_ + "/again.ckpt";
  Cmd c = rewind_cmd("import nanogpt --ckpt " + dir_ + "/ckpt.pt --data " + dir_ + "/train.bin --record " + store);
  ASSERT_EQ(c.code, 0) << c.out;
  c = rewind_cmd("export nanogpt --store " + store + " --step 5 -o " + out);
  ASSERT_EQ(c.code, 0) << c.out;
  c = run_shell(python("compare " + dir_ + "/ckpt.pt " + out));
  EXPECT_EQ(c.code, 0) << c.out;
  c = rewind_cmd("export nanogpt --store " + store + " --step 5 -o " + again);
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(slurp(out) == slurp(again));  // deterministic bytes, whatever the file's name
  c = rewind_cmd("export nanogpt --store " + store + " --step 5 -o " + out);
  EXPECT_EQ(c.code, 3) << c.out;       // never overwrites (exit 3, as an existing --record store)
  c = run_shell(python("resume " + out + " " + dir_ + "/train.bin"));
  EXPECT_EQ(c.code, 0) << c.out;
}

INSTANTIATE_TEST_SUITE_P(Variants, NanoGpt,
                         ::testing::Values(std::make_tuple(false, false, false),
                                           std::make_tuple(true, false, true),
                                           std::make_tuple(false, true, true),
                                           std::make_tuple(true, true, false)));

class NanoGptRun : public NanoGpt {};

// From the imported checkpoint: train --resume records on, replay verifies bitwise (twice),
// and a step that is not a checkpoint is exported by replay and resumed by train.py's code.
TEST_P(NanoGptRun, ResumeReplayAndExportOfReplayedStep) {
  const std::string store = dir_ + "/run.db", out = dir_ + "/step8.pt";
  Cmd c = rewind_cmd("import nanogpt --ckpt " + dir_ + "/ckpt.pt --data " + dir_ + "/train.bin --record " +
                     store + " --checkpoint-every 4");
  ASSERT_EQ(c.code, 0) << c.out;
  c = rewind_cmd("train --resume " + store + " --steps 11");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("step      5"), std::string::npos) << c.out;
  for (int i = 0; i < 2; ++i) {
    c = rewind_cmd("replay --store " + store + " --from 5 --to 10 --verify");
    EXPECT_EQ(c.code, 0) << c.out;
  }
  c = rewind_cmd("export nanogpt --store " + store + " --step 7 -o " + out);
  ASSERT_EQ(c.code, 0) << c.out;
  c = run_shell(python("resume " + out + " " + dir_ + "/train.bin"));
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("resumed at iter 7"), std::string::npos) << c.out;
}

INSTANTIATE_TEST_SUITE_P(Bias, NanoGptRun, ::testing::Values(std::make_tuple(true, false, false)));

class NanoGptBad : public NanoGpt {};

// Damaged or foreign checkpoints: exit 3, one line naming the key, no store left behind.
TEST_P(NanoGptBad, RefusedWithTheKeyAndNoStore) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"missing", "transformer.h.1.mlp.c_fc.weight"},   {"shape", "transformer.h.0.attn.c_proj.weight"},
      {"extra", "transformer.h.0.attn.rotary"},        {"untied", "lm_head.weight"},
      {"moment", "exp_avg"},                            {"not_nanogpt", "model_args"},
      {"heads", "model_args"},                          {"list", "not a nanoGPT checkpoint"}};
  for (const auto& [kind, key] : cases) {
    const std::string bad = dir_ + "/bad_" + kind + ".pt", store = dir_ + "/bad_" + kind + ".db";
    Cmd c = run_shell(python("break " + dir_ + "/ckpt.pt " + bad + " " + kind));
    ASSERT_EQ(c.code, 0) << c.out;
    c = rewind_cmd("import nanogpt --ckpt " + bad + " --data " + dir_ + "/train.bin --record " + store);
    EXPECT_EQ(c.code, 3) << kind << ": " << c.out;
    EXPECT_NE(c.out.find(key), std::string::npos) << kind << ": " << c.out;
    EXPECT_EQ(std::count(c.out.begin(), c.out.end(), '\n'), 1) << kind << ": " << c.out;
    EXPECT_FALSE(exists(store)) << kind;
  }
  std::ofstream(dir_ + "/junk.pt") << "not a checkpoint";
  Cmd c = rewind_cmd("import nanogpt --ckpt " + dir_ + "/junk.pt --data " + dir_ + "/train.bin --record " + dir_ + "/j.db");
  EXPECT_EQ(c.code, 3) << c.out;
  EXPECT_FALSE(exists(dir_ + "/j.db"));
  // An existing store is never touched.
  std::ofstream(dir_ + "/taken.db") << "mine";
  c = rewind_cmd("import nanogpt --ckpt " + dir_ + "/ckpt.pt --data " + dir_ + "/train.bin --record " + dir_ + "/taken.db");
  EXPECT_EQ(c.code, 3) << c.out;
  EXPECT_EQ(slurp(dir_ + "/taken.db"), "mine");
}

INSTANTIATE_TEST_SUITE_P(Plain, NanoGptBad, ::testing::Values(std::make_tuple(false, false, false)));

}  // namespace
}  // namespace rwd::interop
