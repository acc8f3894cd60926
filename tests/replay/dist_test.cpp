// Data-parallel runs through the `rewind` binary on 2 CPU ranks (c10d Gloo over loopback):
// recorded twice with identical bits, replayed bitwise on 2 ranks and as a curve on 1, the same
// batches as one process, a SIGKILLed rank leaving a store that verifies and resumes bitwise.
// Built a second time as dist_cuda_test (REWIND_DIST_DEVICE "cuda", label cuda): the same on 2
// GPUs over NCCL, every fast path on; it skips unless the machine has 2 GPUs or more.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/local_port.h"
#include "store/store.h"
#include "tests/common/cli_run.h"
#include "tests/common/step_bits.h"
#include "tests/common/store_poll.h"

namespace {

#ifndef REWIND_DIST_DEVICE
#define REWIND_DIST_DEVICE "cpu"
#endif

// REWIND_BIN in the environment stands in for the build's binary (a test binary carried to
// another machine).
const std::string kBin = std::getenv("REWIND_BIN") ? std::getenv("REWIND_BIN") : REWIND_BIN;
const std::string kDevice = REWIND_DIST_DEVICE;
// Two micro-batches per step: one per rank with 2 ranks, both in one process with 1.
// On GPUs the heads are 64 wide (the CUDA kernels' smallest head dim).
const std::string kModel =
    std::string(kDevice == "cuda" ? " --n-embd 128 --n-head 2 --block-size 64" : " --n-embd 32 --block-size 32") +
    " --vocab-size 64 --batch-size 4 --gradient-accumulation-steps 2 --threads 1 --log-every 1000 --device " + kDevice;

using rwd::testing::Cmd;

Cmd sh(const std::string& cmd) { return rwd::testing::run_shell(cmd); }

class Dist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (kDevice == "cuda") {
      Cmd n = sh("nvidia-smi -L 2>/dev/null | grep -c '^GPU'");
      gpus_ = n.code == 0 ? std::atoi(n.out.c_str()) : 0;
      if (gpus_ < 2) return;
    }
    dir_ = rwd::testing::temp_dir("dist");
    data_ = dir_ + "/train.bin";
    store_ = dir_ + "/ranks2.db";
    ASSERT_EQ(sh(kBin + " data synth --tokens 200000 --vocab 64 -o " + data_).code, 0);
    Cmd r = sh(kBin + " train --nproc-per-node 2 --data " + data_ + " --steps 40 --checkpoint-every 10 --record " +
               store_ + kModel);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("2 ranks"), std::string::npos) << r.out;
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) rwd::testing::remove_tree(dir_);
  }
  void SetUp() override {
    if (kDevice == "cuda" && gpus_ < 2)
      GTEST_SKIP() << "2 GPUs or more needed, " << gpus_ << " found";
  }

  static std::vector<rwd::store::StepRecord> steps(const std::string& path) {
    auto s = rwd::store::Store::open(path, rwd::store::Mode::kReadOnly);
    return s.steps(1, 0, 1 << 20);
  }
  static std::vector<uint32_t> loss_bits(const std::string& path) {
    std::vector<uint32_t> out;
    for (const auto& st : steps(path)) out.push_back(st.loss_bits);
    return out;
  }

  static std::string dir_, data_, store_;
  static int gpus_;
};
std::string Dist::dir_, Dist::data_, Dist::store_;
int Dist::gpus_ = 0;

TEST_F(Dist, TwoRankRecordingIsRepeatableAndReplaysBitwise) {
  const std::string again = dir_ + "/again.db";
  Cmd r = sh(kBin + " train --nproc-per-node 2 --data " + data_ + " --steps 40 --checkpoint-every 10 --record " +
             again + kModel);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(loss_bits(store_).size(), 40u);
  EXPECT_EQ(loss_bits(again), loss_bits(store_));
  for (const char* w : {"--from 10 --to 19", "--from 25 --to 39"}) {
    Cmd v = sh(kBin + " replay --nproc-per-node 2 --store " + store_ + " " + w + " --verify");
    EXPECT_EQ(v.code, 0) << w << "\n" << v.out;
    EXPECT_NE(v.out.find("bitwise identical"), std::string::npos) << v.out;
  }
  EXPECT_EQ(sh(kBin + " store verify " + store_).code, 0);
}

