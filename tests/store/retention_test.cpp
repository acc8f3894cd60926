// Checkpoint retention in the store: the keep-last/keep-every rule, Store::thin
// (checkpoints and the blobs only they use go, shared blobs and every step row stay, probe
// windows pin), giving pages back (incremental vacuum, or a VACUUM on an auto_vacuum=NONE
// store), the writer lock, and a SIGKILL during a thin leaving a store that verifies.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "store/store.h"
#include "store/writer_lock.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using Steps = std::vector<int64_t>;

Steps every(int64_t k, int64_t last) {
  Steps s;
  for (int64_t i = 0; i <= last; i += k) s.push_back(i);
  return s;
}

TEST(RetentionRule, KeepsTheLastKAndTheFirstOfEachSpan) {
  EXPECT_EQ(retained_steps(every(5, 60), {3, 20}), (Steps{0, 20, 40, 50, 55, 60}));
  EXPECT_EQ(retained_steps(every(5, 60), {3, 0}), (Steps{0, 50, 55, 60}));   // the first always
  EXPECT_EQ(retained_steps(every(5, 60), {0, 25}), (Steps{0, 25, 50, 60}));  // the last always
  EXPECT_EQ(retained_steps(every(5, 60), {100, 0}), every(5, 60));
  EXPECT_EQ(retained_steps(every(5, 60), {}), every(5, 60));  // no rule: everything
  // Checkpoints taken late (the writer was busy): each span keeps its first one.
  EXPECT_EQ(retained_steps({0, 7, 13, 21, 26, 33, 41, 47}, {1, 20}), (Steps{0, 21, 41, 47}));
  // An import's first checkpoint is not at step 0.
  EXPECT_EQ(retained_steps({400, 450, 500, 550}, {1, 1000}), (Steps{400, 550}));
}

// What lets a recording apply the rule after every checkpoint: dropping as checkpoints arrive
// leaves what the rule keeps of all of them at once.
TEST(RetentionRule, ApplyingAfterEachCheckpointKeepsWhatApplyingOnceKeeps) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const Retention rule{std::uniform_int_distribution<int64_t>(0, 5)(rng),
                         std::uniform_int_distribution<int64_t>(0, 60)(rng)};
    Steps all, kept;
    int64_t step = std::uniform_int_distribution<int64_t>(0, 30)(rng);
    for (int i = 0; i < 40; ++i, step += std::uniform_int_distribution<int64_t>(1, 17)(rng)) {
      all.push_back(step);
      kept.push_back(step);
      kept = retained_steps(kept, rule);
    }
    EXPECT_EQ(kept, retained_steps(all, rule)) << rule.text();
  }
}

// A store with one run: steps 0..n-1 (metrics each), a checkpoint every `k` steps of two
// tensors ("w": bytes of its own; "rng": the same bytes in every checkpoint, one shared blob),
// and a captured tensor at step 1.
class Thin : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_.file("thin.db"); }
  void make(int64_t n, int64_t k, size_t bytes = 20000) {
    Store s = Store::create(path_);
    run_ = s.add_run("{}", "default", "{}");
    const std::vector<uint8_t> rng = test::random_bytes(99, 64);
    for (int64_t step = 0; step <= n; ++step) {
      if (step % k == 0) {
        const std::vector<uint8_t> w = test::random_bytes(static_cast<uint64_t>(step), bytes);
        s.put_checkpoint_tensor(run_, step, "w", Dtype::kU8, {int64_t(bytes)}, w.data(), w.size());
        s.put_checkpoint_tensor(run_, step, "rng", Dtype::kU8, {64}, rng.data(), rng.size());
      }
      if (step == n) break;
      StepRecord r;
      r.run = run_;
      r.step = step;
      r.batch_hash = std::to_string(step);
      s.put_step(r);
      s.put_metric(run_, step, "loss", 1.0 / double(step + 1));
    }
    const std::vector<uint8_t> o = test::random_bytes(1234, 300);
    s.put_tensor({run_, 1, 0, 0, "o"}, Dtype::kU8, {300}, o.data(), o.size());
  }
  Store open() { return Store::open(path_, Mode::kReadWrite); }

  test::TempDir dir_;
  std::string path_;
  int64_t run_ = 0;
};

