// End to end through the `rewind` binary: record, replay --verify, tampering, a SIGKILLed
// recorder resumed bitwise, `rewind step`, and the one-line errors of bad requests.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "store/store.h"
#include "tests/common/cli_run.h"
#include "tests/common/store_poll.h"

namespace {

const std::string kBin = REWIND_BIN;
// A model small enough that a step takes a few milliseconds on one thread.
const std::string kModel = " --vocab-size 64 --n-embd 32 --block-size 32 --threads 1 --log-every 1000";

using rwd::testing::Cmd;

Cmd sh(const std::string& cmd) { return rwd::testing::run_shell(cmd); }

class RecordReplay : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/rewind_rr_XXXXXX";
    dir_ = mkdtemp(tmpl);
    data_ = dir_ + "/train.bin";
    store_ = dir_ + "/run.db";
    ASSERT_EQ(sh(kBin + " data synth --tokens 200000 --vocab 64 -o " + data_).code, 0);
    Cmd r = sh(kBin + " train --data " + data_ + " --steps 60 --checkpoint-every 20 --record " + store_ + kModel);
    ASSERT_EQ(r.code, 0) << r.out;
    // Checkpoints at 0, 20, 40 and the final one at 60, with what they cost the run.
    EXPECT_NE(r.out.find("checkpoints: 4, training spent "), std::string::npos) << r.out;
  }
  static void TearDownTestSuite() { rwd::testing::remove_tree(dir_); }

  // A copy of the recording with `sql` applied to it (the original stays untouched).
  static std::string altered_copy(const std::string& name, const std::string& sql) {
    const std::string copy = dir_ + "/" + name;
    EXPECT_EQ(sh("cp " + store_ + " " + copy).code, 0);
    rwd::store::Db db(copy, SQLITE_OPEN_READWRITE);
    db.exec(sql, "alter the copy");
    return copy;
  }

  static std::vector<uint32_t> loss_bits(const std::string& path, int64_t from, int64_t to) {
    auto s = rwd::store::Store::open(path, rwd::store::Mode::kReadOnly);
    std::vector<uint32_t> out;
    for (const auto& st : s.steps(1, from, to)) out.push_back(st.loss_bits);
    return out;
  }

  static std::string dir_, data_, store_;
};
std::string RecordReplay::dir_, RecordReplay::data_, RecordReplay::store_;

TEST_F(RecordReplay, WindowsAtAndBetweenCheckpointsReplayBitwise) {
  for (const char* w : {"--from 20 --to 29", "--from 25 --to 34", "--from 0 --to 5", "--from 41 --to 59"}) {
    Cmd r = sh(kBin + " replay --store " + store_ + " " + w + " --verify");
    EXPECT_EQ(r.code, 0) << w << "\n" << r.out;
    EXPECT_NE(r.out.find("bitwise identical"), std::string::npos) << r.out;
  }
}

// A parent process hands what it computed of the token file to the workers it starts
// (REWIND_TOKEN_FILE_FACTS: file identity, fingerprint, largest token), which then trust it
// instead of reading the file again; facts for another identity are ignored.
TEST_F(RecordReplay, TokenFileFactsFromTheEnvironmentAreTrustedOnlyForTheSameFile) {
  struct stat st {};
  ASSERT_EQ(stat(data_.c_str(), &st), 0);
  auto facts = [&](uint64_t ino, const std::string& fingerprint) {
    return "REWIND_TOKEN_FILE_FACTS='" + std::to_string(st.st_dev) + "," + std::to_string(ino) + "," +
           std::to_string(st.st_size) + "," + std::to_string(st.st_mtim.tv_sec) + "," +
           std::to_string(st.st_mtim.tv_nsec) + "," + fingerprint + ",63' ";
  };
  const std::string replay = kBin + " replay --store " + store_ + " --from 20 --to 21 --verify";
  // A wrong fingerprint for this very file is believed: the replay refuses the dataset.
  Cmd wrong = sh(facts(st.st_ino, "200000:0123456789abcdef") + replay);
  EXPECT_EQ(wrong.code, 3) << wrong.out;
  EXPECT_NE(wrong.out.find("differs from the recording"), std::string::npos) << wrong.out;
  // The same claim about another inode is ignored: the file is hashed and matches.
  Cmd other = sh(facts(st.st_ino + 1, "200000:0123456789abcdef") + replay);
  EXPECT_EQ(other.code, 0) << other.out;
}

