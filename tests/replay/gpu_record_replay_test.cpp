// On a GPU: record 30 steps of a small GPT with --device cuda, replay --verify bitwise; and
// `rewind step` and `rewind bisect` on a GPU recording with a planted fault.
// Skips cleanly where there is no CUDA device or the build is CPU-only.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "tests/common/cli_run.h"

namespace {

const std::string kBin = REWIND_BIN;

using rwd::testing::Cmd;

Cmd sh(const std::string& cmd) { return rwd::testing::run_shell(cmd); }

// Head dim 64 (the CUDA kernels take 64 and 128), T = 128: two key tiles.
const std::string kModel = " --n-layer 2 --n-head 4 --n-embd 256 --block-size 128 --batch-size 8";

// A scratch folder with a token file; records with `args` on the GPU. skip: no CUDA device.
struct GpuRun {
  std::string dir, data, store;
  bool skip = false;
  std::string why;
  // env: variables for the recording, e.g. "REWIND_FP32_GEMM=simt".
  GpuRun(const std::string& name, const std::string& args, const std::string& env = "") {
    char tmpl[] = "/tmp/rewind_gpu_XXXXXX";
    dir = mkdtemp(tmpl);
    data = dir + "/d.bin";
    store = dir + "/" + name + ".db";
    Cmd d = sh(kBin + " data synth --tokens 500000 --vocab 256 -o " + data);
    EXPECT_EQ(d.code, 0) << d.out;
    Cmd rec = sh(env + " " + kBin + " train --device cuda --data " + data + " --record " + store + kModel + " " + args);
    skip = rec.code == 2 && rec.out.find("no CUDA device") != std::string::npos;
    why = rec.out;
    if (!skip) EXPECT_EQ(rec.code, 0) << rec.out;
  }
  ~GpuRun() { rwd::testing::remove_tree(dir); }
};

// The recording replays with --verify over each window (exit 0: bitwise identical).
void expect_replays_bitwise(const GpuRun& run, std::initializer_list<const char*> windows) {
  for (const char* w : windows) {
    Cmd rp = sh(kBin + " replay --store " + run.store + " " + w + " --verify");
    EXPECT_EQ(rp.code, 0) << w << "\n" << rp.out;
  }
}

TEST(GpuRecordReplay, ThirtyStepsReplayBitwiseOnTheSameGpu) {
  GpuRun run("g", "--steps 30 --checkpoint-every 10");
  if (run.skip) GTEST_SKIP() << "no CUDA device: " << run.why;
  expect_replays_bitwise(run, {"--from 0 --to 29", "--from 15 --to 25"});
}

// Stochastic rounding on the GPU: the kernels draw their bits from the step, micro-batch and
// layer of each call, so a recording with sr heads (the BF16 fast block, stepping eagerly: no
// CUDA graph holds a stale key) replays bit for bit from a checkpoint, and differs from the
// same run without sr.
TEST(GpuRecordReplay, StochasticRoundingPlanReplaysBitwise) {
  GpuRun run("sr", "--steps 30 --checkpoint-every 10 --gradient-accumulation-steps 2 --plan 'pv=sr;acc=sr;L1.qk=sr'");
  if (run.skip) GTEST_SKIP() << "no CUDA device: " << run.why;
  expect_replays_bitwise(run, {"--from 0 --to 29", "--from 10 --to 25"});
  Cmd plain = sh(kBin + " replay --store " + run.store + " --from 10 --to 12 --verify --plan 'pv=low;acc=low;L1.qk=low'");
  EXPECT_NE(plain.out.find("differs from the recording"), std::string::npos) << plain.out;
}

// An all-FP32 plan's linears run 3xTF32 GEMMs (numerics 4) or, under REWIND_FP32_GEMM=simt,
// cuBLAS's FP32 GEMM (numerics 3, as every run recorded before). Replay picks the GEMM the
// run was recorded with, so both recordings replay bitwise without the variable; asking for the
// other GEMM is refused (exit 2) naming both, since it would change the bits.
TEST(GpuRecordReplay, Fp32PlansReplayWithTheGemmTheyWereRecordedWith) {
  for (const char* gemm : {"3xtf32", "simt"}) {
    const char* other = std::string(gemm) == "simt" ? "3xtf32" : "simt";
    GpuRun run(gemm, "--steps 12 --checkpoint-every 5 --plan 'all=fp32'", std::string("REWIND_FP32_GEMM=") + gemm);
    if (run.skip) GTEST_SKIP() << "no CUDA device: " << run.why;
    Cmd same = sh(kBin + " replay --store " + run.store + " --from 0 --to 11 --verify");
    EXPECT_EQ(same.code, 0) << gemm << "\n" << same.out;
    EXPECT_EQ(same.out.find("numerics"), std::string::npos) << gemm << ": no numerics warning expected\n" << same.out;
    Cmd forced = sh(std::string("REWIND_FP32_GEMM=") + other + " " + kBin + " replay --store " + run.store +
                    " --from 0 --to 11 --verify");
    EXPECT_EQ(forced.code, 2) << gemm << " recording replayed with " << other << "\n" << forced.out;
    EXPECT_NE(forced.out.find(std::string("recorded with REWIND_FP32_GEMM=") + gemm), std::string::npos) << forced.out;
  }
}

// The demo's planted fault (layer 1, head 2, delta, from step 20) on a GPU recording: `step`
// reports finite per-head differences against all-FP32, and `bisect` localizes the fault
// exactly (exit 4), its probes replaying on the GPU (all-FP32 heads on the SIMT kernels).
// Gradient clipping keeps this model's loss finite under the fault (grad norm ~1e28 instead of
// ~1), hence the predicate. The same commands on the CPU: localized in 19 probes.
TEST(GpuRecordReplay, StepAndBisectRunOnTheGpu) {
  GpuRun run("f", "--steps 40 --checkpoint-every 20 --plan-from '20:L1.H2.delta=fault(strength=1e30)'");
  if (run.skip) GTEST_SKIP() << "no CUDA device: " << run.why;
  const std::string json = run.dir + "/step.json", report = run.dir + "/report";
  Cmd st = sh(kBin + " step --store " + run.store + " --step 10 --fp32 all --json " + json);
  ASSERT_EQ(st.code, 0) << st.out;
  const nlohmann::json j = rwd::testing::read_json(json);
  ASSERT_EQ(j["heads"].size(), 8u);
  for (const auto& h : j["heads"])
    for (const char* k : {"o_mean", "o_max_abs", "delta_sum", "dwq_norm"}) EXPECT_TRUE(std::isfinite(h[k].get<double>())) << k;
  Cmd b = sh(kBin + " bisect --store " + run.store + " --window 20:39 --fail 'nan || grad_norm > 1e6' --quiet --jobs 1 --report " + report);
  EXPECT_EQ(b.code, 4) << b.out;
  const nlohmann::json r = rwd::testing::read_json(report + "/report.json");
  EXPECT_EQ(r["narrowing"]["status"], "localized") << b.out;
  const auto& failing = r["narrowing"]["failing_set"];
  ASSERT_EQ(failing.size(), 1u) << failing.dump();
  EXPECT_EQ(failing[0], "L1.H2.delta");
}

}  // namespace
