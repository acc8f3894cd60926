// Blob round trips (empty, tiny, random sizes, > 64 MiB chunked), dedup, tensors of every
// dtype, checkpoints, steps, metrics, probes and kv through a real store file.
#include <gtest/gtest.h>

#include <cmath>

#include "store/byte_shuffle.h"
#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

using test::random_bytes;
using test::TempDir;

TEST(Blob, RoundTripsSmallAndRandomSizes) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  std::vector<size_t> sizes = {0, 1, 2, 7, 8, 31, 32, 33, 4096, 65537};
  for (int i = 0; i < 20; ++i) sizes.push_back(test::mix64(i) % 300000);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> data = random_bytes(i, sizes[i]);
    const std::string h = s.put_blob(data.data(), data.size());
    EXPECT_EQ(h, content_hash(data.data(), data.size()));
    EXPECT_EQ(s.get_blob(h), data) << "size " << sizes[i];
    const BlobInfo info = *s.blob_info(h);
    EXPECT_EQ(info.raw_size, static_cast<int64_t>(sizes[i]));
    EXPECT_EQ(info.n_chunks, 1);
    EXPECT_EQ(info.level, StoreOptions{}.zstd_level);
  }
}

TEST(Blob, CompressibleDataShrinks) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  std::vector<uint8_t> zeros(1 << 20, 0);
  const std::string h = s.put_blob(zeros.data(), zeros.size());
  EXPECT_LT(s.blob_info(h)->stored_size, 1000);
  EXPECT_EQ(s.get_blob(h), zeros);
}

TEST(Blob, LargerThanOneChunkIsSplitAndRoundTrips) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  const size_t n = (size_t(65) << 20) + 3;  // 65 MiB + 3 bytes of incompressible data
  const std::vector<uint8_t> data = random_bytes(42, n);
  const std::string h = s.put_blob(data.data(), data.size());
  const BlobInfo info = *s.blob_info(h);
  EXPECT_EQ(info.n_chunks, 2);
  EXPECT_EQ(info.raw_size, static_cast<int64_t>(n));
  EXPECT_TRUE(s.get_blob(h) == data);
  EXPECT_TRUE(s.verify().empty());
}

TEST(Blob, IdenticalContentIsStoredOnce) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  const std::vector<uint8_t> a = random_bytes(1, 5000), b = random_bytes(2, 5000);
  const std::string ha = s.put_blob(a.data(), a.size());
  const int64_t stored_after_one = s.info().stored_bytes;
  EXPECT_EQ(s.put_blob(a.data(), a.size()), ha);
  EXPECT_EQ(s.info().n_blobs, 1);
  EXPECT_EQ(s.info().stored_bytes, stored_after_one);
  EXPECT_NE(s.put_blob(b.data(), b.size()), ha);
  EXPECT_EQ(s.info().n_blobs, 2);
  EXPECT_FALSE(s.has_blob("0123456789abcdef"));
  EXPECT_THROW(s.get_blob("0123456789abcdef"), StoreError);
}

// info() says where the bytes are, by the kind of row that refers to each blob.
TEST(Blob, InfoCountsStoredBytesByKind) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  const int64_t run = s.add_run("{}", "", "{}");
  const std::vector<uint8_t> a = random_bytes(4, 40000), b = random_bytes(5, 3000);
  s.put_checkpoint_tensor(run, 0, "w", Dtype::kU8, {40000}, a.data(), a.size());
  s.put_checkpoint_tensor(run, 10, "w", Dtype::kU8, {40000}, a.data(), a.size());  // same blob
  s.put_tensor(TensorKey{run, 3, 1, 2, "q"}, Dtype::kU8, {3000}, b.data(), b.size());
  const StoreInfo info = s.info();
  EXPECT_EQ(info.n_checkpoints, 2);
  EXPECT_EQ(info.checkpoint_bytes, s.blob_info(s.put_blob(a.data(), a.size()))->stored_size);
  EXPECT_EQ(info.tensor_bytes, s.blob_info(s.put_blob(b.data(), b.size()))->stored_size);
  EXPECT_EQ(info.step_blob_bytes, 0);
  EXPECT_GT(info.checkpoint_bytes, 39000);  // random bytes do not compress
  bool chunks = false;
  for (const auto& [name, bytes] : info.table_bytes) chunks = chunks || (name == "blob_chunks" && bytes > 40000);
  EXPECT_TRUE(chunks) << "dbstat: " << info.table_bytes.size() << " tables";
}

