// Row checksums: a value changed in a covered row (as a flipped bit on disk would) is named by
// verify() with its table and row, and every reader of that row refuses it as "store
// corrupted" (kData) instead of handing the wrong value on. Stores of schema version 1 (no
// checksums) still open and read, and verify() says which rows it could not check.
#include <gtest/gtest.h>

#include <string>

#include "store/row_sum.h"
#include "store/store.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

// One run of 5 steps with a checkpoint at step 0, a metric per step, a probe and a kv entry.
void make_store(const std::string& path) {
  Store s = Store::create(path);
  const int64_t run = s.add_run(R"({"vocab_size":64})", "default", R"({"threads":1})");
  for (int64_t step = 0; step < 5; ++step) {
    StepRecord r;
    r.run = run;
    r.step = step;
    r.lr = 1e-3;
    r.loss_bits = float_bits(3.5f - 0.1f * static_cast<float>(step));
    r.grad_norm_bits = float_bits(1.0f);
    r.param_digest = "d2:0123456789abcdef";
    r.batch_hash = "00000000000000" + std::to_string(10 + step);
    s.put_step(r);
    s.put_metric(run, step, "attn.max_logit", 2.0 + static_cast<double>(step));
  }
  const float w[4] = {1, 2, 3, 4};
  s.put_checkpoint_tensor(run, 0, "wte", Dtype::kF32, {2, 2}, w, sizeof w);
  ProbeRecord p;
  p.key = "k1";
  p.job = "j";
  p.plan = "L0.H0.qk=low";
  p.plan_hash = "ph";
  p.window = "0:4";
  p.verdict = "fail";
  p.metrics = "{}";
  p.wall_s = 0.5;
  s.put_probe(p);
  s.put_kv(run, "curve", "[1,2,3]");
}

void tamper(const std::string& path, const std::string& sql) {
  Db db(path, SQLITE_OPEN_READWRITE);
  db.exec(sql, "planting corruption");
}

// verify() reports exactly one bad row, `row`; `read` (a reader of that row) throws
// "store corrupted: ... table T, ROW" with kData.
template <class F>
void expect_corrupt(const std::string& path, const std::string& table, const std::string& row, F read) {
  Store s = Store::open(path, Mode::kReadOnly);
  const std::vector<BadItem> bad = s.verify();
  ASSERT_EQ(bad.size(), 1u) << (bad.empty() ? "no problem found" : bad[0].problem);
  EXPECT_EQ(bad[0].row, "table " + table + ", " + row);
  EXPECT_NE(bad[0].problem.find("row checksum mismatch"), std::string::npos) << bad[0].problem;
  EXPECT_NE(bad[0].problem.find(row_sum_protects(table)), std::string::npos) << bad[0].problem;
  try {
    read(s);
    ADD_FAILURE() << "reading a corrupt " << table << " row must throw";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("store corrupted: " + path + ": table " + table + ", " + row, 0), 0u) << msg;
  }
}

class RowSums : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("s.db");
    make_store(path_);
  }
  test::TempDir dir_;
  std::string path_;
};

TEST_F(RowSums, SoundStoreVerifiesAndEveryRowIsChecked) {
  Store s = Store::open(path_, Mode::kReadOnly);
  EXPECT_TRUE(s.has_row_sums());
  EXPECT_TRUE(s.verify().empty());
  EXPECT_TRUE(s.unchecked_rows().empty());
  EXPECT_EQ(s.steps(1, 0, 4).size(), 5u);
  EXPECT_EQ(s.metrics(1, 0, 4).size(), 5u);
}

TEST_F(RowSums, FlippedLossBitIsCorruptionNotAValue) {
  tamper(path_, "UPDATE steps SET loss_bits = (loss_bits | 1) - (loss_bits & 1) WHERE step = 3");
  expect_corrupt(path_, "steps", "run 1 step 3", [](Store& s) { s.get_step(1, 3); });
  Store s = Store::open(path_, Mode::kReadOnly);
  EXPECT_THROW(s.steps(1, 0, 4), StoreError);
  EXPECT_TRUE(s.get_step(1, 2).has_value()) << "the sound rows still read";
}

TEST_F(RowSums, LossMadeNanIsCorruption) {
  // 0x7fc00000: the FP32 quiet NaN a predicate `nan` would take for a failure.
  tamper(path_, "UPDATE steps SET loss_bits = 2143289344 WHERE step = 4");
  expect_corrupt(path_, "steps", "run 1 step 4", [](Store& s) { s.steps(1, 0, 4); });
}

TEST_F(RowSums, FlippedParamDigestCharacter) {
  tamper(path_, "UPDATE steps SET param_digest = 'd2:0123456789abcdeF' WHERE step = 1");
  expect_corrupt(path_, "steps", "run 1 step 1", [](Store& s) { s.get_step(1, 1); });
}

TEST_F(RowSums, FlippedConfigByteStillValidJson) {
  tamper(path_, R"(UPDATE runs SET config = '{"vocab_sZze":64}')");
  expect_corrupt(path_, "runs", "run 1", [](Store& s) { s.run(1); });
  Store s = Store::open(path_, Mode::kReadOnly);
  EXPECT_THROW(s.runs(), StoreError);
}

