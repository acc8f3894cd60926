// Store::put_blobs (parallel preparation, inserts on the calling thread) and
// put_checkpoint_blob: the same bytes, rows and frames as the one-blob path for every thread
// count, dedup of stored and repeated blobs, and errors that leave no checkpoint row behind.
#include <gtest/gtest.h>

#include <cmath>

#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using test::random_bytes;

struct Tensor {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A training-state-like mix: float weights of several sizes (compressible after the shuffle),
// tiny and empty tensors, and one repeated tensor.
std::vector<Tensor> state() {
  std::vector<Tensor> out;
  for (int i = 0; i < 12; ++i) {
    const int64_t rows = 1 + (test::mix64(i) % 97), cols = 1 + (test::mix64(i + 50) % 300);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (size_t k = 0; k < w.size(); ++k) w[k] = 0.02f * std::sin(0.37f * float(k * (i + 1)));
    const uint8_t* p = reinterpret_cast<const uint8_t*>(w.data());
    out.push_back({"w" + std::to_string(i), Dtype::kF32, {rows, cols}, {p, p + w.size() * 4}});
  }
  out.push_back({"bf16", Dtype::kBF16, {4099}, random_bytes(1, 4099 * 2)});
  out.push_back({"empty", Dtype::kF32, {0, 3}, {}});
  out.push_back({"rng", Dtype::kU8, {5}, random_bytes(2, 5)});
  out.push_back({"w3 again", Dtype::kF32, out[3].shape, out[3].bytes});
  return out;
}

std::vector<BlobSource> sources(const Store& s, const std::vector<Tensor>& ts) {
  std::vector<BlobSource> out;
  for (const Tensor& t : ts) {
    out.push_back({t.bytes.data(), t.bytes.size(), s.tensor_shuffle(t.dtype)});
  }
  return out;
}

// Every row of blobs, blob_chunks (frames by their hash, in insertion order) and checkpoints.
std::string dump(const std::string& path) {
  Db db(path, SQLITE_OPEN_READONLY);
  std::string out;
  Statement b(db,
              "SELECT hash, raw_size, stored_size, n_chunks, level, shuffle FROM blobs "
              "ORDER BY hash");
  while (b.step()) {
    for (int c = 0; c < 6; ++c) out += b.col_text(c) + " ";
    out += "\n";
  }
  Statement f(db, "SELECT hash, idx, frame FROM blob_chunks ORDER BY rowid");
  while (f.step()) {
    out += f.col_text(0) + " " + f.col_text(1) + " " +
           content_hash(f.col_blob(2), f.col_bytes(2)) + "\n";
  }
  Statement c(db, "SELECT run, step, name, blob, dtype, shape FROM checkpoints ORDER BY name");
  while (c.step()) {
    for (int k = 0; k < 6; ++k) out += c.col_text(k) + " ";
    out += "\n";
  }
  return out;
}

// A checkpoint written like write_checkpoint does: put_blobs, then the rows in one transaction.
void write_parallel(Store& s, const std::vector<Tensor>& ts, int64_t run, int64_t step) {
  const std::vector<std::string> hashes = s.put_blobs(sources(s, ts));
  ASSERT_EQ(hashes.size(), ts.size());
  Transaction txn = s.begin_step();
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(hashes[i], content_hash(ts[i].bytes.data(), ts[i].bytes.size())) << ts[i].name;
    s.put_checkpoint_blob(run, step, ts[i].name, ts[i].dtype, ts[i].shape, hashes[i]);
  }
  txn.commit();
}

StoreOptions with_threads(int threads) {
  StoreOptions o;
  o.zstd_workers = threads;
  return o;
}