TEST(Blob, ByteShuffledRoundTripsAcrossChunksAndOddSizes) {
  std::vector<uint8_t> src = random_bytes(3, 1003), mid(1003), back(1003);
  for (size_t elem : {1, 2, 3, 4, 8}) {
    byte_shuffle(src.data(), src.size(), elem, mid.data());
    byte_unshuffle(mid.data(), mid.size(), elem, back.data());
    EXPECT_EQ(back, src) << elem;
  }
  byte_shuffle(src.data(), 8, 4, mid.data());  // planes: bytes 0,4 | 1,5 | 2,6 | 3,7
  EXPECT_EQ(mid[0], src[0]);
  EXPECT_EQ(mid[1], src[4]);
  EXPECT_EQ(mid[2], src[1]);
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  for (int elem : {2, 4, 8}) {
    for (size_t n : {size_t(0), size_t(5), size_t(4099), (size_t(64) << 20) + 5}) {
      if (n > kChunkBytes && elem != 4) continue;  // one multi-chunk case keeps the test fast
      const std::vector<uint8_t> data = random_bytes(n + elem, n);
      const std::string h = s.put_blob(data.data(), data.size(), elem);
      EXPECT_TRUE(s.get_blob(h) == data) << elem << " " << n;
    }
  }
  // Shuffling helps on float data: the exponent bytes form a low-entropy plane.
  std::vector<float> w(1 << 16);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * std::sin(static_cast<float>(i) * 0.37f);
  const BlobInfo plain = *s.blob_info(s.put_blob(w.data(), w.size() * 4, 1));
  w[0] = 1.0f;  // different content so it is a new blob
  const BlobInfo shuffled = *s.blob_info(s.put_blob(w.data(), w.size() * 4, 4));
  EXPECT_EQ(shuffled.shuffle, 4);
  EXPECT_LT(shuffled.stored_size, plain.stored_size);
  EXPECT_THROW(s.put_blob(w.data(), 8, 3), StoreError);
  EXPECT_TRUE(s.verify().empty());
}

TEST(Tensor, EveryDtypeRoundTripsExactly) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  const int64_t run = s.add_run("{}", "default", "{}");
  int layer = 0;
  for (Dtype d : kAllDtypes) {
    const std::vector<int64_t> shape = {3, 5};
    std::vector<uint8_t> bytes = random_bytes(layer, 15 * dtype_size(d));
    if (d == Dtype::kBool) {
      for (uint8_t& b : bytes) b &= 1;
    }
    s.put_tensor({run, 7, layer, 2, "O"}, d, shape, bytes.data(), bytes.size());
    ++layer;
  }
  layer = 0;
  for (Dtype d : kAllDtypes) {
    std::optional<TensorRecord> t = s.get_tensor({run, 7, layer, 2, "O"});
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->info.dtype, d);
    EXPECT_EQ(t->info.shape, (std::vector<int64_t>{3, 5}));
    std::vector<uint8_t> want = random_bytes(layer, 15 * dtype_size(d));
    if (d == Dtype::kBool) {
      for (uint8_t& b : want) b &= 1;
    }
    EXPECT_EQ(t->bytes, want) << dtype_name(d);
    EXPECT_EQ(s.blob_info(t->info.blob)->shuffle, static_cast<int>(dtype_size(d)));
    ++layer;
  }
  EXPECT_FALSE(s.get_tensor({run, 7, 0, 3, "O"}).has_value());
  EXPECT_EQ(s.tensors(run, 0, 100).size(), std::size(kAllDtypes));
  // A byte count that does not match the shape is a caller bug.
  std::vector<uint8_t> four(4);
  EXPECT_THROW(s.put_tensor({run, 8, -1, -1, "x"}, Dtype::kF32, {2}, four.data(), 4), StoreError);
}

TEST(Checkpoint, NearestAtOrBeforeAStep) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  const int64_t run = s.add_run("{\"n_layer\": 2}", "default", "{\"torch\": \"1.13\"}");
  for (int64_t step : {0, 100, 200}) {
    std::vector<float> w(12, static_cast<float>(step));
    s.put_checkpoint_tensor(run, step, "wte.weight", Dtype::kF32, {3, 4}, w.data(), 48);
    s.put_checkpoint_tensor(run, step, "step", Dtype::kI64, {}, &step, 8);
  }
  EXPECT_EQ(s.checkpoint_steps(run), (std::vector<int64_t>{0, 100, 200}));
  EXPECT_EQ(s.nearest_checkpoint(run, 99), 0);
  EXPECT_EQ(s.nearest_checkpoint(run, 100), 100);
  EXPECT_EQ(s.nearest_checkpoint(run, 5000), 200);
  EXPECT_FALSE(s.nearest_checkpoint(run, -1).has_value());
  const std::vector<TensorInfo> entries = s.checkpoint_entries(run, 100);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].key.name, "step");
  EXPECT_EQ(entries[1].shape, (std::vector<int64_t>{3, 4}));
  std::optional<TensorRecord> w = s.get_checkpoint_tensor(run, 200, "wte.weight");
  ASSERT_TRUE(w.has_value());
  float f;
  std::memcpy(&f, w->bytes.data() + 44, 4);
  EXPECT_EQ(f, 200.0f);
  EXPECT_EQ(s.run(run)->config, "{\"n_layer\": 2}");
}