TEST_F(RowSums, CheckpointShapeMetricProbeAndKv) {
  tamper(path_, "UPDATE checkpoints SET shape = '[4,1]'");
  expect_corrupt(path_, "checkpoints", "run 1 step 0 tensor 'wte'",
                 [](Store& s) { s.checkpoint_entries(1, 0); });
  tamper(path_, "UPDATE checkpoints SET shape = '[2,2]'");
  tamper(path_, "UPDATE metrics SET value = 2.5 WHERE step = 0");
  expect_corrupt(path_, "metrics", "run 1 step 0 metric 'attn.max_logit'",
                 [](Store& s) { s.metrics(1, 0, 4); });
  tamper(path_, "UPDATE metrics SET value = 2.0 WHERE step = 0");
  tamper(path_, "UPDATE probes SET verdict = 'pass'");
  expect_corrupt(path_, "probes", "probe 'k1'", [](Store& s) { s.get_probe("k1"); });
  tamper(path_, "UPDATE probes SET verdict = 'fail'");
  tamper(path_, "UPDATE kv SET value = '[1,2,4]'");
  expect_corrupt(path_, "kv", "run 1 key 'curve'", [](Store& s) { s.get_kv(1, "curve"); });
}

TEST_F(RowSums, UpdatedPlanAndMetaAreSignedAnew) {
  {
    Store s = Store::open(path_, Mode::kReadWrite);
    s.update_run_plan(1, "L0.H0.acc=fp32");
    s.update_run_meta(1, R"({"threads":2})");
  }
  Store s = Store::open(path_, Mode::kReadOnly);
  EXPECT_TRUE(s.verify().empty());
  EXPECT_EQ(s.run(1)->plan, "L0.H0.acc=fp32");
}

TEST_F(RowSums, NanMetricRoundTrips) {
  {
    Store s = Store::open(path_, Mode::kReadWrite);
    s.put_metric(1, 0, "nan_metric", std::numeric_limits<double>::quiet_NaN());
    s.put_metric(1, 0, "neg_zero", -0.0);
  }
  Store s = Store::open(path_, Mode::kReadOnly);
  EXPECT_TRUE(s.verify().empty());
  EXPECT_EQ(s.metrics(1, 0, 0).size(), 3u);
}

// A store as rewind wrote it before the checksums: version 1, no row_sum columns.
void make_v1(const std::string& path) {
  make_store(path);
  Db db(path, SQLITE_OPEN_READWRITE);
  for (const char* t : {"runs", "steps", "checkpoints", "metrics", "probes", "kv"}) {
    db.exec(std::string("ALTER TABLE ") + t + " DROP COLUMN row_sum", "dropping row_sum");
  }
  db.exec("PRAGMA user_version=1", "stamping version 1");
}

TEST(RowSumsOldStore, VersionOneReadsReadOnlyAndSaysWhatIsUnchecked) {
  test::TempDir dir;
  const std::string path = dir.file("v1.db");
  make_v1(path);
  {
    Store s = Store::open(path, Mode::kReadOnly);
    EXPECT_EQ(s.schema_version(), 1);
    EXPECT_FALSE(s.has_row_sums());
    EXPECT_EQ(s.steps(1, 0, 4).size(), 5u);
    EXPECT_EQ(s.run(1)->config, R"({"vocab_size":64})");
    EXPECT_EQ(s.checkpoint_entries(1, 0).size(), 1u);
    EXPECT_TRUE(s.verify().empty());
    const auto unchecked = s.unchecked_rows();
    ASSERT_FALSE(unchecked.empty());
    EXPECT_EQ(unchecked[0], (std::pair<std::string, int64_t>{"runs", 1}));
  }
  {
    // Read-write: migrated to version 2; old rows stay unchecked, new ones are checked.
    Store s = Store::open(path, Mode::kReadWrite);
    EXPECT_EQ(s.schema_version(), kSchemaVersion);
    StepRecord r = *s.get_step(1, 4);
    r.step = 5;
    s.put_step(r);
  }
  tamper(path, "UPDATE steps SET loss_bits = (loss_bits | 1) - (loss_bits & 1) WHERE step IN (2, 5)");
  Store s = Store::open(path, Mode::kReadOnly);
  EXPECT_TRUE(s.has_row_sums());
  const std::vector<BadItem> bad = s.verify();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].row, "table steps, run 1 step 5");
  EXPECT_NO_THROW(s.get_step(1, 2)) << "a row older than the checksums cannot be checked";
  bool steps_unchecked = false;
  for (const auto& [table, n] : s.unchecked_rows()) steps_unchecked |= table == "steps" && n == 5;
  EXPECT_TRUE(steps_unchecked);
}

TEST(RowSumsOldStore, SchemaVersionZeroSaysOneThingInBothModes) {
  test::TempDir dir;
  const std::string path = dir.file("v0.db");
  make_store(path);
  tamper(path, "PRAGMA user_version=0");
  for (Mode mode : {Mode::kReadOnly, Mode::kReadWrite}) {
    try {
      Store::open(path, mode);
      ADD_FAILURE() << "version 0 opened";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.code(), ExitCode::kData);
      EXPECT_NE(std::string(e.what()).find("damaged store: schema version 0"), std::string::npos) << e.what();
    }
  }
}

TEST(RowSumsOldStore, MissingColumnIsRefusedAtOpen) {
  test::TempDir dir;
  const std::string path = dir.file("nocol.db");
  make_store(path);
  tamper(path, "ALTER TABLE steps DROP COLUMN extra");
  try {
    Store::open(path, Mode::kReadOnly);
    ADD_FAILURE() << "a store without steps.extra opened";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
    EXPECT_NE(std::string(e.what()).find("table 'steps' has no column 'extra'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rwd::store