TEST_F(Thin, RemovesTheCheckpointsAndOnlyTheBlobsNothingElseUses) {
  make(60, 5);
  Store s = open();
  const StoreInfo before = s.info();
  const ThinPlan plan = s.plan_thin(run_, {{3, 20}, {}, false});
  EXPECT_EQ(plan.remove, (Steps{5, 10, 15, 25, 30, 35, 45}));
  EXPECT_EQ(plan.n_blobs, 7);  // each one's "w"; the shared "rng" stays for the kept ones
  EXPECT_EQ(s.checkpoint_steps(run_).size(), 13u);  // planning deletes nothing
  const ThinPlan done = s.thin(run_, {{3, 20}, {}, false});
  EXPECT_EQ(done.remove, plan.remove);
  EXPECT_EQ(done.stored_bytes, plan.stored_bytes);
  EXPECT_EQ(s.checkpoint_steps(run_), (Steps{0, 20, 40, 50, 55, 60}));
  const StoreInfo after = s.info();
  EXPECT_EQ(after.n_blobs, before.n_blobs - 7);
  EXPECT_EQ(after.stored_bytes, before.stored_bytes - plan.stored_bytes);
  EXPECT_EQ(s.steps(run_, 0, 100).size(), 60u);
  EXPECT_EQ(s.metrics(run_, 0, 100).size(), 60u);
  EXPECT_TRUE(s.get_tensor({run_, 1, 0, 0, "o"}).has_value());
  EXPECT_EQ(s.get_checkpoint_tensor(run_, 40, "rng")->bytes, test::random_bytes(99, 64));
  EXPECT_TRUE(s.verify().empty());
  // Again: nothing more to remove.
  EXPECT_TRUE(s.thin(run_, {{3, 20}, {}, false}).remove.empty());
}

TEST_F(Thin, ProbeWindowsAndKeepStepsPinTheCheckpointAtOrBeforeTheirStart) {
  make(60, 5);
  Store s = open();
  ProbeRecord p;
  p.key = "k1";
  p.job = "job1";
  p.plan = "default";
  p.plan_hash = "0";
  p.window = "27:39";  // needs the checkpoint at 25
  p.verdict = "fail";
  p.metrics = "{}";
  s.put_probe(p);
  s.put_kv(run_, "bisect/job/job1", "run 1 window 27:39");
  // A bisect log entry of another job: its window 12:20 needs the checkpoint at 10.
  s.put_kv(run_, "bisect/log/job2", R"([{"index":0,"window":"12:20"},{"index":1}])");
  s.put_kv(run_, "bisect/log/bad", "not json");
  const ThinPlan plan = s.plan_thin(run_, {{1, 0}, {33}, false});
  EXPECT_EQ(plan.remove, (Steps{5, 15, 20, 35, 40, 45, 50, 55}));
  ASSERT_EQ(plan.pinned.size(), 3u);
  EXPECT_EQ(plan.pinned[0].first, 10);
  EXPECT_EQ(plan.pinned[0].second, "bisect probe window 12:20 (job job2)");
  EXPECT_EQ(plan.pinned[1].first, 25);
  EXPECT_EQ(plan.pinned[1].second, "bisect probe window 27:39 (job job1)");
  EXPECT_EQ(plan.pinned[2], (std::pair<int64_t, std::string>{30, "--keep-steps 33"}));
  // A probe whose job is another run's pins nothing here; --force leaves the user's pins only.
  p.key = "k2";
  p.job = "job3";
  p.window = "42:44";
  s.put_probe(p);
  s.put_kv(run_ + 1, "bisect/job/job3", "run 2 window 42:44");
  EXPECT_EQ(s.plan_thin(run_, {{1, 0}, {33}, false}).remove, plan.remove);
  EXPECT_EQ(s.plan_thin(run_, {{1, 0}, {33}, true}).remove, (Steps{5, 10, 15, 20, 25, 35, 40, 45, 50, 55}));
  s.thin(run_, {{1, 0}, {33}, false});
  EXPECT_EQ(s.checkpoint_steps(run_), (Steps{0, 10, 25, 30, 60}));
  EXPECT_TRUE(s.verify().empty());
}

TEST_F(Thin, FreedPagesGoBackToTheFileSystem) {
  make(40, 5, 400000);
  Store s = open();
  EXPECT_TRUE(s.incremental_vacuum());  // every new store
  s.checkpoint_wal();
  const int64_t before = s.file_bytes();
  const ThinPlan plan = s.thin(run_, {{1, 0}, {}, false});
  ASSERT_EQ(plan.remove.size(), 7u);
  EXPECT_GT(s.free_bytes(), plan.stored_bytes * 9 / 10);  // freed, reused by later writes
  EXPECT_FALSE(s.reclaim_space());  // incremental: no VACUUM
  EXPECT_EQ(s.free_bytes(), 0);
  EXPECT_LT(s.file_bytes(), before - plan.stored_bytes * 9 / 10);
  EXPECT_TRUE(s.verify().empty());
}

