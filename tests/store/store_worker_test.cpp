// StoreWorker: jobs run in push order on the worker's own connection, push waits for room,
// the first failure drops later jobs and is reported by name, the destructor drains.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "store/store.h"
#include "store/store_worker.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using test::TempDir;

StepRecord step_row(int64_t run, int64_t step) {
  StepRecord r;
  r.run = run;
  r.step = step;
  r.batch_hash = "00";
  return r;
}

TEST(StoreWorker, RunsJobsInOrderAndTheirRowsAreVisibleAfterFlush) {
  TempDir dir;
  const std::string path = dir.file("w.db");
  Store main = Store::create(path);
  const int64_t run = main.add_run("{}", "", "{}");
  std::vector<int> order;
  {
    StoreWorker w(path, {}, 4, "test writer");
    for (int i = 0; i < 20; ++i) {
      const uint64_t ticket = w.push([&order, i, run](Store& s) {
        order.push_back(i);
        s.put_step(step_row(run, i));
      });
      EXPECT_EQ(ticket, static_cast<uint64_t>(i + 1));
    }
    w.flush();
    EXPECT_EQ(main.steps(run, 0, 100).size(), 20u);  // committed and visible to another connection
    w.push([run](Store& s) { s.put_step(step_row(run, 20)); });
  }  // the destructor runs the last job
  EXPECT_EQ(main.steps(run, 0, 100).size(), 21u);
  std::vector<int> want(20);
  for (int i = 0; i < 20; ++i) want[i] = i;
  EXPECT_EQ(order, want);
}

TEST(StoreWorker, PushWaitsWhileTheQueueIsFull) {
  TempDir dir;
  const std::string path = dir.file("w.db");
  Store::create(path);
  StoreWorker w(path, {}, 1, "test writer");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> started{false};
  w.push([&](Store&) {
    started = true;
    gate.wait();
  });
  while (!started) std::this_thread::yield();
  w.push([](Store&) {});  // waits in the queue: the queue is now full
  EXPECT_FALSE(w.has_room());
  std::atomic<bool> third_queued{false};
  std::thread t([&] {
    double waited = 0;
    w.push([](Store&) {}, &waited);
    third_queued = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(third_queued);
  release.set_value();
  t.join();
  EXPECT_TRUE(third_queued);
  w.flush();
  EXPECT_TRUE(w.has_room());
  EXPECT_EQ(w.pushed(), 3u);
}

TEST(StoreWorker, FirstFailureDropsLaterJobsAndIsReportedByName) {
  TempDir dir;
  const std::string path = dir.file("w.db");
  Store main = Store::create(path);
  const int64_t run = main.add_run("{}", "", "{}");
  StoreWorker w(path, {}, 8, "step writer");
  w.push([run](Store& s) { s.put_step(step_row(run, 1)); });
  w.push([run](Store& s) { s.put_step(step_row(run, 1)); });  // a duplicate step: refused
  w.push([run](Store& s) { s.put_step(step_row(run, 2)); });  // dropped
  try {
    w.flush();
    FAIL() << "flush did not report the failure";
  } catch (const StoreError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("step writer failed: ", 0), 0u) << e.what();
    EXPECT_EQ(e.code(), ExitCode::kData);
  }
  EXPECT_THROW(w.push([](Store&) {}), StoreError);
  const auto rows = main.steps(run, 0, 10);
  ASSERT_EQ(rows.size(), 1u);  // what was committed before the failure stays
  EXPECT_EQ(rows[0].step, 1);
}

}  // namespace
}  // namespace rwd::store
