// Reader pins: a running reader's pin keeps its checkpoints through a thin, a
// dead process's pin keeps nothing (exited, killed and not yet reaped), pinning never writes
// the store file, and a reader registering waits for a thin in progress.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "common/proc_stat.h"
#include "store/reader_pins.h"
#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using Steps = std::vector<int64_t>;

// A child process that pins `from` in run 1 of `path` as "bisect". live: it then waits to be
// killed; else it exits at once without removing its pin, as a killed reader leaves it.
pid_t pinning_child(const std::string& path, int64_t from, bool live) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    new ReaderPin(path, 1, {from}, "bisect");  // never destroyed: the process ends instead
    const char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    while (live) ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  const bool ok = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  return ok ? pid : -1;
}

class ReaderPins : public ::testing::Test {
 protected:
  // Run 1 with a checkpoint every 10 steps, 0..50.
  void SetUp() override {
    path_ = dir_.file("pins.db");
    Store s = Store::create(path_);
    s.add_run("{}", "default", "{}");
    for (int64_t step = 0; step <= 50; step += 10) {
      const std::vector<uint8_t> w = test::random_bytes(static_cast<uint64_t>(step), 5000);
      s.put_checkpoint_tensor(1, step, "w", Dtype::kU8, {5000}, w.data(), w.size());
    }
  }
  Steps checkpoints() { return Store::open(path_, Mode::kReadOnly).checkpoint_steps(1); }
  size_t pin_files() { return test::file_size(readers_dir(path_)) < 0 ? 0 : count_entries(readers_dir(path_)); }
  static size_t count_entries(const std::string& dir) {
    size_t n = 0;
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    while (d && ::readdir(d.get())) ++n;
    return n >= 2 ? n - 2 : 0;  // less . and ..
  }
  test::TempDir dir_;
  std::string path_;
};

TEST_F(ReaderPins, ALivePinKeepsItsCheckpointsADeadOneNothingAndTheStoreFileIsUntouched) {
  const std::vector<uint8_t> before = test::read_file(path_), wal_before = test::read_file(path_ + "-wal");
  ASSERT_FALSE(before.empty());
  const pid_t live = pinning_child(path_, 25, true);   // needs the checkpoint at 20
  const pid_t dead = pinning_child(path_, 45, false);  // would need 40, but has exited
  ASSERT_GT(live, 0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  EXPECT_EQ(pin_files(), 2u);
  // Pinning wrote nothing into the store: not a byte of its file or of its WAL.
  EXPECT_EQ(test::read_file(path_), before);
  EXPECT_EQ(test::read_file(path_ + "-wal"), wal_before);

  const std::string why = "in use by bisect (process " + std::to_string(live) + ")";
  {
    Store s = Store::open(path_, Mode::kReadWrite);
    EXPECT_EQ(s.plan_thin(1, {{1, 0}, {}, false}).in_use, (std::vector<std::pair<int64_t, std::string>>{{20, why}}));
    // Even --force leaves a running reader its checkpoint.
    const ThinPlan done = s.thin(1, {{1, 0}, {}, true});
    EXPECT_EQ(done.remove, (Steps{10, 30, 40}));
    EXPECT_EQ(done.in_use, (std::vector<std::pair<int64_t, std::string>>{{20, why}}));
    EXPECT_TRUE(done.pinned.empty());
  }
  EXPECT_EQ(checkpoints(), (Steps{0, 20, 50}));
  EXPECT_EQ(pin_files(), 1u);  // the thin removed the dead process's pin

  // Killed and not yet reaped (a zombie): its pin keeps nothing either.
  ASSERT_EQ(::kill(live, SIGKILL), 0);
  for (int i = 0; i < 500; ++i) {
    const std::optional<ProcStat> st = read_proc_stat(std::to_string(live));
    if (!st || st->state == 'Z') break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    Store s = Store::open(path_, Mode::kReadWrite);
    const ThinPlan done = s.thin(1, {{1, 0}, {}, false});
    EXPECT_EQ(done.remove, (Steps{20}));
    EXPECT_TRUE(done.in_use.empty());
    EXPECT_TRUE(s.verify().empty());
  }
  ASSERT_EQ(::waitpid(live, nullptr, 0), live);
  EXPECT_EQ(checkpoints(), (Steps{0, 50}));
  EXPECT_EQ(test::file_size(readers_dir(path_)), -1);  // no pin left: the directory went too
}

TEST_F(ReaderPins, APinLastsAsLongAsItsReader) {
  const std::string me = " (process " + std::to_string(::getpid()) + ")";
  {
    const ReaderPin every(path_, 0, {});  // every checkpoint of every run; named after this program
    ASSERT_TRUE(every.held());
    EXPECT_GT(test::file_size(every.file()), 0);
    const auto pins = reader_pins(path_, 1, {0, 10, 20, 30, 40, 50});
    ASSERT_EQ(pins.size(), 6u);
    EXPECT_EQ(pins.at(30), "in use by store_test" + me);
    EXPECT_TRUE(reader_pins(path_, 1, {}).empty());
  }
  EXPECT_EQ(test::file_size(readers_dir(path_)), -1);  // the last pin's end removes the directory
  {
    const ReaderPin a(path_, 2, {35}, "replay"), b(path_, 1, {5, 39, 50}, "bisect");
    const auto pins = reader_pins(path_, 1, {0, 10, 20, 30, 40, 50});
    EXPECT_EQ(pins, (std::map<int64_t, std::string>{{0, "in use by bisect" + me}, {30, "in use by bisect" + me},
                                                   {50, "in use by bisect" + me}}));
    EXPECT_EQ(reader_pins(path_, 2, {0, 10, 20, 30, 40, 50}), (std::map<int64_t, std::string>{{30, "in use by replay" + me}}));
    EXPECT_EQ(pin_files(), 2u);
  }
  EXPECT_EQ(pin_files(), 0u);
  // Where no pin can be written, the reader reads unpinned: nothing fails.
  const ReaderPin nowhere(dir_.file("missing/dir/x.db"), 1, {3});
  EXPECT_FALSE(nowhere.held());
}

TEST_F(ReaderPins, AReaderRegisteringWaitsForAThinInProgress) {
  std::atomic<bool> pinned{false};
  std::unique_ptr<ReaderPin> pin;
  std::thread reader;
  {
    const ReadersLock thinning(path_);
    reader = std::thread([&] {
      pin = std::make_unique<ReaderPin>(path_, 1, Steps{25}, "replay");
      pinned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(pinned);  // blocked until the thin has committed
  }
  reader.join();
  EXPECT_TRUE(pinned);
  ASSERT_TRUE(pin->held());
  Store s = Store::open(path_, Mode::kReadWrite);
  EXPECT_EQ(s.thin(1, {{1, 0}, {}, false}).remove, (Steps{10, 30, 40}));
}

}  // namespace
}  // namespace rwd::store