TEST(Step, RecordsExactBitsAndRefusesDuplicates) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  const int64_t run = s.add_run("{}", "L2.H8.pv=fp32", "{}");
  const std::vector<uint8_t> batch = random_bytes(9, 1024);
  {
    Transaction txn = s.begin_step();
    StepRecord r;
    r.run = run;
    r.step = 0;
    r.lr = 6e-4;
    r.loss_bits = float_bits(std::nextafter(10.8f, 11.0f));
    r.grad_norm_bits = 0x7FC00001u;  // a NaN payload survives: we store bits, not floats
    r.batch_ref = s.put_blob(batch.data(), batch.size());
    r.batch_hash = "feedface";
    r.extra = "{\"tokens\": 1024}";
    s.put_step(r);
    s.put_metric(run, 0, "attn.L0.H1.max_logit", 12.5);
    s.put_metrics(run, 0, {{"loss", 1.0}, {"nan_metric", std::nan("")}, {"loss", r.loss()}});  // last wins
    txn.commit();
  }
  std::optional<StepRecord> r = s.get_step(run, 0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->loss(), std::nextafter(10.8f, 11.0f));
  EXPECT_EQ(r->grad_norm_bits, 0x7FC00001u);
  EXPECT_EQ(r->lr, 6e-4);
  EXPECT_FALSE(r->param_digest.has_value());
  EXPECT_FALSE(r->rng_ref.has_value());
  EXPECT_EQ(s.get_blob(*r->batch_ref), batch);
  EXPECT_EQ(s.step_range(run), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_THROW(s.put_step(*r), StoreError);
  const std::vector<MetricRow> m = s.metrics(run, 0, 0, "attn.");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].value, 12.5);
  EXPECT_EQ(s.metrics(run, 0, 0).size(), 3u);
  EXPECT_EQ(s.metrics(run, 0, 0, "loss")[0].value, static_cast<double>(r->loss()));
  EXPECT_TRUE(std::isnan(s.metrics(run, 0, 0, "nan")[0].value));
  EXPECT_EQ(s.metric_keys(run).size(), 3u);
  // A step whose transaction is dropped without commit leaves nothing behind.
  {
    Transaction txn = s.begin_step();
    StepRecord r1 = *r;
    r1.step = 1;
    s.put_step(r1);
  }
  EXPECT_FALSE(s.get_step(run, 1).has_value());
  // Invalid JSON is refused by the schema.
  EXPECT_THROW(s.add_run("{not json", "", "{}"), StoreError);
}

TEST(Probe, CacheByKeyAndKv) {
  TempDir dir;
  Store s = Store::create(dir.file("s.db"));
  ProbeRecord p{"k1", "job-a", "L2=fp32", "abcd", "10:20", "pass", "{\"loss\": 3.1}", 1.5, ""};
  s.put_probe(p);
  p.verdict = "fail";
  s.put_probe(p);  // same key replaces
  p.key = "k2";
  p.job = "job-b";
  s.put_probe(p);
  EXPECT_EQ(s.get_probe("k1")->verdict, "fail");
  EXPECT_FALSE(s.get_probe("nope").has_value());
  EXPECT_FALSE(s.get_probe("k1")->created.empty());
  EXPECT_EQ(s.probes().size(), 2u);
  EXPECT_EQ(s.probes("job-b").size(), 1u);
  s.put_kv(0, "plan_schedule", "[1,2]");
  s.put_kv(1, "divergence/curve", "[0.1]");
  s.put_kv(1, "divergence/step", "5");
  EXPECT_EQ(s.get_kv(0, "plan_schedule"), "[1,2]");
  EXPECT_EQ(s.kv_keys(1, "divergence/").size(), 2u);
  EXPECT_FALSE(s.get_kv(2, "plan_schedule").has_value());
}

TEST(Store, ReadOnlyRefusesWritesAndCreateRefusesExistingFiles) {
  TempDir dir;
  { Store::create(dir.file("s.db")); }
  Store ro = Store::open(dir.file("s.db"), Mode::kReadOnly);
  EXPECT_TRUE(ro.read_only());
  EXPECT_EQ(ro.schema_version(), kSchemaVersion);
  EXPECT_THROW(ro.put_blob("x", 1), StoreError);
  EXPECT_THROW(Store::create(dir.file("s.db")), StoreError);
  Store again = Store::open_or_create(dir.file("s.db"));
  EXPECT_FALSE(again.read_only());
}

}  // namespace
}  // namespace rwd::store
