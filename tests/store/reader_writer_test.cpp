// WAL concurrency: a second connection reads committed steps while a writer's step
// transaction is open, and sees the step once it commits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

StepRecord step_row(int64_t run, int64_t step, const std::string& batch) {
  StepRecord r;
  r.run = run;
  r.step = step;
  r.lr = 0.1;
  r.loss_bits = float_bits(static_cast<float>(step));
  r.batch_ref = batch;
  r.batch_hash = "h";
  return r;
}

TEST(ReaderWriter, ReaderSeesCommittedStepsWhileWriterIsMidStep) {
  test::TempDir dir;
  const std::string path = dir.file("rw.db");
  Store writer = Store::create(path);
  const int64_t run = writer.add_run("{}", "", "{}");
  for (int64_t step = 0; step < 5; ++step) {
    Transaction txn = writer.begin_step();
    const std::vector<uint8_t> b = test::random_bytes(step, 3000);
    writer.put_step(step_row(run, step, writer.put_blob(b.data(), b.size())));
    txn.commit();
  }
  Store reader = Store::open(path, Mode::kReadOnly);
  Transaction txn = writer.begin_step();
  const std::vector<uint8_t> b = test::random_bytes(5, 3000);
  const std::string h = writer.put_blob(b.data(), b.size());
  writer.put_step(step_row(run, 5, h));
  writer.put_metric(run, 5, "loss", 5.0);

  // The writer holds the write lock; the reader is not blocked and sees steps 0..4 only.
  EXPECT_EQ(reader.steps(run, 0, 100).size(), 5u);
  EXPECT_FALSE(reader.get_step(run, 5).has_value());
  EXPECT_FALSE(reader.has_blob(h));
  EXPECT_EQ(reader.get_blob(*reader.get_step(run, 4)->batch_ref), test::random_bytes(4, 3000));
  EXPECT_TRUE(reader.verify().empty());
  // The writer sees its own uncommitted step.
  EXPECT_TRUE(writer.get_step(run, 5).has_value());

  txn.commit();
  EXPECT_EQ(reader.steps(run, 0, 100).size(), 6u);
  EXPECT_EQ(reader.get_blob(h), b);
  EXPECT_EQ(reader.metrics(run, 5, 5).size(), 1u);
}

// Whether another process sees a lock on SQLite's lock bytes of `path` (PENDING_BYTE 0x40000000,
// then RESERVED and the 510 SHARED bytes): F_GETLK does not report a process's own locks, so a
// child asks. In WAL mode every open connection holds a SHARED lock there for its lifetime.
bool another_process_sees_a_lock(const std::string& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(path.c_str(), O_RDWR);
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0x40000000;
    fl.l_len = 512;
    const bool locked = fd >= 0 && ::fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
    ::_exit(locked ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Opening the store a second time in a process (as the recorder does to read its checkpoints
// back) must leave the first connection's SHARED lock in place: a check of the file that
// opened and closed a descriptor of its own dropped it, and another process closing the store
// then checkpointed and deleted the WAL under a running recording (a malformed store).
TEST(ReaderWriter, OpeningTheStoreAgainKeepsTheOtherConnectionsLocks) {
  test::TempDir dir;
  const std::string path = dir.file("locks.db");
  Store writer = Store::create(path);
  const int64_t run = writer.add_run("{}", "", "{}");
  Transaction txn = writer.begin_step();
  writer.put_step(step_row(run, 0, writer.put_blob("abc", 3)));
  txn.commit();
  ASSERT_TRUE(another_process_sees_a_lock(path));
  for (Mode mode : {Mode::kReadOnly, Mode::kReadWrite}) {
    { Store again = Store::open(path, mode); }
    EXPECT_TRUE(another_process_sees_a_lock(path)) << (mode == Mode::kReadOnly ? "read-only" : "read-write");
  }
}

// Two connections to one new store file; the second gives up on a lock after 50 ms.
StoreOptions quick_timeout() {
  StoreOptions o;
  o.busy_timeout_ms = 50;
  return o;
}
struct TwoConnections {
  test::TempDir dir;
  std::string path = dir.file("two.db");
  Store a = Store::create(path);
  Store b = Store::open(path, Mode::kReadWrite, quick_timeout());
};

TEST(ReaderWriter, SecondWriterWaitsForTheFirst) {
  TwoConnections c;
  Store &a = c.a, &b = c.b;
  Transaction txn = a.begin_step();
  try {
    b.begin_step();
    ADD_FAILURE() << "second writer got the lock";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.lib_code() & 0xFF, SQLITE_BUSY) << e.what();
  }
  txn.commit();
  Transaction ok = b.begin_step();
  ok.commit();
}

// put_blob takes the write lock only to insert: a blob already stored is found by a read and
// costs no lock at all, so a background checkpoint writer re-putting unchanged tensors never
// waits on the recorder's step transaction (and a new one waits only for its insert).
TEST(ReaderWriter, PuttingAStoredBlobNeedsNoWriteLock) {
  TwoConnections c;
  Store &a = c.a, &b = c.b;
  const std::vector<uint8_t> stored = test::random_bytes(7, 200000), fresh = test::random_bytes(8, 1000);
  const std::string h = b.put_blob(stored.data(), stored.size(), 4);
  Transaction txn = a.begin_step();
  EXPECT_EQ(b.put_blob(stored.data(), stored.size(), 4), h);
  try {
    b.put_blob(fresh.data(), fresh.size());
    ADD_FAILURE() << "a new blob was inserted while another connection held the write lock";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.lib_code() & 0xFF, SQLITE_BUSY) << e.what();
  }
  txn.commit();
  const std::string hf = b.put_blob(fresh.data(), fresh.size());
  EXPECT_EQ(a.get_blob(hf), fresh);
  EXPECT_EQ(a.get_blob(h), stored);
  EXPECT_EQ(a.blob_info(h)->shuffle, 4);
}

}  // namespace
}  // namespace rwd::store
