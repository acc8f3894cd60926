// A corrupted store, a bad option, a store that may not be written and a stub, through the
// `rewind` binary: each is one line and its documented exit code, never a false divergence or
// failure verdict, and nothing stored is lost or overwritten.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <string>

#include "store/store.h"
#include "tests/common/cli_run.h"

namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;
using rwd::testing::run_shell;

// A model small enough that a step takes a few milliseconds.
const std::string kModel =
    " --vocab-size 64 --n-embd 32 --block-size 32 --threads 1 --log-every 1000 --checkpoint-every 5"
    " --digest-every 1";

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void tamper(const std::string& path, const std::string& sql) {
  rwd::store::Db db(path, SQLITE_OPEN_READWRITE);
  db.exec(sql, "planting corruption");
}

class StoreGuard : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = rwd::testing::temp_dir("guard");
    data_ = dir_ + "/train.bin";
    base_ = dir_ + "/base.db";
    ASSERT_EQ(rewind_cmd("data synth --tokens 20000 --vocab 64 -o " + data_).code, 0);
    const Cmd c = rewind_cmd("train --data " + data_ + " --record " + base_ + " --steps 15" + kModel);
    ASSERT_EQ(c.code, 0) << c.out;
  }
  static void TearDownTestSuite() { rwd::testing::remove_tree(dir_); }
  // A copy of the recording to damage.
  std::string copy(const std::string& name) {
    const std::string p = dir_ + "/" + name;
    EXPECT_EQ(run_shell("cp " + base_ + " " + p).code, 0);
    return p;
  }
  // Every reader of the damaged row says "store corrupted" with exit 3, naming `row`.
  void readers_say_corrupted(const std::string& s, const std::string& row) {
    const Cmd v = rewind_cmd("store verify " + s);
    EXPECT_EQ(v.code, 3) << v.out;
    EXPECT_NE(v.out.find("BAD " + row + ": row checksum mismatch"), std::string::npos) << v.out;
    const std::vector<std::string> readers = {
        "replay --store " + s + " --from 5 --to 9 --verify",
        "view " + s + " -o " + dir_ + "/page.html",
        "bisect --store " + s + " --find-window --fail nan --quiet",
    };
    for (const std::string& args : readers) {
      const Cmd c = rewind_cmd(args);
      EXPECT_EQ(c.code, 3) << args << "\n" << c.out;
      EXPECT_NE(c.out.find("rewind: error: store corrupted: " + s + ": " + row), std::string::npos) << args << "\n" << c.out;
      EXPECT_EQ(c.out.find("diverged"), std::string::npos) << args << "\n" << c.out;
      EXPECT_EQ(c.out.find("failure at step"), std::string::npos) << args << "\n" << c.out;
    }
  }
  static std::string dir_, data_, base_;
};
std::string StoreGuard::dir_, StoreGuard::data_, StoreGuard::base_;

