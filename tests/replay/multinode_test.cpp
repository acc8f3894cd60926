// A data-parallel job across two hosts: two network namespaces of this machine joined by a veth
// pair (10.231.0.1 and 10.231.0.2), Gloo over TCP between them. Two nodes of two CPU ranks,
// started by rewind's own launcher on each node (and by torchrun where it is installed), record
// the same bits twice and as four ranks on one host, replay bitwise on the same layout, and end
// with the store intact when a rank of the other node is killed or that node leaves the network.
// Skips unless it may make namespaces (root, `ip netns add`).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"
#include "tests/common/cli_run.h"
#include "tests/common/step_bits.h"
#include "tests/common/store_poll.h"

namespace {

const std::string kBin = std::getenv("REWIND_BIN") ? std::getenv("REWIND_BIN") : REWIND_BIN;
// Four micro-batches a step: one a rank on 2 x 2 ranks.
const std::string kModel =
    " --n-embd 32 --block-size 32 --vocab-size 64 --batch-size 4 --gradient-accumulation-steps 4"
    " --threads 1 --log-every 1000";
const std::string kAddr0 = "10.231.0.1", kAddr1 = "10.231.0.2";

using rwd::testing::Cmd;

Cmd sh(const std::string& cmd) { return rwd::testing::run_shell(cmd); }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Waits up to `limit` for `pid`; its exit code, or -1 if it still ran (it is then left running).
int wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (done < 0 || std::chrono::steady_clock::now() > end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

class MultiNode : public ::testing::Test {
 protected:
  // Names carry this process's id, so runs side by side (and their leftovers) never meet.
  static void SetUpTestSuite() {
    const std::string id = std::to_string(getpid());
    ns_[0] = "rwA" + id, ns_[1] = "rwB" + id;
    veth_[0] = "rwvA" + id, veth_[1] = "rwvB" + id;
    if (geteuid() != 0) {
      skip_ = "not root: network namespaces cannot be made";
      return;
    }
    if (sh("command -v ip").code != 0) {
      skip_ = "no `ip` command";
      return;
    }
    Cmd made = sh("ip netns add " + ns_[0] + " && ip netns add " + ns_[1] + " && ip link add " + veth_[0] +
                  " type veth peer name " + veth_[1]);
    for (int n = 0; n < 2 && made.code == 0; ++n) {
      const std::string in = "ip -n " + ns_[n] + " ";
      made = sh("ip link set " + veth_[n] + " netns " + ns_[n] + " && " + in + "addr add " + (n ? kAddr1 : kAddr0) +
                "/24 dev " + veth_[n] + " && " + in + "link set " + veth_[n] + " up && " + in + "link set lo up");
    }
    if (made.code != 0) {
      skip_ = "cannot make two network namespaces joined by a veth pair: " + made.out;
      return;
    }
    dir_ = rwd::testing::temp_dir("multinode");
    data_ = dir_ + "/train.bin";
    ASSERT_EQ(sh(kBin + " data synth --tokens 200000 --vocab 64 -o " + data_).code, 0);
    // The reference recording: 2 nodes x 2 ranks, rewind's own launcher on each node.
    store_ = dir_ + "/nodes2x2.db";
    const Job j = launch("train --data " + data_ + " --steps 12 --checkpoint-every 4 --record " + store_ + kModel);
    ASSERT_EQ(j.code[0], 0) << j.log[0] << j.log[1];
    ASSERT_EQ(j.code[1], 0) << j.log[0] << j.log[1];
    EXPECT_NE(j.log[0].find("4 ranks"), std::string::npos) << j.log[0];
  }
  // Runs even when a test failed: every process left in the namespaces is ours, then the
  // namespaces go (and the veth pair with them).
  static void TearDownTestSuite() {
    for (int n = 0; n < 2; ++n) {
      sh("ip netns pids " + ns_[n] + " 2>/dev/null | xargs -r kill -9");
      sh("ip netns del " + ns_[n] + " 2>/dev/null");
      sh("ip link del " + veth_[n] + " 2>/dev/null");  // still here only if moving it failed
    }
    if (!dir_.empty()) rwd::testing::remove_tree(dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  // Both nodes' outcome: exit codes (-1: still running at the limit, then killed) and output.
  struct Job {
    int code[2] = {-1, -1};
    std::string log[2];
  };

  // Starts `cmd` in node n's namespace, its output into `log`; the pid is rewind's (or the
  // launcher's) own: `ip netns exec` execs it.
  static pid_t start(int n, const std::string& cmd, const std::string& log) {
    return rwd::testing::spawn_shell("ip netns exec " + ns_[n] + " env " + cmd + " > " + log + " 2>&1");
  }
  // Both nodes' processes and where their output goes.
  struct Started {
    pid_t pid[2];
    std::string log[2];
  };
  // Waits up to `limit` for both nodes; a node still running then is killed with everything in
  // the namespaces.
  static Job finish(const Started& s, std::chrono::seconds limit) {
    const pid_t* pid = s.pid;
    Job j;
    const auto end = std::chrono::steady_clock::now() + limit;
    for (int n = 0; n < 2; ++n) {
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(end - std::chrono::steady_clock::now());
      j.code[n] = wait_exit(pid[n], std::max(left, std::chrono::seconds(1)));
    }
    for (int n = 0; n < 2; ++n) {
      if (j.code[n] == -1) {
        for (int m = 0; m < 2; ++m) sh("ip netns pids " + ns_[m] + " | xargs -r kill -9");
        waitpid(pid[n], nullptr, 0);
      }
      j.log[n] = "--- node " + std::to_string(n) + " ---\n" + slurp(s.log[n]);
    }
    return j;
  }
  // rewind's launcher flags of node n of 2 nodes x 2 ranks.
  static std::string node_flags(int n) {
    return " --nnodes 2 --node-rank " + std::to_string(n) + " --nproc-per-node 2 --master-addr " + kAddr0;
  }
  // Starts `rewind ARGS` as node 0 and node 1 of 2 nodes x 2 ranks, rewind's launcher on each,
  // with `env` (VAR=value ...) in their environment; their logs are TAG0.log and TAG1.log.
  static Started start_nodes(const std::string& args, const std::string& tag, const std::string& env = "") {
    Started s;
    for (int n = 0; n < 2; ++n) {
      s.log[n] = dir_ + "/" + tag + std::to_string(n) + ".log";
      s.pid[n] = start(n, env + " " + kBin + " " + args + node_flags(n), s.log[n]);
    }
    return s;
  }
  // `rewind ARGS` on both nodes, to its end.
  static Job launch(const std::string& args) { return finish(start_nodes(args, "node"), std::chrono::seconds(300)); }

  static std::vector<rwd::store::StepRecord> steps(const std::string& path) {
    auto s = rwd::store::Store::open(path, rwd::store::Mode::kReadOnly);
    return s.steps(1, 0, 1 << 20);
  }
  static void expect_same_steps(const std::string& a, const std::string& b) {
    rwd::testing::expect_same_steps(steps(a), steps(b), b);
  }

  static std::string ns_[2], veth_[2], skip_, dir_, data_, store_;
};
std::string MultiNode::ns_[2], MultiNode::veth_[2], MultiNode::skip_, MultiNode::dir_, MultiNode::data_,
    MultiNode::store_;

// The same job again, and the same 4 ranks on one host, record the same bits: the sums run in
// rank order whatever carries the bytes. The recording replays bitwise on 2 nodes x 2 ranks
// (the recording's 4 ranks split over --nnodes 2 without --nproc-per-node).
TEST_F(MultiNode, TwoNodesRecordRepeatablyAndReplayBitwise) {
  ASSERT_EQ(steps(store_).size(), 12u);
  const std::string again = dir_ + "/again.db", local = dir_ + "/local4.db";
  const Job j = launch("train --data " + data_ + " --steps 12 --checkpoint-every 4 --record " + again + kModel);
  ASSERT_EQ(j.code[0], 0) << j.log[0] << j.log[1];
  ASSERT_EQ(j.code[1], 0) << j.log[0] << j.log[1];
  expect_same_steps(store_, again);
  Cmd one = sh(kBin + " train --nproc-per-node 4 --data " + data_ + " --steps 12 --checkpoint-every 4 --record " +
               local + kModel);
  ASSERT_EQ(one.code, 0) << one.out;
  expect_same_steps(store_, local);

  const Job v = launch("replay --store " + store_ + " --from 5 --to 11 --verify");
  EXPECT_EQ(v.code[0], 0) << v.log[0] << v.log[1];
  EXPECT_EQ(v.code[1], 0) << v.log[0] << v.log[1];
  EXPECT_NE(v.log[0].find("bitwise identical"), std::string::npos) << v.log[0];
  EXPECT_EQ(sh(kBin + " store verify " + store_).code, 0);
  Cmd odd = sh(kBin + " replay --store " + store_ + " --from 5 --to 11 --verify --nnodes 3 --master-addr " + kAddr0);
  EXPECT_EQ(odd.code, 2) << odd.out;
  EXPECT_NE(odd.out.find("the recording's 4 ranks do not split evenly over --nnodes 3"), std::string::npos) << odd.out;
}

// torchrun --no-python starts the same job (static rendezvous, then c10d's), its agents holding
// MASTER_PORT: the same bits. Skipped where torchrun is not installed.
TEST_F(MultiNode, TorchrunStartsTheSameJob) {
  if (sh("python3 -c 'import torch.distributed.run'").code != 0)
    GTEST_SKIP() << "no torchrun (python3 -m torch.distributed.run)";
  // c10d's rendezvous: node 0 hosts its store (torchrun's guess matches the hostname, not the
  // namespace's address).
  const std::string rdzv[2] = {"--master-addr " + kAddr0 + " --master-port 29400",
                               "--rdzv-backend c10d --rdzv-endpoint " + kAddr0 + ":29400 --rdzv-id multinode "
                               "--rdzv-conf is_host="};
  for (int k = 0; k < 2; ++k) {
    const std::string rec = dir_ + "/torchrun" + std::to_string(k) + ".db";
    Started s;
    for (int n = 0; n < 2; ++n) {
      s.log[n] = dir_ + "/torchrun" + std::to_string(n) + ".log";
      // --local-addr: the address the agent gives the others (not the hostname's, loopback here).
      s.pid[n] = start(n, "python3 -m torch.distributed.run --no-python --nnodes 2 --node-rank " + std::to_string(n) +
                              " --nproc-per-node 2 --local-addr " + (n ? kAddr1 : kAddr0) + " " + rdzv[k] +
                              (k == 1 ? std::to_string(1 - n) : "") + " " + kBin + " train --data " + data_ +
                              " --steps 12 --checkpoint-every 4 --record " + rec + kModel,
                       s.log[n]);
    }
    const Job j = finish(s, std::chrono::seconds(300));
    ASSERT_EQ(j.code[0], 0) << rdzv[k] << "\n" << j.log[0] << j.log[1];
    ASSERT_EQ(j.code[1], 0) << rdzv[k] << "\n" << j.log[0] << j.log[1];
    expect_same_steps(store_, rec);
  }
}

// Slurm's task variables (srun's, with the MASTER_ADDR a batch script exports) place the ranks
// as torchrun's do: four processes started by hand, two in each namespace, record the same bits.
TEST_F(MultiNode, SlurmVariablesPlaceTheRanks) {
  const std::string rec = dir_ + "/slurm.db";
  std::vector<pid_t> pids;
  for (int p = 0; p < 4; ++p) {
    const int n = p / 2;
    pids.push_back(start(n, "SLURM_PROCID=" + std::to_string(p) + " SLURM_LOCALID=" + std::to_string(p % 2) +
                                " SLURM_NTASKS=4 MASTER_ADDR=" + kAddr0 + " " + kBin + " train --data " + data_ +
                                " --steps 12 --checkpoint-every 4 --record " + rec + kModel,
                         dir_ + "/slurm" + std::to_string(p) + ".log"));
  }
  for (int p = 0; p < 4; ++p)
    EXPECT_EQ(wait_exit(pids[static_cast<size_t>(p)], std::chrono::seconds(300)), 0)
        << slurp(dir_ + "/slurm" + std::to_string(p) + ".log");
  expect_same_steps(store_, rec);
}

// kill -9 of a rank on node 1: its launcher stops node 1's other rank, node 0's ranks lose their
// peer and end, and the store that node 0's rank 0 wrote verifies and replays bitwise.
TEST_F(MultiNode, KilledRankOnTheOtherNodeEndsTheJobWithTheStoreIntact) {
  const std::string rec = dir_ + "/killed.db";
  const Started s =
      start_nodes("train --data " + data_ + " --steps 400 --checkpoint-every 4 --record " + rec + kModel, "killed");
  ASSERT_TRUE(rwd::testing::wait_for_step(rec, 9)) << slurp(s.log[0]) << slurp(s.log[1]);
  Cmd kids = sh("pgrep -P " + std::to_string(s.pid[1]) + " | sort -n | tail -1");  // node 1's second rank (rank 3)
  ASSERT_FALSE(kids.out.empty());
  const auto t0 = std::chrono::steady_clock::now();
  kill(static_cast<pid_t>(std::stol(kids.out)), SIGKILL);
  const Job j = finish(s, std::chrono::seconds(120));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int n = 0; n < 2; ++n) {
    EXPECT_NE(j.code[n], 0) << j.log[n];
    EXPECT_NE(j.code[n], -1) << "node " << n << " hung:\n" << j.log[n];
  }
  // Node 1's launcher names the killed rank, unless its other rank's error came first.
  if (j.code[1] == 128 + SIGKILL)
    EXPECT_NE(j.log[1].find("rank 3 was killed by signal 9"), std::string::npos) << j.log[1];
  EXPECT_NE(j.log[0].find("lost the other ranks"), std::string::npos) << j.log[0];
  EXPECT_LT(took, 60.0) << "a peer's death is seen at once, not after the timeout";
  std::printf("[ timing ] rank 3 killed: the job ended %.1f s later\n", took);

  EXPECT_EQ(sh(kBin + " store verify " + rec).code, 0);
  int64_t last;
  {
    auto s = rwd::store::Store::open(rec, rwd::store::Mode::kReadOnly);
    const auto range = s.step_range(1);
    ASSERT_TRUE(range.has_value());
    last = range->second;
  }
  ASSERT_LT(last, 399);
  const Job v = launch("replay --store " + rec + " --from " + std::to_string(last - 3) + " --to " +
                       std::to_string(last) + " --verify");
  EXPECT_EQ(v.code[0], 0) << v.log[0] << v.log[1];
  EXPECT_NE(v.log[0].find("bitwise identical"), std::string::npos) << v.log[0];
}

// Node 1 leaves the network (its link goes down: no connection is closed, nothing answers):
// both nodes end within REWIND_DIST_TIMEOUT and a margin, saying why, and the store verifies.
TEST_F(MultiNode, NodeGoneFromTheNetworkEndsTheJobWithinTheTimeout) {
  const std::string rec = dir_ + "/unplugged.db";
  const Started s = start_nodes("train --data " + data_ + " --steps 400 --record " + rec + kModel, "unplugged",
                                "REWIND_DIST_TIMEOUT=10");
  ASSERT_TRUE(rwd::testing::wait_for_step(rec, 9)) << slurp(s.log[0]) << slurp(s.log[1]);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(sh("ip -n " + ns_[1] + " link set " + veth_[1] + " down").code, 0);
  const Job j = finish(s, std::chrono::seconds(120));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sh("ip -n " + ns_[1] + " link set " + veth_[1] + " up");
  for (int n = 0; n < 2; ++n) {
    EXPECT_NE(j.code[n], 0) << j.log[n];
    EXPECT_NE(j.code[n], -1) << "node " << n << " hung:\n" << j.log[n];
    EXPECT_NE(j.log[n].find("REWIND_DIST_TIMEOUT"), std::string::npos) << j.log[n];
  }
  EXPECT_LT(took, 60.0) << j.log[0] << j.log[1];
  std::printf("[ timing ] node 1 unplugged: the job ended %.1f s later (REWIND_DIST_TIMEOUT=10)\n", took);
  EXPECT_EQ(sh(kBin + " store verify " + rec).code, 0);
}

// One-line refusals, before anything starts: flags that do not make a job, and flags that
// contradict the job a launcher already placed this process in.
TEST(MultiNodeFlags, InconsistentFlagsAreRefusedInOneLine) {
  const std::string train = kBin + " train --data /nonexistent --steps 2";
  const std::pair<std::string, std::string> cases[] = {
      {train + " --nnodes 2 --node-rank 2 --master-addr 10.0.0.1", "--node-rank 2 is not a node of --nnodes 2 (0..1)"},
      {train + " --nnodes 2 --node-rank 1", "--nnodes 2 needs --master-addr"},
      {train + " --nnodes 0", "--nnodes must be at least 1"},
      {train + " --nnodes 2 --master-addr 10.0.0.1 --master-port 70000", "--master-port must be 1..65535"},
      {"WORLD_SIZE=4 RANK=0 " + train + " --nproc-per-node 2", "do not describe this process, rank 0 of a job of 4"},
      {"SLURM_PROCID=2 SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 " + train, "SLURM_PROCID 2 is not below SLURM_NTASKS 2"},
  };
  for (const auto& [cmd, says] : cases) {
    Cmd r = sh("env -u WORLD_SIZE -u RANK " + cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << cmd << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << cmd << "\n" << r.out;
  }
}

}  // namespace
