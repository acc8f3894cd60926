// The store's side of a recording that can no longer write: why a write failed (disk full,
// read-only, file deleted) survives the background writer, a deleted file is noticed before a
// commit, and WAL checkpoints run on the writer's schedule when auto-checkpoints are off.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "store/store.h"
#include "store/store_worker.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using test::file_size;

TEST(WriteFailure, ClassifiesSqliteAndSystemCodes) {
  EXPECT_EQ(write_failure(SQLITE_FULL), WriteFailure::kDiskFull);
  EXPECT_EQ(write_failure(SQLITE_READONLY), WriteFailure::kReadOnly);
  EXPECT_EQ(write_failure(SQLITE_READONLY_DBMOVED), WriteFailure::kMoved);
  EXPECT_EQ(write_failure(SQLITE_IOERR_WRITE), WriteFailure::kOther);
  EXPECT_EQ(write_failure(0), WriteFailure::kOther);
}

TEST(WriteFailure, DeletedFileIsNoticedBeforeCommit) {
  test::TempDir dir;
  const std::string path = dir.file("s.db");
  Store s = Store::create(path);
  const int64_t run = s.add_run("{}", "", "{}");
  EXPECT_NO_THROW(s.check_in_place());
  ASSERT_EQ(::unlink(path.c_str()), 0);
  // SQLite itself goes on writing into the unlinked file without an error.
  StepRecord r;
  r.run = run;
  r.batch_hash = "0";
  EXPECT_NO_THROW(s.put_step(r));
  try {
    s.check_in_place();
    FAIL() << "a deleted store was not noticed";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
    EXPECT_EQ(write_failure(e.lib_code()), WriteFailure::kMoved);
    EXPECT_NE(std::string(e.what()).find("deleted or moved"), std::string::npos) << e.what();
  }
}

TEST(WriteFailure, WorkerKeepsTheFailedJobsCause) {
  test::TempDir dir;
  const std::string path = dir.file("s.db");
  Store::create(path);
  StoreWorker w(path, StoreOptions{}, 4, "step writer");
  w.push([](Store&) { throw StoreError(ExitCode::kData, "no room", SQLITE_FULL); });
  try {
    w.flush();
    FAIL() << "the job's failure was not rethrown";
  } catch (const StoreError& e) {
    EXPECT_EQ(write_failure(e.lib_code()), WriteFailure::kDiskFull);
    EXPECT_EQ(std::string(e.what()), "step writer failed: no room");
  }
}

TEST(WriteFailure, ReadOnlyFileIsRefusedAtOpen) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes read-only files (record_failure_test mounts one)";
  test::TempDir dir;
  const std::string path = dir.file("s.db");
  Store::create(path);
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  try {
    Store::open(path, Mode::kReadWrite);
    FAIL() << "opened a read-only file for writing";
  } catch (const StoreError& e) {
    EXPECT_EQ(write_failure(e.lib_code()), WriteFailure::kReadOnly);
  }
  EXPECT_NO_THROW(Store::open(path, Mode::kReadOnly));
}

TEST(WalCheckpoint, OffMeansTheWriterMovesTheWalIntoTheFile) {
  test::TempDir dir;
  const std::string path = dir.file("s.db");
  StoreOptions opt;
  opt.wal_autocheckpoint = 0;
  Store s = Store::create(path, opt);
  s.checkpoint_wal();
  const int64_t before = file_size(path);
  // 40 MB of incompressible blobs: far beyond SQLite's default auto-checkpoint (1000 pages).
  for (int i = 0; i < 10; ++i) {
    const std::vector<uint8_t> b = test::random_bytes(i, 4 << 20);
    s.put_blob(b.data(), b.size());
  }
  EXPECT_EQ(file_size(path), before) << "a commit checkpointed the WAL";
  EXPECT_GT(file_size(path + "-wal"), 40 << 20);
  s.checkpoint_wal();
  EXPECT_GT(file_size(path), before + (40 << 20));
  Store ro = Store::open(path, Mode::kReadOnly);
  EXPECT_TRUE(ro.verify().empty());
}

// A recording's two writers: the checkpoint writer's blobs and a step writer that commits all
// the time. TRUNCATE waits for the other's transactions and empties the WAL while it goes on
// committing (PASSIVE never can: a recording's WAL grew by every checkpoint written).
TEST(WalCheckpoint, TruncateEmptiesTheWalWhileAnotherWriterCommits) {
  test::TempDir dir;
  const std::string path = dir.file("s.db");
  StoreOptions opt;
  opt.wal_autocheckpoint = 0;
  Store s = Store::create(path, opt);
  std::atomic<bool> stop{false};
  std::atomic<int> commits{0};
  std::thread steps([&] {
    Store t = Store::open(path, Mode::kReadWrite, opt);
    for (uint64_t i = 0; !stop; ++i) {
      const std::vector<uint8_t> b = test::random_bytes(1000000 + i, 2000);
      t.put_blob(b.data(), b.size());
      ++commits;
    }
  });
  for (int i = 0; i < 10; ++i) {
    const std::vector<uint8_t> b = test::random_bytes(i, 4 << 20);
    s.put_blob(b.data(), b.size());
  }
  while (commits < 20) std::this_thread::yield();
  const int before = commits;
  s.checkpoint_wal(/*truncate=*/true);
  const int64_t wal = file_size(path + "-wal");
  stop = true;
  steps.join();
  EXPECT_LT(wal, 4 << 20) << "the WAL was not emptied";
  EXPECT_GT(file_size(path), 40 << 20);
  EXPECT_GT(commits, before) << "the other writer was stopped for good";
  Store ro = Store::open(path, Mode::kReadOnly);
  EXPECT_TRUE(ro.verify().empty());
}

TEST(ShapeNumel, OverflowIsADataError) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({3, 4}), 12);
  EXPECT_THROW(shape_numel({int64_t(1) << 40, int64_t(1) << 40}), StoreError);
  // Fits int64 as a count but not as bytes of 8-byte elements.
  EXPECT_THROW(shape_numel({int64_t(1) << 61}), StoreError);
}

}  // namespace
}  // namespace rwd::store
