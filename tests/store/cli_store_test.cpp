// `rewind store` driven through run_store() with argv arrays, as cli/main.cpp calls it:
// exit codes, the verify report, and .npy files parsed here (and by numpy when available).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cli/commands.h"
#include "store/npy.h"
#include "store/reader_pins.h"
#include "store/store.h"
#include "store/writer_lock.h"
#include "tests/store/run_store_cli.h"
#include "tests/store/store_test_util.h"

namespace rwd::store {
namespace {

int run(std::vector<std::string> args, std::string* out = nullptr) { return test::run_store_cli(std::move(args), out); }

struct Npy {
  std::string descr;
  std::string shape;
  std::vector<uint8_t> data;
};

// Parses a v1.0 .npy written by write_npy: magic, version, header length, dict, data.
Npy parse_npy(const std::string& path) {
  const std::vector<uint8_t> f = test::read_file(path);
  Npy n;
  EXPECT_GE(f.size(), 10u);
  EXPECT_EQ(std::string(f.begin(), f.begin() + 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = f[8] | (f[9] << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string header(f.begin() + 10, f.begin() + 10 + static_cast<std::ptrdiff_t>(hlen));
  EXPECT_EQ(header.back(), '\n');
  EXPECT_NE(header.find("'fortran_order': False"), std::string::npos);
  const size_t d = header.find("'descr': '") + 10;
  n.descr = header.substr(d, header.find('\'', d) - d);
  const size_t s = header.find("'shape': (") + 10;
  n.shape = header.substr(s, header.find(')', s) - s);
  n.data.assign(f.begin() + 10 + static_cast<std::ptrdiff_t>(hlen), f.end());
  return n;
}

class StoreCli : public testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("cli.db");
    Store s = Store::create(path_);
    const int64_t run = s.add_run("{\"n_layer\": 2, \"n_head\": 4}", "L1.H2.pv=fp32",
                                  "{\"rewind\": \"0.1.0\", \"device\": \"cpu\"}");
    for (int i = 0; i < 12; ++i) bf16_.push_back(f32_to_bf16(0.37f * static_cast<float>(i) - 2));
    s.put_tensor({run, 3, 1, 2, "O"}, Dtype::kBF16, {3, 4}, bf16_.data(), 24);
    std::vector<float> w = {1.5f, -2.25f, 3.0f, 0.0f, 1e-8f, -7.0f};
    s.put_checkpoint_tensor(run, 0, "wte.weight", Dtype::kF32, {2, 3}, w.data(), 24);
    std::vector<uint16_t> tokens = {1, 50303, 7, 8};
    s.put_tensor({run, 3, -1, -1, "tokens"}, Dtype::kU16, {4}, tokens.data(), 8);
    StepRecord r;
    r.run = run;
    r.step = 3;
    r.batch_hash = "x";
    s.put_step(r);
    s.put_metric(run, 3, "loss", 4.5);
  }
  test::TempDir dir_;
  std::string path_;
  std::vector<uint16_t> bf16_;
};

TEST_F(StoreCli, InfoLsVerifySucceed) {
  std::string out;
  EXPECT_EQ(run({"store", "info", path_}, &out), 0);
  EXPECT_NE(out.find("schema version " + std::to_string(store::kSchemaVersion)), std::string::npos) << out;
  EXPECT_NE(out.find("steps 3..3 (1 recorded)"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoints: 1 at steps 0"), std::string::npos) << out;
  EXPECT_EQ(run({"store", "ls", path_}, &out), 0);
  EXPECT_NE(out.find("'O' L1 H2 bf16 [3,4]"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoint  step 0 'wte.weight' f32 [2,3]"), std::string::npos) << out;
  EXPECT_EQ(run({"store", "verify", path_}, &out), 0);
  EXPECT_NE(out.find("3 blobs checked, 0 problems"), std::string::npos) << out;
  EXPECT_EQ(run({"store", "verify", "--help"}), 0);
  EXPECT_EQ(run({"store", "--help"}), 0);
}

TEST_F(StoreCli, UsageAndDataErrors) {
  EXPECT_EQ(run({"store"}), 2);
  EXPECT_EQ(run({"store", "frobnicate", path_}), 2);
  EXPECT_EQ(run({"store", "info"}), 2);
  EXPECT_EQ(run({"store", "info", path_, "--bogus"}), 2);
  EXPECT_EQ(run({"store", "export", path_, "--tensor", "O", "-o", dir_.file("a.npy")}), 2);
  EXPECT_EQ(run({"store", "export", path_, "--step", "3", "-o", dir_.file("a.npy")}), 2);
  EXPECT_EQ(run({"store", "export", path_, "--tensor", "O", "--step", "4", "--layer", "1", "--head",
                 "2", "-o", dir_.file("a.npy")}),
            3);
  EXPECT_EQ(run({"store", "info", dir_.file("missing.db")}), 3);
  EXPECT_EQ(run({"store", "export", path_, "--tensor", "O", "--step", "3", "--run", "9", "-o",
                 dir_.file("a.npy")}),
            3);
}

TEST_F(StoreCli, VerifyExitsThreeAndNamesTheBadBlob) {
  std::string blob;
  {
    Store s = Store::open(path_, Mode::kReadOnly);
    blob = s.get_checkpoint_tensor(1, 0, "wte.weight")->info.blob;
  }
  {
    Db db(path_, SQLITE_OPEN_READWRITE);
    db.exec("UPDATE blob_chunks SET frame=zeroblob(40) WHERE hash='" + blob + "'", "damage");
  }
  std::string out;
  EXPECT_EQ(run({"store", "verify", path_}, &out), 3);
  EXPECT_NE(out.find("BAD blob " + blob), std::string::npos) << out;
  EXPECT_NE(out.find("used by run 1 step 0 checkpoint 'wte.weight'"), std::string::npos) << out;
  EXPECT_NE(out.find("1 problem"), std::string::npos) << out;
}

TEST_F(StoreCli, ExportWritesNpyWithBf16WidenedToFloat32) {
  const std::string a = dir_.file("o.npy"), w = dir_.file("w.npy"), t = dir_.file("t.npy");
  ASSERT_EQ(run({"store", "export", path_, "--tensor", "O", "--step", "3", "--layer", "1", "--head",
                 "2", "-o", a}),
            0);
  Npy n = parse_npy(a);
  EXPECT_EQ(n.descr, "<f4");
  EXPECT_EQ(n.shape, "3, 4");
  ASSERT_EQ(n.data.size(), 48u);
  for (size_t i = 0; i < 12; ++i) {
    float f;
    std::memcpy(&f, n.data.data() + 4 * i, 4);
    EXPECT_EQ(f, bf16_to_f32(bf16_[i])) << i;
  }
  ASSERT_EQ(run({"store", "export", path_, "--checkpoint", "wte.weight", "--step", "0", "-o", w}),
            0);
  n = parse_npy(w);
  EXPECT_EQ(n.descr, "<f4");
  EXPECT_EQ(n.shape, "2, 3");
  float f;
  std::memcpy(&f, n.data.data() + 4, 4);
  EXPECT_EQ(f, -2.25f);
  ASSERT_EQ(run({"store", "export", path_, "--tensor", "tokens", "--step", "3", "-o", t}), 0);
  n = parse_npy(t);
  EXPECT_EQ(n.descr, "<u2");
  EXPECT_EQ(n.shape, "4,");
  EXPECT_EQ(n.data.size(), 8u);
}

TEST_F(StoreCli, NumpyLoadsTheExport) {
  struct stat st;
  if (::stat("/usr/bin/python3", &st) != 0 ||
      std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with numpy";
  }
  const std::string a = dir_.file("o.npy"), t = dir_.file("t.npy");
  ASSERT_EQ(run({"store", "export", path_, "--tensor", "O", "--step", "3", "--layer", "1", "--head",
                 "2", "-o", a}),
            0);
  ASSERT_EQ(run({"store", "export", path_, "--tensor", "tokens", "--step", "3", "-o", t}), 0);
  // Values: bf16(0.37*i - 2) widened; numpy must agree with our own bf16 rounding.
  std::string expect = "[";
  for (uint16_t b : bf16_) expect += std::to_string(bf16_to_f32(b)) + ",";
  expect += "]";
  const std::string cmd = "/usr/bin/python3 -c \"import numpy as np; a=np.load('" + a +
                          "'); t=np.load('" + t +
                          "'); assert a.dtype==np.float32 and a.shape==(3,4); "
                          "assert np.allclose(a.ravel(), np.array(" +
                          expect +
                          "), rtol=0, atol=1e-6); "
                          "assert t.dtype==np.uint16 and t.tolist()==[1,50303,7,8]\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// `store thin` and `store info --keep-...` on a store of checkpoints every 5 steps, 0..60.
class ThinCli : public testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("thin.db");
    Store s = Store::create(path_);
    const int64_t run = s.add_run("{}", "default", "{}");
    for (int64_t step = 0; step <= 60; step += 5) {
      const std::vector<uint8_t> w = test::random_bytes(static_cast<uint64_t>(step), 100000);
      s.put_checkpoint_tensor(run, step, "w", Dtype::kU8, {100000}, w.data(), w.size());
    }
    ProbeRecord p;
    p.key = "k";
    p.job = "j";
    p.window = "27:39";
    p.metrics = "{}";
    s.put_probe(p);
  }
  std::vector<int64_t> checkpoints() { return Store::open(path_, Mode::kReadOnly).checkpoint_steps(1); }
  test::TempDir dir_;
  std::string path_;
};

TEST_F(ThinCli, InfoSaysWhatThinWouldFreeAndThinFreesIt) {
  std::string out;
  ASSERT_EQ(run({"store", "info", path_, "--keep-last", "3", "--keep-every", "20"}, &out), 0);
  EXPECT_NE(out.find("auto-vacuum incremental"), std::string::npos) << out;
  EXPECT_NE(out.find("run 1: thin --keep-last 3 --keep-every 20 would remove 6 of 13 checkpoints (steps 5, 10, "
                     "15, 30, 35, 45): 6 blobs, 586"),
            std::string::npos) << out;
  EXPECT_NE(out.find("kept beyond the rule: step 25: bisect probe window 27:39 (job j)"), std::string::npos) << out;
  EXPECT_EQ(checkpoints().size(), 13u);  // info writes nothing
  ASSERT_EQ(run({"store", "thin", path_, "--keep-last", "3", "--keep-every", "20", "--keep-steps", "14"}, &out), 0);
  EXPECT_NE(out.find("run 1: removed 5 of 13 checkpoints (steps 5, 15, 30, 35, 45)"), std::string::npos) << out;
  EXPECT_NE(out.find("step 10: --keep-steps 14; step 25: bisect probe window 27:39"), std::string::npos) << out;
  EXPECT_NE(out.find("(incremental vacuum)"), std::string::npos) << out;
  EXPECT_NE(out.find("freed "), std::string::npos) << out;
  EXPECT_EQ(checkpoints(), (std::vector<int64_t>{0, 10, 20, 25, 40, 50, 55, 60}));
  ASSERT_EQ(run({"store", "thin", path_, "--keep-last", "1", "--force"}, &out), 0);
  EXPECT_EQ(checkpoints(), (std::vector<int64_t>{0, 60}));
  EXPECT_EQ(run({"store", "verify", path_}, &out), 0) << out;
  EXPECT_EQ(test::file_size(WriterLock::lock_path(path_)), -1);  // let go
}

TEST_F(ThinCli, BadArgumentsAreExitTwoInOneLine) {
  const std::vector<std::vector<std::string>> bad = {
      {"store", "thin", path_},
      {"store", "thin", path_, "--keep-last", "0"},
      {"store", "thin", path_, "--keep-every", "-5"},
      {"store", "thin", path_, "--keep-last", "x"},
      {"store", "thin", path_, "--keep-last", "99999999999999999999999"},
      {"store", "thin", path_, "--keep-last", "2", "--keep-steps", "3,,4"},
      {"store", "thin", path_, "--keep-last", "2", "--keep-steps", "-3"},
      {"store", "thin", path_, "--force"},
      {"store", "thin", path_, "--keep-last", "2", "--run", "7"},
      {"store", "thin"},
      {"store", "info", path_, "--keep-every", "0"}};
  for (const auto& args : bad) {
    std::string out;
    const int rc = run(args, &out);
    EXPECT_EQ(rc, args.size() > 5 && args[5] == "--run" ? 3 : 2) << args.back() << ": " << out;
    EXPECT_LE(std::count(out.begin(), out.end(), '\n'), 0) << out;
  }
  EXPECT_EQ(checkpoints().size(), 13u);
}

TEST_F(ThinCli, AStoreBeingRecordedIsRefused) {
  std::string out;
  {
    WriterLock recording(path_, "a recording (rewind train)");
    EXPECT_EQ(run({"store", "thin", path_, "--keep-last", "1"}, &out), 3);
    EXPECT_EQ(out, "store " + path_ + ": a recording (rewind train), pid " + std::to_string(getpid()) +
                       " is writing it; try again once that has finished");
  }
  EXPECT_EQ(checkpoints().size(), 13u);
  EXPECT_EQ(run({"store", "thin", path_, "--keep-last", "1"}, &out), 0) << out;
  EXPECT_EQ(checkpoints(), (std::vector<int64_t>{0, 25, 60}));
}

// A running reader's checkpoint stays, --force or not, in one line each.
TEST_F(ThinCli, ACheckpointInUseIsKeptAndSaysWhoUsesIt) {
  std::string out;
  {
    const ReaderPin bisect(path_, 1, {33}, "bisect");
    ASSERT_EQ(run({"store", "thin", path_, "--keep-last", "1", "--force"}, &out), 0) << out;
    EXPECT_NE(out.find("\n  checkpoint 30 kept: in use by bisect (process " + std::to_string(getpid()) + ")\n"),
              std::string::npos) << out;
    EXPECT_EQ(checkpoints(), (std::vector<int64_t>{0, 30, 60}));
  }
  ASSERT_EQ(run({"store", "thin", path_, "--keep-last", "1", "--force"}, &out), 0) << out;
  EXPECT_EQ(out.find("in use"), std::string::npos) << out;
  EXPECT_EQ(checkpoints(), (std::vector<int64_t>{0, 60}));
}

}  // namespace
}  // namespace rwd::store
