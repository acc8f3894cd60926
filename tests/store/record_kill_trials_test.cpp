// `rewind train --record` killed with SIGKILL at fixed moments from its start to past its first
// checkpoint: each kill leaves nothing at the path, a stub that `--record` replaces, or a store
// that verifies and that `--resume` goes on with; recording into the path works afterwards.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"
#include "tests/common/cli_run.h"
#include "tests/store/run_store_cli.h"

namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;

constexpr int kMoments = 60;
constexpr int kStepMs = 35;  // kill moments 0, 35, ..., 2065 ms after the process starts
// A model small enough that a step takes a few milliseconds; 200 steps outlast every moment.
const std::string kModel =
    " --vocab-size 64 --n-embd 32 --block-size 32 --threads 1 --log-every 1000 --checkpoint-every 10";

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct Trial {
  std::string store;    // the path the killed recording wrote
  std::string outcome;  // "nothing", "stub: REASON", "store", or what went wrong
  std::string detail;   // the commands' output when something went wrong
  int64_t last = -1;    // a store's last recorded step
};

// Runs work(i) for i in [0, n) on this thread and one more.
template <class F>
void two_at_a_time(int n, F work) {
  std::atomic<int> next{0};
  auto loop = [&] {
    for (int i; (i = next++) < n;) work(i);
  };
  std::thread other(loop);
  loop();
  other.join();
}

void kill_at(const std::string& s, const std::string& data, int ms) {
  const pid_t pid = rwd::testing::spawn_shell(std::string(REWIND_BIN) + " train --data " + data + " --record " + s +
                                             " --steps 200" + kModel + " >/dev/null 2>&1");
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

// What the kill left (`rewind store verify` in this process: one thread at a time).
void classify(Trial& t) {
  if (!exists(t.store)) {
    t.outcome = "nothing";
  } else if (const std::optional<std::string> why = rwd::store::Store::stub_reason(t.store)) {
    t.outcome = "stub: " + *why;
  } else if (rwd::store::test::run_store_cli({"store", "verify", t.store}, &t.detail) != 0) {
    t.outcome = "a store that does not verify";
  } else {
    t.outcome = "store";
    t.detail.clear();
    rwd::store::Store st = rwd::store::Store::open(t.store, rwd::store::Mode::kReadOnly);
    if (auto range = st.step_range(st.runs().back().id)) t.last = range->second;
  }
}

// Recording into the path afterwards: --record where nothing or a stub is (which it says it
// replaces); an existing store is never overwritten, and --resume goes on with it.
void record_again(Trial& t, const std::string& data) {
  const std::string record = "train --data " + data + " --record " + t.store + " --steps 3" + kModel;
  if (t.outcome == "nothing") {
    const Cmd r = rewind_cmd(record);
    if (r.code != 0) t = {t.store, "--record into the empty path failed", r.out};
  } else if (t.outcome.rfind("stub: ", 0) == 0) {
    const Cmd r = rewind_cmd(record);
    if (r.code != 0 || r.out.find("is " + t.outcome.substr(6) + "; nothing is stored in it, so it is replaced") ==
                           std::string::npos)
      t = {t.store, "--record did not replace the stub", r.out};
  } else if (t.outcome == "store") {
    const Cmd refuse = rewind_cmd(record);
    const Cmd resume = rewind_cmd("train --resume " + t.store + " --steps " + std::to_string(t.last + 3) +
                                  " --log-every 1000");
    if (refuse.code != 3 || refuse.out.find("already exists; refusing to overwrite it") == std::string::npos)
      t = {t.store, "--record into a store was not refused", refuse.out};
    else if (resume.code != 0)
      t = {t.store, "--resume failed", resume.out};
  }
}

TEST(RecordKillTrials, EveryKillLeavesNothingAStubOrAStoreThatVerifies) {
  const std::string dir = rwd::testing::temp_dir("recordkill");
  const std::string data = dir + "/train.bin";
  ASSERT_EQ(rewind_cmd("data synth --tokens 100000 --vocab 64 -o " + data).code, 0);
  std::vector<Trial> trials(kMoments);
  for (int i = 0; i < kMoments; ++i) {
    const std::string d = dir + "/m" + std::to_string(i);
    ASSERT_EQ(rwd::testing::run_shell("mkdir -p " + d).code, 0);
    trials[static_cast<size_t>(i)].store = d + "/run.db";
  }
  // Two kills at a time, each in a folder of its own; then what each left, and recording again.
  two_at_a_time(kMoments, [&](int i) { kill_at(trials[static_cast<size_t>(i)].store, data, i * kStepMs); });
  for (Trial& t : trials) classify(t);
  std::map<std::string, int> counts;
  for (const Trial& t : trials) ++counts[t.outcome];
  two_at_a_time(kMoments, [&](int i) { record_again(trials[static_cast<size_t>(i)], data); });
  for (int i = 0; i < kMoments; ++i) {
    Trial& t = trials[static_cast<size_t>(i)];
    const bool ok = t.outcome == "nothing" || t.outcome == "store" || t.outcome.rfind("stub: ", 0) == 0;
    EXPECT_TRUE(ok) << "killed at " << i * kStepMs << " ms: " << t.outcome << "\n" << t.detail;
    std::string out;
    if (ok) EXPECT_EQ(rwd::store::test::run_store_cli({"store", "verify", t.store}, &out), 0) << t.outcome << "\n" << out;
  }
  for (const auto& [outcome, n] : counts) std::printf("%3d kills left %s\n", n, outcome.c_str());
  rwd::testing::remove_tree(dir);
}

}  // namespace