// The rows are altered with their checksum cleared (an unchecked row, as those of a store made
// before row checksums): the value is believed, and the replay reports the difference as a
// divergence at its step. With the checksum kept, the readers say "store corrupted"
// (tests/cli/store_guard_cli_test.cpp).
TEST_F(RecordReplay, TamperedLossIsReportedAtItsStep) {
  const std::string copy =
      altered_copy("tampered.db", "UPDATE steps SET loss_bits = loss_bits + 1, row_sum = NULL WHERE step = 27");
  Cmd r = sh(kBin + " replay --store " + copy + " --from 25 --to 30 --verify");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("replay diverged at step 27: loss"), std::string::npos) << r.out;
}

// Digests are recorded as d2 (device-side word sums); a digest recorded before d2 (16 hex
// digits, no prefix) is recomputed the old way, FNV-1a over the bytes, for the comparison.
TEST_F(RecordReplay, TamperedDigestIsReportedInTheFormItWasRecordedIn) {
  const std::string d2 = altered_copy("digest_d2.db",
                                      "UPDATE steps SET param_digest = 'd2:0123456789abcdef', row_sum = NULL WHERE step = 27");
  Cmd r = sh(kBin + " replay --store " + d2 + " --from 25 --to 30 --verify");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("replay diverged at step 27: parameter digest recorded d2:0123456789abcdef vs replayed d2:"),
            std::string::npos) << r.out;
  const std::string legacy = altered_copy("digest_fnv.db",
                                          "UPDATE steps SET param_digest = '0123456789abcdef', row_sum = NULL WHERE step = 27");
  r = sh(kBin + " replay --store " + legacy + " --from 25 --to 30 --verify");
  EXPECT_EQ(r.code, 4) << r.out;
  const size_t at = r.out.find("parameter digest recorded 0123456789abcdef vs replayed ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string replayed = r.out.substr(at + 55, 16);
  EXPECT_EQ(replayed.find_first_not_of("0123456789abcdef"), std::string::npos) << r.out;
}

