// Stubs: what a recording killed as it started leaves (an empty file, an SQLite file with no
// tables, a hot journal beside it). Readers name them; create replaces them, and nothing else.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

void expect_open_says(const std::string& path, const std::string& what) {
  for (Mode mode : {Mode::kReadOnly, Mode::kReadWrite}) {
    try {
      Store::open(path, mode);
      ADD_FAILURE() << path << " opened";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), ExitCode::kData);
      EXPECT_NE(std::string(e.what()).find(what + ", not a store: nothing is stored in it"), std::string::npos)
          << e.what();
    }
  }
}

// An SQLite file with page 1 written and no table, and a hot journal of a transaction that
// began on an empty database (its header's initial size 0).
std::string tableless_with_journal(const test::TempDir& dir) {
  const std::string path = dir.file("tableless.db");
  {
    Db db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec("PRAGMA user_version=7", "writing page 1");
  }
  std::vector<uint8_t> journal = {0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7};
  journal.resize(512, 0);
  test::write_file(path + "-journal", journal);
  return path;
}

TEST(Stub, ReadersNameAndCreateReplacesFileLevelStubs) {
  test::TempDir dir;
  const std::string empty = dir.file("empty.db");
  test::write_file(empty, {});
  const std::string tableless = tableless_with_journal(dir);
  EXPECT_EQ(Store::stub_reason(empty), "an empty file");
  EXPECT_EQ(Store::stub_reason(tableless), "an SQLite file with no tables");
  expect_open_says(empty, "an empty file");
  expect_open_says(tableless, "an SQLite file with no tables");
  for (const std::string& path : {empty, tableless}) {
    { Store s = Store::create(path); s.add_run("{}", "default", "{}"); }
    Store s = Store::open(path, Mode::kReadOnly);
    EXPECT_EQ(s.runs().size(), 1u);
    EXPECT_TRUE(s.verify().empty());
    struct stat st;
    EXPECT_NE(::stat((path + "-journal").c_str(), &st), 0) << "the stale journal was kept";
  }
}

TEST(Stub, AStoreWithNoRunOrNoStepIsAStubButCreateRefusesItAndAnyStore) {
  test::TempDir dir;
  const std::string path = dir.file("s.db");
  { Store::create(path); }
  EXPECT_EQ(Store::stub_reason(path), "a rewind store with no run in it");
  EXPECT_THROW(Store::create(path), StoreError);
  { Store s = Store::open(path, Mode::kReadWrite); s.add_run("{}", "default", "{}"); }
  // A run with no checkpoint and no step: a recording killed before its first checkpoint.
  EXPECT_EQ(Store::stub_reason(path), "a rewind store with no checkpoint and no step in it");
  EXPECT_THROW(Store::create(path), StoreError);
  {
    Store s = Store::open(path, Mode::kReadWrite);
    StepRecord r;
    r.run = 1;
    r.batch_hash = "0000000000000000";
    s.put_step(r);
  }
  EXPECT_FALSE(Store::stub_reason(path).has_value());
  EXPECT_THROW(Store::create(path), StoreError);
  EXPECT_EQ(Store::open(path, Mode::kReadOnly).runs().size(), 1u);
}

TEST(Stub, CreateLeavesNoTemporaryFileAndAWholeStore) {
  test::TempDir dir;
  const std::string path = dir.file("new.db");
  { Store::create(path); }
  struct stat st;
  EXPECT_NE(::stat((path + ".creating-" + std::to_string(::getpid())).c_str(), &st), 0);
  EXPECT_NE(::stat((path + "-wal").c_str(), &st), 0) << "the schema is in the file, not a WAL";
  Store s = Store::open(path, Mode::kReadOnly);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  EXPECT_TRUE(s.verify().empty());
}

}  // namespace
}  // namespace rwd::store