TEST_F(StoreGuard, SoundRecordingVerifiesAndReplays) {
  const Cmd v = rewind_cmd("store verify " + base_);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_EQ(v.out.find("unchecked"), std::string::npos) << v.out;
  const Cmd r = rewind_cmd("replay --store " + base_ + " --from 5 --to 9 --verify");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST_F(StoreGuard, FlippedLossBitIsCorruptionNotDivergence) {
  const std::string s = copy("loss.db");
  tamper(s, "UPDATE steps SET loss_bits = (loss_bits | 1) - (loss_bits & 1) WHERE step = 7");
  readers_say_corrupted(s, "table steps, run 1 step 7");
}

TEST_F(StoreGuard, LossMadeNanIsCorruptionNotAFailure) {
  const std::string s = copy("nan.db");
  tamper(s, "UPDATE steps SET loss_bits = 2143289344 WHERE step = 8");
  readers_say_corrupted(s, "table steps, run 1 step 8");
}

TEST_F(StoreGuard, FlippedParamDigestIsCorruption) {
  const std::string s = copy("digest.db");
  tamper(s, "UPDATE steps SET param_digest = param_digest || 'x' WHERE step = 6");
  readers_say_corrupted(s, "table steps, run 1 step 6");
}

TEST_F(StoreGuard, FlippedConfigByteIsCorruptionNotAUsageError) {
  const std::string s = copy("config.db");
  tamper(s, "UPDATE runs SET config = replace(config, 'vocab_size', 'vocab_sZze')");
  readers_say_corrupted(s, "table runs, run 1");
}

TEST_F(StoreGuard, StoreWithoutChecksumsReadsAndSaysSo) {
  const std::string s = copy("v1.db");
  for (const char* t : {"runs", "steps", "checkpoints", "metrics", "probes", "kv"})
    tamper(s, std::string("ALTER TABLE ") + t + " DROP COLUMN row_sum");
  tamper(s, "PRAGMA user_version=1");
  const Cmd v = rewind_cmd("store verify " + s);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("unchecked: 15 rows of table steps carry no checksum"), std::string::npos) << v.out;
  EXPECT_EQ(rewind_cmd("store info " + s).code, 0);
  const Cmd r = rewind_cmd("replay --store " + s + " --from 5 --to 9 --verify");
  EXPECT_EQ(r.code, 0) << r.out;
}

// Options that would make a store its own readers refuse: refused, and no file is created.
TEST_F(StoreGuard, BadOptionsAreRefusedBeforeTheStoreIsCreated) {
  const std::string tiny = dir_ + "/tiny.bin";
  ASSERT_EQ(rewind_cmd("data synth --tokens 20 --vocab 64 -o " + tiny).code, 0);
  struct Case {
    std::string args, want;
  };
  const std::string s = dir_ + "/never.db";
  const std::vector<Case> cases = {
      {"--data " + data_ + " --checkpoint-every 0", "--checkpoint-every must be 1 or more, got 0"},
      {"--data " + data_ + " --checkpoint-every -1", "--checkpoint-every must be 1 or more, got -1"},
      {"--data " + tiny, "holds 20 tokens; a batch of block size 32 needs at least 34"},
      {"--data " + data_ + " --threads 100000", "--threads 100000 is more than the"},
      {"--data " + data_ + " --n-embd 1000000", "needs at least"},
  };
  for (const Case& c : cases) {
    // --threads last: the case's own --threads overrides the model's.
    const Cmd r = rewind_cmd("train --record " + s + " --steps 5" + kModel + " " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(exists(s)) << c.args << ": a store was created";
  }
}

TEST_F(StoreGuard, BisectJobsBeyondTheCoresAreCappedInOneLine) {
  const Cmd c = rewind_cmd("bisect --store " + base_ + " --window 5:9 --fail 'max(loss) > 1000' --jobs 1000 --quiet");
  EXPECT_NE(c.out.find("bisect: --jobs 1000 capped at "), std::string::npos) << c.out;
  EXPECT_NE(c.code, 137) << c.out;
}

TEST_F(StoreGuard, BisectReportThatIsAFileIsRefusedBeforeAProbe) {
  const std::string file = dir_ + "/report.txt";
  ASSERT_EQ(run_shell("echo keep > " + file).code, 0);
  const Cmd c = rewind_cmd("bisect --store " + base_ + " --window 5:9 --fail 'max(loss) > 1000' --quiet --report " + file);
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--report " + file + " is a file"), std::string::npos) << c.out;
  EXPECT_EQ(run_shell("grep -qx keep " + file).code, 0) << "the file was overwritten";
}

TEST_F(StoreGuard, MalformedFixIsRefusedBeforeAProbe) {
  const Cmd c = rewind_cmd("bisect --store " + base_ + " --find-window --fail 'max(loss) > 1000' --quiet --fix 'L*.H*.qk=bogus'");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("bisect: --fix 'L*.H*.qk=bogus': "), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("probes:"), std::string::npos) << c.out;
}