// The sharded gradient exchange (all-to-all, per-shard sums in rank order, allgather)
// gives the bits of gathering every rank's whole gradient: same losses, norms and digests.
// The gradient exchange's forms all sum r0 + r1 in rank order: whole-tensor allgather after
// the backward, sharded after the backward (bucket size 0), and sharded in buckets started
// from the backward's hooks (the default; 0.01 MiB buckets split the tiny model into many).
TEST_F(Dist, ShardedExchangeHasTheBitsOfTheWholeAllgather) {
  const auto a = steps(store_);
  int n = 0;
  // On GPUs the last form also captures each rank's passes as a CUDA graph after 2 eager steps
  // (train/step_graph.h): its steps exchange after the replay instead of in buckets.
  for (const std::string env : {"REWIND_GRAD_EXCHANGE=allgather REWIND_GRAD_BUCKET_MB=0",
                                "REWIND_GRAD_BUCKET_MB=0", "REWIND_GRAD_BUCKET_MB=0.01",
                                "REWIND_CUDA_GRAPHS=2"}) {
    const std::string other = dir_ + "/exchange" + std::to_string(++n) + ".db";
    Cmd r = sh(env + " " + kBin + " train --nproc-per-node 2 --data " + data_ +
               " --steps 40 --checkpoint-every 10 --record " + other + kModel);
    ASSERT_EQ(r.code, 0) << env << "\n" << r.out;
    rwd::testing::expect_same_steps(a, steps(other), env);
  }
  EXPECT_EQ(sh("REWIND_GRAD_BUCKET_MB=lots " + kBin + " train --nproc-per-node 2 --data " + data_ +
               " --steps 2" + kModel).code, 2);
  EXPECT_EQ(sh("REWIND_GRAD_EXCHANGE=ring " + kBin + " train --nproc-per-node 2 --data " + data_ +
               " --steps 2" + kModel).code, 2);
}

// The ranks split each step's micro-batches, so 2 ranks train on exactly the batches of one
// process with the same accumulation; only the order of the gradient sums differs.
TEST_F(Dist, SameBatchesAsOneProcessAndCurveOnOtherRankCounts) {
  const std::string one = dir_ + "/ranks1.db";
  ASSERT_EQ(sh(kBin + " train --data " + data_ + " --steps 40 --checkpoint-every 10 --record " + one + kModel).code, 0);
  const auto a = steps(store_), b = steps(one);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].batch_hash, b[i].batch_hash) << "step " << i;
  EXPECT_EQ(a[0].loss_bits, b[0].loss_bits);  // step 0: same weights, same batches, one loss sum

  // replay defaults to the recording's rank count: bitwise without flags.
  Cmd v = sh(kBin + " replay --store " + store_ + " --from 20 --to 25 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("bitwise identical"), std::string::npos) << v.out;
  Cmd c = sh(kBin + " replay --nproc-per-node 1 --store " + store_ + " --from 20 --to 25 --verify");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("recorded on 2 rank(s); this computes it on 1"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("the curve, not bits, is compared"), std::string::npos) << c.out;
  Cmd d = sh(kBin + " train --resume " + store_ + " --steps 50");
  EXPECT_EQ(d.code, 2) << d.out;
  EXPECT_NE(d.out.find("resume it with --nproc-per-node 2"), std::string::npos) << d.out;
}

TEST_F(Dist, BadRankSetupIsAUsageError) {
  Cmd r = sh(kBin + " train --nproc-per-node 3 --data " + data_ + " --steps 2" + kModel);
  EXPECT_EQ(r.code, 2) << r.out;
  if (kDevice == "cuda" && gpus_ < 3)  // a rank without a GPU is told first
    EXPECT_NE(r.out.find("but this machine has " + std::to_string(gpus_)), std::string::npos) << r.out;
  else
    EXPECT_NE(r.out.find("must be a multiple of the number of ranks (3)"), std::string::npos) << r.out;
  Cmd e = sh("RANK=2 WORLD_SIZE=2 " + kBin + " train --data " + data_ + " --steps 2" + kModel);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("RANK 2 is not below WORLD_SIZE 2"), std::string::npos) << e.out;
}

