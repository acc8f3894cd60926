// Files that are not (usable) stores: each open fails with one line and ExitCode::kData, in
// both modes, and leaves the file byte-for-byte unchanged.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

void expect_refused(const std::string& path, const std::string& expect_in_msg) {
  struct stat st;
  const bool is_file = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  const std::string before = is_file ? test::file_hash(path) : "";
  for (Mode mode : {Mode::kReadOnly, Mode::kReadWrite}) {
    try {
      Store::open(path, mode);
      ADD_FAILURE() << path << " opened";
    } catch (const StoreError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), ExitCode::kData) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(expect_in_msg), std::string::npos) << msg;
    }
    if (is_file) EXPECT_EQ(test::file_hash(path), before) << path << " was modified";
  }
  if (is_file) {
    EXPECT_THROW(Store::create(path), StoreError);
    EXPECT_THROW(Store::open_or_create(path), StoreError);
    EXPECT_EQ(test::file_hash(path), before) << path << " was modified by create";
  }
}

std::string real_store(const test::TempDir& dir, const std::string& name) {
  const std::string path = dir.file(name);
  Store s = Store::create(path);
  const int64_t run = s.add_run("{}", "", "{}");
  std::vector<uint8_t> b = test::random_bytes(1, 100000);
  s.put_tensor({run, 0, -1, -1, "t"}, Dtype::kU8, {100000}, b.data(), b.size());
  return path;
}

TEST(BadFile, RandomBytes) {
  test::TempDir dir;
  test::write_file(dir.file("rand.db"), test::random_bytes(5, 50000));
  expect_refused(dir.file("rand.db"), "not a rewind store");
}

TEST(BadFile, TruncatedStore) {
  test::TempDir dir;
  const std::string path = real_store(dir, "full.db");
  const size_t page = static_cast<size_t>(StoreOptions{}.page_size);
  const std::vector<uint8_t> full = test::read_file(path);
  ASSERT_GT(full.size(), 3 * page);
  test::write_file(dir.file("t1000.db"), std::vector<uint8_t>(full.begin(), full.begin() + 1000));
  expect_refused(dir.file("t1000.db"), "truncated");
  // Cut at a page boundary: only the header says pages are missing.
  test::write_file(dir.file("tpage.db"),
                   std::vector<uint8_t>(full.begin(), full.begin() + 2 * page));
  expect_refused(dir.file("tpage.db"), "truncated");
}

TEST(BadFile, NewerSchemaVersion) {
  test::TempDir dir;
  const std::string path = real_store(dir, "v99.db");
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("PRAGMA user_version=99", "bump version");
  }
  expect_refused(path, "schema version 99 is newer");
}

TEST(BadFile, OtherSqliteDatabase) {
  test::TempDir dir;
  const std::string path = dir.file("other.db");
  {
    Db db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec("CREATE TABLE foo(a, b); INSERT INTO foo VALUES (1, 2)", "make other db");
  }
  expect_refused(path, "without rewind tables");
}

TEST(BadFile, DirectoryMissingAndEmpty) {
  test::TempDir dir;
  expect_refused(dir.path(), "directory");
  expect_refused(dir.file("missing.db"), "no such file");
  struct stat st;
  EXPECT_NE(::stat(dir.file("missing.db").c_str(), &st), 0) << "open created a file";
  test::write_file(dir.file("empty.db"), {});
  for (Mode mode : {Mode::kReadOnly, Mode::kReadWrite}) {
    EXPECT_THROW(Store::open(dir.file("empty.db"), mode), StoreError);
  }
  ASSERT_EQ(::stat(dir.file("empty.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  // Asked to create: an empty file becomes a store.
  Store s = Store::open_or_create(dir.file("empty.db"));
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
}

TEST(BadFile, SoundStoreOpensInBothModes) {
  test::TempDir dir;
  const std::string path = real_store(dir, "ok.db");
  for (Mode mode : {Mode::kReadOnly, Mode::kReadWrite}) {
    Store s = Store::open(path, mode);
    EXPECT_TRUE(s.verify().empty());
    EXPECT_EQ(s.runs().size(), 1u);
  }
}

}  // namespace
}  // namespace rwd::store
