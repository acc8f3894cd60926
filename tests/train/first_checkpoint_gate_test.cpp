// FirstCheckpointGate with the recorder's two writers (store::StoreWorker): steps queued after
// the first checkpoint are not in the store before it, steps queued before it are, and a
// checkpoint that fails or is dropped fails the steps behind it instead of leaving them
// without one.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "store/store.h"
#include "store/store_worker.h"
#include "tests/store/store_test_util.h"
#include "train/first_checkpoint_gate.h"

namespace rwd::train {
namespace {

using store::Store;
using store::StoreWorker;

store::StepRecord step_row(int64_t run, int64_t step) {
  store::StepRecord r;
  r.run = run;
  r.step = step;
  r.batch_hash = "00";
  return r;
}

// The recorder's order: steps before the checkpoint, the checkpoint (held until `release`),
// then steps behind it; each step job passes the gate first.
struct Writers {
  explicit Writers(const std::string& path)
      : steps(path, {}, 64, "step writer"), checkpoints(path, {}, 1, "checkpoint writer") {}
  void step(int64_t run, int64_t i) {
    steps.push([run, i, t = gate.ticket()](Store& s) {
      FirstCheckpointGate::pass(t);
      s.put_step(step_row(run, i));
    });
  }
  FirstCheckpointGate gate;
  StoreWorker steps;
  StoreWorker checkpoints;
};

TEST(FirstCheckpointGate, StepsAfterTheFirstCheckpointWaitForItsCommit) {
  store::test::TempDir dir;
  const std::string path = dir.file("g.db");
  Store main = Store::create(path);
  const int64_t run = main.add_run("{}", "", "{}");
  std::promise<void> release;
  std::shared_future<void> held = release.get_future().share();
  Writers w(path);
  w.step(run, 0);  // before any checkpoint: never waits
  w.checkpoints.push([run, held, written = w.gate.arm()](Store& s) {
    held.wait();
    const float x = 1.0f;
    s.put_checkpoint_tensor(run, 1, "x", store::Dtype::kF32, {1}, &x, sizeof x);
    written->set_value();
  });
  EXPECT_EQ(w.gate.arm(), nullptr);  // only the first checkpoint gates
  for (int64_t i = 1; i < 6; ++i) w.step(run, i);
  w.steps.wait_done(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(main.steps(run, 0, 100).size(), 1u) << "steps behind the first checkpoint committed before it";
  EXPECT_TRUE(main.checkpoint_steps(run).empty());
  release.set_value();
  w.steps.flush();
  w.checkpoints.flush();
  EXPECT_EQ(main.steps(run, 0, 100).size(), 6u);
  EXPECT_EQ(main.checkpoint_steps(run), std::vector<int64_t>{1});
}

TEST(FirstCheckpointGate, AFailedOrDroppedFirstCheckpointFailsTheStepsBehindIt) {
  for (const bool dropped : {false, true}) {
    store::test::TempDir dir;
    const std::string path = dir.file("g.db");
    Store main = Store::create(path);
    const int64_t run = main.add_run("{}", "", "{}");
    Writers w(path);
    if (dropped) {  // an earlier job failed: the checkpoint job is dropped with its promise
      std::promise<void> go;
      std::shared_future<void> held = go.get_future().share();
      w.checkpoints.push([held](Store&) {
        held.wait();  // fails only once the checkpoint job is queued behind it
        throw store::StoreError(ExitCode::kData, "an earlier write failed");
      });
      w.checkpoints.push([written = w.gate.arm()](Store&) { written->set_value(); });
      go.set_value();
    } else {
      w.checkpoints.push([written = w.gate.arm()](Store&) {
        written->set_exception(std::make_exception_ptr(store::StoreError(ExitCode::kData, "disk full")));
        throw store::StoreError(ExitCode::kData, "disk full");
      });
    }
    w.step(run, 0);
    try {
      w.steps.flush();
      ADD_FAILURE() << "a step behind a checkpoint that was never written was committed";
    } catch (const store::StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("step writer failed"), std::string::npos) << e.what();
      const char* why = dropped ? "the first checkpoint was never written" : "disk full";
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_TRUE(main.steps(run, 0, 100).empty());
    EXPECT_THROW(w.checkpoints.flush(), store::StoreError);
  }
}

}  // namespace
}  // namespace rwd::train
