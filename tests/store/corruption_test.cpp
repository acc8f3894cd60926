// Corruption: one flipped byte inside a blob's zstd frame in the file on disk, and row-level
// tampering through SQL; verify must name exactly the damaged blob and its referrers.
#include <gtest/gtest.h>

#include <algorithm>

#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using test::random_bytes;

// Writes 5 tensors of random (incompressible, hence distinct) bytes at steps 0..4 and returns
// their blob hashes; closing the store checkpoints the WAL into the main file.
std::vector<std::string> make_store(const std::string& path) {
  std::vector<std::string> hashes;
  Store s = Store::create(path);
  const int64_t run = s.add_run("{}", "default", "{}");
  for (int64_t step = 0; step < 5; ++step) {
    const std::vector<uint8_t> b = random_bytes(step + 100, 20000);
    s.put_tensor({run, step, 0, 1, "x"}, Dtype::kU8, {20000}, b.data(), b.size());
    hashes.push_back(s.tensors(run, step, step)[0].blob);
  }
  return hashes;
}

std::vector<uint8_t> frame_of(const std::string& path, const std::string& hash) {
  Db db(path, SQLITE_OPEN_READONLY);
  Statement st(db, "SELECT frame FROM blob_chunks WHERE hash=? AND idx=0");
  st.bind(1, hash);
  EXPECT_TRUE(st.step());
  const uint8_t* p = static_cast<const uint8_t*>(st.col_blob(0));
  return std::vector<uint8_t>(p, p + st.col_bytes(0));
}

TEST(Corruption, FlippedByteInFileNamesExactlyThatBlob) {
  test::TempDir dir;
  const std::string path = dir.file("c.db");
  const std::vector<std::string> hashes = make_store(path);
  const std::string victim = hashes[2];
  const std::vector<uint8_t> frame = frame_of(path, victim);
  ASSERT_GT(frame.size(), 4000u);

  std::vector<uint8_t> file = test::read_file(path);
  // 64 bytes from the middle of the frame: long enough to be unique in the file, and short
  // enough not to straddle an overflow-page pointer at the chosen offset in practice.
  const auto needle_begin = frame.begin() + static_cast<std::ptrdiff_t>(frame.size() / 2);
  const auto needle_end = needle_begin + 64;
  auto hit = std::search(file.begin(), file.end(), needle_begin, needle_end);
  ASSERT_NE(hit, file.end()) << "frame bytes not found in the checkpointed file";
  ASSERT_EQ(std::search(hit + 1, file.end(), needle_begin, needle_end), file.end())
      << "frame bytes are not unique in the file";
  hit[32] ^= 0x40;
  test::write_file(path, file);

  Store s = Store::open(path, Mode::kReadOnly);
  const std::vector<BadItem> bad = s.verify();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].blob, victim);
  EXPECT_EQ(bad[0].referenced_by, std::vector<std::string>{"run 1 step 2 tensor 'x' L0 H1"});
  EXPECT_FALSE(bad[0].problem.empty());
  try {
    s.get_tensor({1, 2, 0, 1, "x"});
    ADD_FAILURE() << "reading a corrupt blob must throw";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
  EXPECT_TRUE(s.get_tensor({1, 3, 0, 1, "x"}).has_value());
}

TEST(Corruption, RowLevelTamperingIsReported) {
  test::TempDir dir;
  const std::string path = dir.file("r.db");
  const std::vector<std::string> hashes = make_store(path);
  {
    // A raw connection: foreign keys are off by default, as in any external tool.
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE tensors SET blob='0123456789abcdef' WHERE step=3", "tamper reference");
    db.exec("UPDATE blobs SET raw_size=raw_size+1 WHERE hash='" + hashes[4] + "'", "tamper size");
  }
  Store s = Store::open(path, Mode::kReadOnly);
  std::vector<BadItem> bad = s.verify();
  ASSERT_EQ(bad.size(), 2u);
  std::sort(bad.begin(), bad.end(),
            [](const BadItem& a, const BadItem& b) { return a.blob < b.blob; });
  const BadItem& missing = bad[0].blob == "0123456789abcdef" ? bad[0] : bad[1];
  const BadItem& resized = bad[0].blob == "0123456789abcdef" ? bad[1] : bad[0];
  EXPECT_EQ(missing.blob, "0123456789abcdef");
  EXPECT_EQ(missing.problem, "referenced blob is missing");
  EXPECT_EQ(missing.referenced_by, std::vector<std::string>{"run 1 step 3 tensor 'x' L0 H1"});
  EXPECT_EQ(resized.blob, hashes[4]);
  EXPECT_EQ(resized.referenced_by, std::vector<std::string>{"run 1 step 4 tensor 'x' L0 H1"});
}

TEST(Corruption, DamagedChunkRowIsReported) {
  test::TempDir dir;
  const std::string path = dir.file("k.db");
  const std::vector<std::string> hashes = make_store(path);
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE blob_chunks SET frame=substr(frame, 1, length(frame) - 1) WHERE hash='" +
                hashes[0] + "'",
            "truncate frame");
    db.exec("DELETE FROM blob_chunks WHERE hash='" + hashes[1] + "'", "drop chunk");
  }
  Store s = Store::open(path, Mode::kReadOnly);
  std::vector<BadItem> bad = s.verify();
  ASSERT_EQ(bad.size(), 2u);
  std::vector<std::string> names = {bad[0].blob, bad[1].blob};
  std::sort(names.begin(), names.end());
  std::vector<std::string> want = {hashes[0], hashes[1]};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
}

TEST(Corruption, RowsOfAMissingRunAreReported) {
  test::TempDir dir;
  const std::string path = dir.file("m.db");
  make_store(path);
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE tensors SET run=7 WHERE step=1", "orphan a tensor");
  }
  Store s = Store::open(path, Mode::kReadOnly);
  const std::vector<BadItem> bad = s.verify();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].blob, "");
  EXPECT_EQ(bad[0].problem, "table tensors: 1 rows of a missing run");
}

}  // namespace
}  // namespace rwd::store

namespace rwd::store {
namespace {

// get_blobs on threads returns get_blob's bytes, and a damaged frame among many is the same
// one-line kData error naming that blob, raised on the calling thread.
TEST(Corruption, BlobsReadOnThreadsEqualOneByOneAndNameTheDamagedOne) {
  test::TempDir dir;
  const std::string path = dir.file("t.db");
  const std::vector<std::string> hashes = make_store(path);
  {
    Store s = Store::open(path, Mode::kReadOnly);
    const std::vector<std::vector<uint8_t>> all = s.get_blobs(hashes, 4);
    ASSERT_EQ(all.size(), hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) EXPECT_EQ(all[i], s.get_blob(hashes[i])) << i;
  }
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE blob_chunks SET frame=substr(frame, 1, length(frame) - 1) WHERE hash='" + hashes[3] + "'",
            "truncate frame");
  }
  Store s = Store::open(path, Mode::kReadOnly);
  try {
    s.get_blobs(hashes, 4);
    FAIL() << "a truncated frame was read";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(hashes[3]), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rwd::store
