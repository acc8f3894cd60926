// Crash safety: a child process records steps (blobs + tensors + step row + metrics in one
// transaction each) until the parent SIGKILLs it at a random moment; the reopened store must
// verify and hold exactly the committed steps 0..n-1, each intact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using test::random_bytes;

constexpr int kBlobsPerStep = 3;

// Everything a step writes is a pure function of the step number, so the parent can check it.
size_t blob_size(int64_t step, int i) { return 500 + test::mix64(step * 16 + i) % 40000; }
std::vector<uint8_t> blob_bytes(int64_t step, int i) {
  return random_bytes(step * 16 + i, blob_size(step, i));
}
StepRecord expected_step(int64_t run, int64_t step) {
  StepRecord r;
  r.run = run;
  r.step = step;
  r.lr = 1e-3 * static_cast<double>(step + 1);
  r.loss_bits = static_cast<uint32_t>(test::mix64(step));
  r.grad_norm_bits = static_cast<uint32_t>(test::mix64(step) >> 32);
  r.batch_hash = std::to_string(step * 7);
  return r;
}

// The child's loop: never returns; exits via _exit so no gtest state is touched.
// wal_every > 0: the WAL is copied into the main file every wal_every steps by the writer
// (with options.wal_autocheckpoint 0, as the recorder does), so a kill can land in one.
// blobs_first: each step's blobs are written by put_blobs before its transaction, as the
// recorder's checkpoint writer does (with a small options.overlap_checkpoint_bytes, a helper
// connection checkpoints the WAL beside the inserts).
[[noreturn]] void record_forever(const std::string& path, int64_t run, const StoreOptions& options,
                                 int wal_every, bool blobs_first = false) {
  try {
    Store s = Store::open(path, Mode::kReadWrite, options);
    const auto range = s.step_range(run);
    for (int64_t step = range ? range->second + 1 : 0;; ++step) {
      if (blobs_first) {
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<BlobSource> blobs;
        for (int i = 0; i < kBlobsPerStep; ++i) bytes.push_back(blob_bytes(step, i));
        for (const auto& b : bytes) blobs.push_back({b.data(), b.size(), 1});
        s.put_blobs(blobs);
      }
      Transaction txn = s.begin_step();
      StepRecord r = expected_step(run, step);
      for (int i = 0; i < kBlobsPerStep; ++i) {
        const std::vector<uint8_t> b = blob_bytes(step, i);
        if (i == 0) {
          r.batch_ref = s.put_blob(b.data(), b.size());
        } else {
          s.put_tensor({run, step, i, -1, "act"}, Dtype::kU8, {int64_t(b.size())}, b.data(),
                       b.size());
        }
      }
      s.put_step(r);
      s.put_metric(run, step, "loss", static_cast<double>(step) * 0.5);
      s.put_metric(run, step, "gnorm", -static_cast<double>(step));
      txn.commit();
      if (wal_every > 0 && step % wal_every == 0) s.checkpoint_wal();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
  }
  _exit(1);
}

void check_intact(Store& s, int64_t run, int64_t n) {
  const std::vector<StepRecord> steps = s.steps(run, 0, INT64_MAX);
  ASSERT_EQ(static_cast<int64_t>(steps.size()), n);
  for (int64_t step = 0; step < n; ++step) {
    const StepRecord& got = steps[static_cast<size_t>(step)];
    const StepRecord want = expected_step(run, step);
    ASSERT_EQ(got.step, step) << "steps are not contiguous";
    EXPECT_EQ(got.lr, want.lr);
    EXPECT_EQ(got.loss_bits, want.loss_bits);
    EXPECT_EQ(got.grad_norm_bits, want.grad_norm_bits);
    EXPECT_EQ(got.batch_hash, want.batch_hash);
    ASSERT_TRUE(got.batch_ref.has_value());
    EXPECT_EQ(s.get_blob(*got.batch_ref), blob_bytes(step, 0));
    for (int i = 1; i < kBlobsPerStep; ++i) {
      std::optional<TensorRecord> t = s.get_tensor({run, step, i, -1, "act"});
      ASSERT_TRUE(t.has_value()) << "step " << step;
      EXPECT_EQ(t->bytes, blob_bytes(step, i));
    }
    const std::vector<MetricRow> m = s.metrics(run, step, step);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].key, "gnorm");
    EXPECT_EQ(m[1].value, static_cast<double>(step) * 0.5);
  }
  // No tensors or metrics from a step that did not commit.
  EXPECT_TRUE(s.tensors(run, n, INT64_MAX).empty());
  EXPECT_TRUE(s.metrics(run, n, INT64_MAX).empty());
}

void kill_while_recording(const StoreOptions& options, int wal_every, bool blobs_first = false) {
  test::TempDir dir;
  const std::string path = dir.file("crash.db");
  int64_t run;
  {
    Store s = Store::create(path);
    run = s.add_run("{}", "default", "{}");
  }  // no connection is open across fork()
  std::mt19937 rng(std::random_device{}());
  int64_t prev = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) record_forever(path, run, options, wal_every, blobs_first);
    const int ms = std::uniform_int_distribution<int>(50, 400)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with status " << status;

    // A read-only inspection right after the crash (what `rewind store verify` does).
    int64_t n;
    {
      Store ro = Store::open(path, Mode::kReadOnly);
      EXPECT_TRUE(ro.verify().empty());
      const auto range = ro.step_range(run);
      n = range ? range->second + 1 : 0;
      check_intact(ro, run, n);
    }
    Store rw = Store::open(path, Mode::kReadWrite);
    EXPECT_TRUE(rw.verify().empty());
    check_intact(rw, run, n);
    EXPECT_GE(n, prev);
    prev = n;
    std::printf("rep %d: killed after %d ms, %lld steps committed\n", rep, ms,
                static_cast<long long>(n));
  }
  EXPECT_GT(prev, 0) << "the child never committed a step";
}

TEST(CrashSafety, SigkillDuringRecordingLosesAtMostTheStepInFlight) {
  kill_while_recording(StoreOptions{}, 0);
}

// The recorder's setting: no auto-checkpoint in commits, WAL checkpoints on the writer's
// schedule (here every 5 steps, so kills land before, in and after them).
TEST(CrashSafety, SigkillWithWriterScheduledWalCheckpoints) {
  StoreOptions options;
  options.wal_autocheckpoint = 0;
  kill_while_recording(options, 5);
}

// The checkpoint writer's path: blobs by put_blobs first, with the WAL checkpointed on a helper
// connection beside nearly every step's inserts (each step writes 1.5-120 KB of blobs).
TEST(CrashSafety, SigkillWhileTheWalIsCheckpointedBesideTheInserts) {
  StoreOptions options;
  options.wal_autocheckpoint = 0;
  options.overlap_checkpoint_bytes = 8 << 10;
  options.zstd_workers = 2;
  kill_while_recording(options, 0, true);
}

}  // namespace
}  // namespace rwd::store