// Replicas that drift apart end the job, naming the rank: each rank's parameter digest is
// compared with rank 0's one step later, through the rendezvous's store. Rank 1 is started by
// hand with another learning rate, so its parameters differ after the first update.
TEST_F(Dist, DivergedReplicaEndsTheJobNamingTheRank) {
  const std::string env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(rwd::free_local_port());
  const std::string args = " train --data " + data_ + " --steps 6 --record " + dir_ + "/diverged.db" + kModel;
  Cmd r = sh("(RANK=0 LOCAL_RANK=0 " + env + " " + kBin + args + " --learning-rate 0.001 & p=$!; RANK=1 LOCAL_RANK=1 " +
             env + " " + kBin + args + " --learning-rate 0.002; b=$?; wait $p; echo \"exits $? $b\") 2>&1");
  EXPECT_NE(r.out.find("replicas diverged at step 0: rank 1's parameters differ from rank 0's"), std::string::npos)
      << r.out;
  int exit0 = 0, exit1 = 0;  // neither rank ends well
  const size_t at = r.out.rfind("exits ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "exits %d %d", &exit0, &exit1), 2) << r.out;
  EXPECT_NE(exit0, 0) << r.out;
  EXPECT_NE(exit1, 0) << r.out;
}

// kill -9 of rank 1 in the middle of a recording: the launcher stops rank 0, the store keeps
// every committed step and checkpoint, verifies, replays bitwise and resumes to the same bits
// as an uninterrupted 2-rank run.
TEST_F(Dist, KilledRankLeavesAStoreThatVerifiesAndResumesBitwise) {
  const std::string whole = dir_ + "/whole.db", killed = dir_ + "/killed.db";
  const std::string args = " train --nproc-per-node 2 --data " + data_ + " --steps 200 --checkpoint-every 10" + kModel;
  ASSERT_EQ(sh(kBin + args + " --record " + whole).code, 0);
  const pid_t launcher = rwd::testing::spawn_shell(kBin + args + " --record " + killed + " >/dev/null 2>&1");
  EXPECT_TRUE(rwd::testing::wait_for_step(killed, 45));  // a few checkpoints exist
  // Rank 1 is the launcher's second child.
  Cmd kids = sh("pgrep -P " + std::to_string(launcher));
  std::vector<pid_t> ranks;
  for (size_t p = 0; p < kids.out.size();) {
    const size_t e = kids.out.find('\n', p);
    if (e == std::string::npos) break;
    ranks.push_back(static_cast<pid_t>(std::stol(kids.out.substr(p, e - p))));
    p = e + 1;
  }
  ASSERT_EQ(ranks.size(), 2u) << kids.out;
  kill(std::max(ranks[0], ranks[1]), SIGKILL);
  int status = 0;
  waitpid(launcher, &status, 0);
  // The launcher stops rank 0 and fails (with the killed rank's 137, or rank 0's own error
  // if Gloo reported the lost peer first).
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);

  EXPECT_EQ(sh(kBin + " store verify " + killed).code, 0);
  int64_t last;
  {
    auto s = rwd::store::Store::open(killed, rwd::store::Mode::kReadOnly);
    const auto range = s.step_range(1);
    ASSERT_TRUE(range.has_value()) << "killed before its first step was committed";
    last = range->second;
  }
  ASSERT_LT(last, 199);
  Cmd rp = sh(kBin + " replay --nproc-per-node 2 --store " + killed + " --from " + std::to_string(last - 3) +
              " --to " + std::to_string(last) + " --verify");
  EXPECT_EQ(rp.code, 0) << rp.out;
  Cmd rs = sh(kBin + " train --nproc-per-node 2 --resume " + killed + " --steps 200");
  ASSERT_EQ(rs.code, 0) << rs.out;
  EXPECT_EQ(loss_bits(killed), loss_bits(whole));
  EXPECT_EQ(loss_bits(killed).size(), 200u);
}

}  // namespace