TEST_F(Thin, AStoreWithoutAutoVacuumIsVacuumedOnceAndSwitched) {
  make(40, 5, 400000);
  {
    Db db(path_, SQLITE_OPEN_READWRITE);  // as a store made without incremental vacuum
    db.exec("PRAGMA auto_vacuum=NONE; VACUUM", "back to auto_vacuum NONE");
  }
  Store s = open();
  ASSERT_FALSE(s.incremental_vacuum());
  s.checkpoint_wal();
  const int64_t before = s.file_bytes();
  const ThinPlan plan = s.thin(run_, {{1, 0}, {}, false});
  EXPECT_TRUE(s.reclaim_space());
  EXPECT_TRUE(s.incremental_vacuum());
  EXPECT_LT(s.file_bytes(), before - plan.stored_bytes * 9 / 10);
  EXPECT_TRUE(s.verify().empty());
}

TEST(WriterLock, ASecondWriterIsRefusedUntilTheFirstLetsGo) {
  test::TempDir dir;
  const std::string store = dir.file("a.db");
  {
    WriterLock first(store, "a recording (rewind train)");
    try {
      WriterLock second(store, "store thin");
      FAIL() << "a second writer took the lock";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), ExitCode::kData);
      EXPECT_EQ(std::string(e.what()), "store " + store + ": a recording (rewind train), pid " +
                                           std::to_string(getpid()) +
                                           " is writing it; try again once that has finished");
    }
  }
  EXPECT_EQ(test::file_size(WriterLock::lock_path(store)), -1);  // removed when let go
  WriterLock again(store, "store thin");
}

TEST(WriterLock, ALockFileLeftByAKilledWriterHoldsNothing) {
  test::TempDir dir;
  const std::string store = dir.file("a.db");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    WriterLock held(store, "child");
    pause();
    _exit(0);
  }
  while (test::file_size(WriterLock::lock_path(store)) <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_THROW(WriterLock(store, "parent"), StoreError);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_GT(test::file_size(WriterLock::lock_path(store)), 0);  // still there, unlocked
  WriterLock mine(store, "parent");
}

// A child thins (and gives the pages back) until the parent SIGKILLs it at a random moment:
// the store verifies and holds either every checkpoint or the thinned set, nothing between.
void kill_during_thin(bool without_auto_vacuum) {
  test::TempDir dir;
  const std::string master = dir.file("master.db"), path = dir.file("thin.db");
  {
    Store s = Store::create(master);
    const int64_t run = s.add_run("{}", "default", "{}");
    for (int64_t step = 0; step <= 200; step += 5) {
      const std::vector<uint8_t> w = test::random_bytes(static_cast<uint64_t>(step), 300000);
      s.put_checkpoint_tensor(run, step, "w", Dtype::kU8, {300000}, w.data(), w.size());
    }
    s.checkpoint_wal();
  }
  if (without_auto_vacuum) {
    Db db(master, SQLITE_OPEN_READWRITE);
    db.exec("PRAGMA auto_vacuum=NONE; VACUUM", "back to auto_vacuum NONE");
  }
  const Steps all = every(5, 200), thinned = retained_steps(all, {2, 50});
  auto fresh_copy = [&] {
    for (const char* side : {"", "-wal", "-shm"}) ::unlink((path + side).c_str());
    test::write_file(path, test::read_file(master));
  };
  // How long the whole thin takes here, uninterrupted: the kills land anywhere in it.
  fresh_copy();
  const auto t0 = std::chrono::steady_clock::now();
  double thin_ms = 0;
  {
    Store s = Store::open(path, Mode::kReadWrite);
    s.thin(1, {{2, 50}, {}, false});
    thin_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    s.reclaim_space();
  }
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("uninterrupted: the deletes commit after %.1f ms, the space is back after %.1f ms\n", thin_ms, total_ms);
  std::mt19937 rng(std::random_device{}());
  int outcomes[2] = {0, 0};
  for (int rep = 0; rep < 8; ++rep) {
    fresh_copy();
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        Store s = Store::open(path, Mode::kReadWrite);
        s.thin(1, {{2, 50}, {}, false});
        s.reclaim_space();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::uniform_int_distribution<int>(0, static_cast<int>(total_ms * 1000 * 1.2) + 1000)(rng)));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "the child failed";
    Store ro = Store::open(path, Mode::kReadOnly);
    EXPECT_TRUE(ro.verify().empty());
    const Steps got = ro.checkpoint_steps(1);
    EXPECT_TRUE(got == all || got == thinned) << got.size() << " checkpoints";
    ++outcomes[got == thinned];
  }
  std::printf("killed %d times before the thin committed, %d after\n", outcomes[0], outcomes[1]);
}

TEST(ThinCrash, SigkillDuringThinLeavesAStoreThatVerifies) { kill_during_thin(false); }
TEST(ThinCrash, SigkillDuringTheVacuumOfAnOldStoreLeavesAStoreThatVerifies) { kill_during_thin(true); }

}  // namespace
}  // namespace rwd::store