TEST_F(StoreGuard, RecordRefusesARealStoreAndReplacesAStub) {
  const std::string real = copy("real.db");
  const Cmd again = rewind_cmd("train --data " + data_ + " --record " + real + " --steps 5" + kModel);
  EXPECT_EQ(again.code, 3) << again.out;
  EXPECT_NE(again.out.find("already exists; refusing to overwrite it"), std::string::npos) << again.out;
  EXPECT_EQ(rewind_cmd("store verify " + real).code, 0);
  EXPECT_EQ(run_shell("cmp " + real + " " + base_).code, 0) << "the store was changed";

  // A 0-byte file and a table-less SQLite file with a hot journal of an empty database: what a
  // recording killed as it started could leave.
  const std::string empty = dir_ + "/empty.db", tableless = dir_ + "/tableless.db";
  ASSERT_EQ(run_shell(": > " + empty).code, 0);
  {
    rwd::store::Db db(tableless, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec("PRAGMA user_version=7", "writing page 1");
  }
  ASSERT_EQ(run_shell("printf '\\331\\325\\005\\371\\040\\241\\143\\327\\000\\000\\000\\000\\000\\000\\000\\000"
                      "\\000\\000\\000\\000' > " + tableless + "-journal").code, 0);
  for (const auto& [path, what] : {std::pair<std::string, std::string>{empty, "an empty file"},
                                   {tableless, "an SQLite file with no tables"}}) {
    const Cmd info = rewind_cmd("store info " + path);
    EXPECT_EQ(info.code, 3) << info.out;
    EXPECT_NE(info.out.find(what + ", not a store: nothing is stored in it"), std::string::npos) << info.out;
    const Cmd rec = rewind_cmd("train --data " + data_ + " --record " + path + " --steps 5" + kModel);
    EXPECT_EQ(rec.code, 0) << rec.out;
    EXPECT_NE(rec.out.find("record: " + path + " is " + what + "; nothing is stored in it, so it is replaced"),
              std::string::npos) << rec.out;
    EXPECT_EQ(rewind_cmd("store verify " + path).code, 0);
    EXPECT_FALSE(exists(path + "-journal"));
  }
}

// A store on a read-only mount, and on a full disk: every read works. Needs a tmpfs mount
// (root in a container that allows it); skipped otherwise.
TEST_F(StoreGuard, ReadsNeedNoWriteAccess) {
  const std::string m = dir_ + "/mnt";
  ASSERT_EQ(run_shell("mkdir -p " + m).code, 0);
  if (::mount("tmpfs", m.c_str(), "tmpfs", 0, "size=4m") != 0) GTEST_SKIP() << "cannot mount a tmpfs here";
  const std::string s = m + "/run.db";
  ASSERT_EQ(run_shell("cp " + base_ + " " + s).code, 0);
  const std::vector<std::string> reads = {"store info " + s, "store ls " + s, "store verify " + s,
                                          "replay --store " + s + " --from 5 --to 9 --verify"};
  run_shell("dd if=/dev/zero of=" + m + "/fill bs=4k 2>/dev/null");
  ASSERT_NE(run_shell("head -c 4096 /dev/zero > " + m + "/probe").code, 0) << "the disk is not full";
  for (const std::string& args : reads) {
    const Cmd c = rewind_cmd(args);
    EXPECT_EQ(c.code, 0) << "full disk: " << args << "\n" << c.out;
  }
  ASSERT_EQ(run_shell("rm -f " + m + "/fill " + s + "-shm " + s + "-wal").code, 0);
  ASSERT_EQ(::mount("tmpfs", m.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=4m"), 0);
  for (const std::string& args : reads) {
    const Cmd c = rewind_cmd(args);
    EXPECT_EQ(c.code, 0) << "read-only mount: " << args << "\n" << c.out;
  }
  ::umount2(m.c_str(), MNT_DETACH);
}

}  // namespace