TEST_F(RecordReplay, RunFromAnotherVersionOrProcessorReplaysWithAWarning) {
  Cmd same = sh(kBin + " replay --store " + store_ + " --from 20 --to 21 --verify");
  EXPECT_EQ(same.code, 0) << same.out;
  EXPECT_EQ(same.out.find("warning:"), std::string::npos) << same.out;

  const std::string old = altered_copy(
      "old_numerics.db", "UPDATE runs SET meta = json_set(meta, '$.numerics', 1, '$.rewind_version', '0.1.0'), row_sum = NULL");
  Cmd r = sh(kBin + " replay --store " + old + " --from 20 --to 21 --verify");
  EXPECT_EQ(r.code, 0) << r.out;  // a warning, not an error: the bits are still this build's
  EXPECT_NE(r.out.find("warning: run 1 was recorded by rewind 0.1.0 (numerics 1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("bitwise identical"), std::string::npos) << r.out;
  const size_t first = r.out.find("warning:");
  EXPECT_EQ(r.out.find("warning:", first + 1), std::string::npos) << "one warning only:\n" << r.out;

  // Another processor: BLAS (or the GPU) may pick other kernels, so replay says so.
  const std::string moved =
      altered_copy("other_cpu.db", "UPDATE runs SET meta = json_set(meta, '$.device_name', 'Imaginary CPU 9000'), row_sum = NULL");
  Cmd m = sh(kBin + " replay --store " + moved + " --from 20 --to 21 --verify");
  EXPECT_EQ(m.code, 0) << m.out;
  EXPECT_NE(m.out.find("warning: run 1 was recorded on Imaginary CPU 9000; this is "), std::string::npos) << m.out;
}

TEST_F(RecordReplay, KilledRecorderVerifiesReplaysAndResumesBitwise) {
  const std::string whole = dir_ + "/whole.db", killed = dir_ + "/killed.db";
  const std::string args = " train --data " + data_ + " --steps 300 --checkpoint-every 20" + kModel;
  ASSERT_EQ(sh(kBin + args + " --record " + whole).code, 0);
  const pid_t pid = rwd::testing::spawn_shell(kBin + args + " --record " + killed + " >/dev/null 2>&1");
  // Kill once a few checkpoints exist but before the end (a loaded machine may take a while).
  EXPECT_TRUE(rwd::testing::wait_for_step(killed, 70));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "recorder finished before it could be killed";

  EXPECT_EQ(sh(kBin + " store verify " + killed).code, 0);
  int64_t last;
  {
    auto s = rwd::store::Store::open(killed, rwd::store::Mode::kReadOnly);
    const auto range = s.step_range(1);
    ASSERT_TRUE(range.has_value()) << "killed before its first step was committed";
    last = range->second;
  }
  ASSERT_LT(last, 299);
  Cmd rp = sh(kBin + " replay --store " + killed + " --from " + std::to_string(last - 5) + " --to " +
              std::to_string(last) + " --verify");
  EXPECT_EQ(rp.code, 0) << rp.out;
  Cmd rs = sh(kBin + " train --resume " + killed + " --steps 300");
  ASSERT_EQ(rs.code, 0) << rs.out;
  EXPECT_EQ(loss_bits(killed, 0, 299), loss_bits(whole, 0, 299));
  EXPECT_EQ(loss_bits(killed, 0, 299).size(), 300u);
}

// A checkpoint due every step: with --checkpoint-wait every one is taken; without it, those
// that find the writer full are deferred (how many depends on timing), step 0 and the last
// are always there, and every window still replays bitwise from its nearest checkpoint.
TEST_F(RecordReplay, BusyWriterDefersCheckpointsUnlessAskedToWait) {
  auto checkpoint_steps = [](const std::string& path) {
    auto s = rwd::store::Store::open(path, rwd::store::Mode::kReadOnly);
    return s.checkpoint_steps(1);
  };
  const std::string args = " train --data " + data_ + " --steps 30 --checkpoint-every 1" + kModel;
  const std::string waited = dir_ + "/ckpt_wait.db", deferred = dir_ + "/ckpt_defer.db";
  Cmd w = sh(kBin + args + " --checkpoint-wait --record " + waited);
  ASSERT_EQ(w.code, 0) << w.out;
  EXPECT_NE(w.out.find("checkpoints: 31, training spent "), std::string::npos) << w.out;
  EXPECT_EQ(w.out.find("taken late"), std::string::npos) << w.out;
  std::vector<int64_t> all(31);
  for (int i = 0; i <= 30; ++i) all[i] = i;
  EXPECT_EQ(checkpoint_steps(waited), all);

  Cmd d = sh(kBin + args + " --record " + deferred);
  ASSERT_EQ(d.code, 0) << d.out;
  const std::vector<int64_t> got = checkpoint_steps(deferred);
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got.front(), 0);
  EXPECT_EQ(got.back(), 30);
  if (got.size() < 31) {
    EXPECT_NE(d.out.find(" taken late, by up to "), std::string::npos) << d.out;
  }
  EXPECT_EQ(loss_bits(deferred, 0, 29), loss_bits(waited, 0, 29));
  Cmd rp = sh(kBin + " replay --store " + deferred + " --from 0 --to 29 --verify");
  EXPECT_EQ(rp.code, 0) << rp.out;
  EXPECT_NE(rp.out.find("bitwise identical"), std::string::npos) << rp.out;
}

TEST_F(RecordReplay, StepProbeAllFp32DiffersAndRecordedPlanIsExactlyZero) {
  const std::string a = dir_ + "/all.json", z = dir_ + "/zero.json";
  Cmd r1 = sh(kBin + " step --store " + store_ + " --step 30 --fp32 all --json " + a);
  ASSERT_EQ(r1.code, 0) << r1.out;
  Cmd r2 = sh(kBin + " step --store " + store_ + " --step 30 --fp32 'L0.H0.pv=low' --json " + z);
  ASSERT_EQ(r2.code, 0) << r2.out;
  auto read = [](const std::string& p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
  };
  auto ja = read(a), jz = read(z);
  ASSERT_EQ(ja["heads"].size(), 8u);
  double total = 0;
  for (const auto& h : ja["heads"]) {
    for (const char* k : {"o_mean", "o_max_abs", "delta_sum", "dwq_norm"}) ASSERT_TRUE(std::isfinite(h[k].get<double>()));
    total += h["o_max_abs"].get<double>() + std::fabs(h["delta_sum"].get<double>());
  }
  EXPECT_GT(total, 0.0);
  EXPECT_NE(ja["loss_lp"].get<double>(), ja["loss_hp"].get<double>());
  for (const auto& h : jz["heads"]) {
    for (const char* k : {"o_mean", "o_max_abs", "delta_sum", "dwq_norm"}) EXPECT_EQ(h[k].get<double>(), 0.0) << k;
  }
  EXPECT_EQ(jz["loss_lp"].get<double>(), jz["loss_hp"].get<double>());
}

// A plan that rounds stochastically records and replays bit for bit: the random bits are a
// function of the run's seed, the step, the micro-batch and the layer (kernels/
// stochastic_round.h), so a window replayed from a checkpoint draws what the recording drew,
// micro-batch by micro-batch. The bits are used: the losses differ from the default plan's.
TEST_F(RecordReplay, StochasticRoundingPlanReplaysBitwise) {
  const std::string sr = dir_ + "/sr.db", plain = dir_ + "/sr_plain.db";
  const std::string args = " train --data " + data_ + " --steps 12 --checkpoint-every 5 --gradient-accumulation-steps 2";
  Cmd r = sh(kBin + args + " --plan 'pv=sr;L0.acc=sr;L1.H0.qk=sr' --record " + sr + kModel);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(sh(kBin + args + " --record " + plain + kModel).code, 0);
  Cmd v = sh(kBin + " replay --store " + sr + " --from 5 --to 11 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("bitwise identical"), std::string::npos) << v.out;
  const std::vector<uint32_t> a = loss_bits(sr, 1, 11), b = loss_bits(plain, 1, 11);
  ASSERT_EQ(a.size(), 11u);
  EXPECT_NE(a, b) << "pv=sr trained as the default plan does";
}

TEST_F(RecordReplay, PlanOverrideGivesDivergenceCurveNotFailure) {
  Cmd r = sh(kBin + " replay --store " + store_ + " --from 20 --to 25 --verify --plan 'all=fp32'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("differs from the recording"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("divergence curve stored"), std::string::npos) << r.out;
}

// A checkpoint row moved to another step (its step column changed) is corruption, named so, for
// a row the restore needs (a parameter) and for one it could go without (the CPU generator):
// the checkpoint's manifest row lists what it holds.
TEST_F(RecordReplay, MovedCheckpointRowIsCorruption) {
  const std::string param = altered_copy("moved_param.db",
      "UPDATE checkpoints SET step = 21 WHERE step = 20 AND name = "
      "(SELECT min(name) FROM checkpoints WHERE step = 20 AND name LIKE 'param/%')");
  const std::string rng = altered_copy("moved_rng.db",
      "UPDATE checkpoints SET step = 21 WHERE step = 20 AND name = 'rng/cpu'");
  for (const std::string& path : {param, rng}) {
    Cmd r = sh(kBin + " replay --store " + path + " --from 20 --to 22 --verify");
    EXPECT_EQ(r.code, 3) << r.out;
    EXPECT_NE(r.out.find("store corrupted"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("moved to another step"), std::string::npos) << r.out;
  }
  Cmd r = sh(kBin + " replay --store " + rng + " --from 20 --to 22 --verify");
  EXPECT_NE(r.out.find("'rng/cpu'"), std::string::npos) << r.out;
  // The untouched store replays the same window bitwise.
  EXPECT_EQ(sh(kBin + " replay --store " + store_ + " --from 20 --to 22 --verify").code, 0);
}

TEST_F(RecordReplay, BadRequestsFailWithOneLineAndNothingChanges) {
  Cmd out_of_range = sh(kBin + " replay --store " + store_ + " --from 50 --to 70");
  EXPECT_EQ(out_of_range.code, 2) << out_of_range.out;
  EXPECT_NE(out_of_range.out.find("outside the recording"), std::string::npos);

  const std::string other = dir_ + "/other.bin";
  ASSERT_EQ(sh(kBin + " data synth --tokens 200000 --vocab 64 --seed 9 -o " + other).code, 0);
  Cmd wrong_data = sh(kBin + " replay --store " + store_ + " --from 20 --to 22 --data " + other);
  EXPECT_EQ(wrong_data.code, 3) << wrong_data.out;
  EXPECT_NE(wrong_data.out.find("differs from the recording"), std::string::npos);

  // A store whose checkpoints are gone (`train --checkpoint-every 0`, which would make one, is
  // refused before anything is written).
  const std::string nock = altered_copy("nock.db", "DELETE FROM checkpoints");
  Cmd missing = sh(kBin + " replay --store " + nock + " --from 1 --to 3");
  EXPECT_EQ(missing.code, 3) << missing.out;
  EXPECT_NE(missing.out.find("missing checkpoint"), std::string::npos) << missing.out;

  Cmd exists = sh(kBin + " train --data " + data_ + " --steps 2 --record " + store_ + kModel);
  EXPECT_EQ(exists.code, 3) << exists.out;
  EXPECT_EQ(loss_bits(store_, 0, 59).size(), 60u);

  Cmd bad_plan = sh(kBin + " train --data " + data_ + " --steps 2 --plan 'L9.H0.pv=fp32'" + kModel);
  EXPECT_EQ(bad_plan.code, 2) << bad_plan.out;
  EXPECT_NE(bad_plan.out.find("position"), std::string::npos) << bad_plan.out;

  Cmd not_store = sh(kBin + " replay --store " + data_ + " --from 0 --to 1");
  EXPECT_EQ(not_store.code, 3) << not_store.out;
  for (const Cmd* r : {&out_of_range, &wrong_data, &missing, &bad_plan, &not_store}) {
    std::string err = r->out.substr(r->out.find("rewind: error:"));
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

}  // namespace