// Today's path on one thread: put_blob per tensor, then put_checkpoint_tensor per row.
std::string reference_dump(const std::string& path, const std::vector<Tensor>& ts) {
  {
    Store s = Store::create(path);
    const int64_t run = s.add_run("{}", "", "{}");
    for (const Tensor& t : ts) {
      s.put_blob(t.bytes.data(), t.bytes.size(), s.tensor_shuffle(t.dtype));
    }
    Transaction txn = s.begin_step();
    for (const Tensor& t : ts) {
      s.put_checkpoint_tensor(run, 5, t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    }
    txn.commit();
  }
  return dump(path);
}

// Writes `ts` as the checkpoint of step 5 with put_blobs on `threads` threads, checks the
// file against `reference` row by row and frame by frame, and reads every tensor back.
void expect_same_as_reference(const std::string& path, const std::vector<Tensor>& ts,
                              int threads, const std::string& reference) {
  {
    Store s = Store::create(path, with_threads(threads));
    write_parallel(s, ts, s.add_run("{}", "", "{}"), 5);
  }
  EXPECT_EQ(dump(path), reference) << threads << " threads";
  Store r = Store::open(path, Mode::kReadOnly);
  for (const Tensor& t : ts) {
    const std::optional<TensorRecord> rec = r.get_checkpoint_tensor(1, 5, t.name);
    ASSERT_TRUE(rec.has_value()) << t.name;
    EXPECT_TRUE(rec->bytes == t.bytes) << t.name << ", " << threads << " threads";
    EXPECT_EQ(rec->info.shape, t.shape);
  }
}

TEST(PutBlobs, SameStoreForEveryThreadCountAsTheOneBlobPath) {
  test::TempDir dir;
  const std::vector<Tensor> ts = state();
  const std::string reference = reference_dump(dir.file("ref.db"), ts);
  for (int threads : {0, 1, 2, 4}) {
    const std::string path = dir.file("t" + std::to_string(threads) + ".db");
    expect_same_as_reference(path, ts, threads, reference);
    Store r = Store::open(path, Mode::kReadOnly);
    EXPECT_EQ(r.info().n_blobs, static_cast<int64_t>(ts.size() - 1));  // "w3 again" is w3
    EXPECT_TRUE(r.verify().empty()) << threads << " threads";
  }
}

// The chunks of one blob are compressed on different threads and inserted in order (the
// blob of two 64 MiB chunks makes this test take a few seconds, so it runs one count).
TEST(PutBlobs, BlobOfTwoChunksIsTheSameFromTwoThreads) {
  test::TempDir dir;
  const size_t n = (kChunkBytes + 40) / 8;
  const std::vector<Tensor> ts = {
      {"big", Dtype::kF64, {static_cast<int64_t>(n)}, random_bytes(3, n * 8)},
      {"rng", Dtype::kU8, {5}, random_bytes(2, 5)}};
  const std::string reference = reference_dump(dir.file("ref.db"), ts);
  expect_same_as_reference(dir.file("t2.db"), ts, 2, reference);
  Store r = Store::open(dir.file("t2.db"), Mode::kReadOnly);
  EXPECT_EQ(r.blob_info(r.get_checkpoint_tensor(1, 5, "big")->info.blob)->n_chunks, 2);
}

// With the WAL checkpointed by a helper connection beside the inserts (every 2 MiB here):
// the same rows and frames, and the blobs are in the main file before put_blobs returns.
TEST(PutBlobs, WalCheckpointedBesideTheInsertsGivesTheSameStore) {
  test::TempDir dir;
  std::vector<Tensor> ts = state();
  for (int i = 0; i < 6; ++i) {
    ts.push_back({"r" + std::to_string(i), Dtype::kU8, {1 << 20}, random_bytes(20 + i, 1 << 20)});
  }
  const std::string reference = reference_dump(dir.file("ref.db"), ts);
  const std::string path = dir.file("o.db");
  StoreOptions o = with_threads(2);
  o.wal_autocheckpoint = 0;
  o.overlap_checkpoint_bytes = 4 << 20;
  {
    Store s = Store::create(path, o);
    const int64_t run = s.add_run("{}", "", "{}");
    s.checkpoint_wal();
    const int64_t before = test::file_size(path);
    write_parallel(s, ts, run, 5);
    EXPECT_GE(test::file_size(path), before + (2 << 20)) << "no WAL checkpoint beside the inserts";
    Store r = Store::open(path, Mode::kReadOnly);  // a reader meanwhile
    EXPECT_TRUE(r.verify().empty());
  }
  EXPECT_EQ(dump(path), reference);
}

TEST(PutBlobs, StoredAndRepeatedBlobsAreInsertedOnceAndNeedNoWriteLock) {
  test::TempDir dir;
  const std::string path = dir.file("d.db");
  Store a = Store::create(path);
  StoreOptions quick = with_threads(2);
  quick.busy_timeout_ms = 50;
  Store b = Store::open(path, Mode::kReadWrite, quick);
  const std::vector<uint8_t> x = random_bytes(10, 70000), y = random_bytes(11, 3000);
  const std::string hx = b.put_blob(x.data(), x.size(), 4);
  const std::vector<BlobSource> stored = {{x.data(), x.size(), 4}, {x.data(), x.size(), 4}};
  {
    // Another connection holds the write lock: blobs already stored are found by reads.
    Transaction txn = a.begin_step();
    EXPECT_EQ(b.put_blobs(stored), (std::vector<std::string>{hx, hx}));
    EXPECT_THROW(b.put_blobs({{y.data(), y.size(), 1}}), StoreError);  // a new one must insert
    txn.commit();
  }
  const std::vector<std::string> h =
      b.put_blobs({{y.data(), y.size(), 2}, {x.data(), x.size(), 4}, {y.data(), y.size(), 2}});
  EXPECT_EQ(h[0], content_hash(y.data(), y.size()));
  EXPECT_EQ(h[1], hx);
  EXPECT_EQ(h[2], h[0]);
  EXPECT_EQ(a.info().n_blobs, 2);
  EXPECT_EQ(a.blob_info(h[0])->shuffle, 2);
  EXPECT_EQ(a.get_blob(h[0]), y);
  EXPECT_TRUE(b.put_blobs({}).empty());
  EXPECT_THROW(b.put_blobs({{y.data(), y.size(), 3}}), StoreError);  // bad shuffle size
}

TEST(PutBlobs, AFailedWriteLeavesNoCheckpointRowAndTheStoreUsable) {
  test::TempDir dir;
  const std::string path = dir.file("e.db");
  const std::vector<Tensor> ts = state();
  Store a = Store::create(path);
  const int64_t run = a.add_run("{}", "", "{}");
  StoreOptions quick = with_threads(4);
  quick.busy_timeout_ms = 50;
  Store b = Store::open(path, Mode::kReadWrite, quick);
  {
    // The first insert times out while the workers are compressing the other blobs.
    Transaction txn = a.begin_step();
    try {
      write_parallel(b, ts, run, 7);
      ADD_FAILURE() << "the checkpoint was written past another connection's write lock";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.lib_code() & 0xFF, SQLITE_BUSY) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
    txn.commit();
  }
  EXPECT_TRUE(a.checkpoint_steps(run).empty());
  EXPECT_EQ(a.info().n_blobs, 0);
  // A blob row of the wrong size (a hash collision, or a tampered row) stops the write with
  // kData before any row refers to it.
  const std::string h5 = content_hash(ts[5].bytes.data(), ts[5].bytes.size());
  a.put_blob(ts[5].bytes.data(), ts[5].bytes.size(), 4);
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE blobs SET raw_size = raw_size + 4 WHERE hash='" + h5 + "'", "tampering");
  }
  try {
    write_parallel(b, ts, run, 7);
    ADD_FAILURE() << "a blob of another size was taken for this one";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
    EXPECT_NE(std::string(e.what()).find(h5), std::string::npos) << e.what();
  }
  EXPECT_TRUE(a.checkpoint_steps(run).empty());
  {
    Db db(path, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE blobs SET raw_size = raw_size - 4 WHERE hash='" + h5 + "'", "repairing");
  }
  write_parallel(b, ts, run, 7);
  EXPECT_EQ(a.checkpoint_entries(run, 7).size(), ts.size());
  EXPECT_TRUE(a.verify().empty());
}

TEST(PutBlobs, CheckpointRowNeedsItsBlobStoredWithTheRightSize) {
  test::TempDir dir;
  Store s = Store::create(dir.file("r.db"));
  const int64_t run = s.add_run("{}", "", "{}");
  const std::vector<uint8_t> b = random_bytes(20, 24);
  const std::string h = s.put_blobs({{b.data(), b.size(), 4}})[0];
  try {
    s.put_checkpoint_blob(run, 3, "w", Dtype::kF32, {6}, "0123456789abcdef");
    ADD_FAILURE() << "a row referring to a missing blob was written";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
  }
  try {
    s.put_checkpoint_blob(run, 3, "w", Dtype::kF32, {5}, h);
    ADD_FAILURE() << "a row whose shape does not fit its blob was written";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("24 bytes in blob " + h), std::string::npos) << e.what();
  }
  EXPECT_TRUE(s.checkpoint_steps(run).empty());
  s.put_checkpoint_blob(run, 3, "w", Dtype::kF32, {2, 3}, h);
  EXPECT_EQ(s.get_checkpoint_tensor(run, 3, "w")->bytes, b);
}

}  // namespace
}  // namespace rwd::store
