// Aimed bit flips, through the `rewind` binary: one recording (with a bisect's probes and kv
// rows), then trials that each flip one bit of one column of one row of a table that carries a
// row checksum, written through SQLite so the file stays a valid database. `store verify` must
// name the table (exit 3; run in this process, through cli::run_store), and every reader of that row must stop with "store corrupted"
// (exit 3): never "diverged" (4), a failure verdict, an internal (1) or a usage error (2).
// The choice of table, row, column and bit is pseudo-random with a fixed seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"
#include "tests/common/cli_run.h"
#include "tests/store/run_store_cli.h"

namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;
using rwd::testing::run_shell;

constexpr uint64_t kSeed = 20261202;
constexpr int kTrialsPerTable = 9;  // 6 tables: 54 trials
// A model small enough that a step takes a few milliseconds; checkpoints at 0, 10, 20, 30, 40.
const std::string kTrain =
    " --steps 40 --checkpoint-every 10 --checkpoint-wait --vocab-size 64 --n-embd 32 --block-size 32"
    " --threads 1 --digest-every 1 --log-every 1000";
// The bisect whose probes and kv rows the recording holds; rerun, it reads them from its cache.
const std::string kCachedBisect = " --window 10:19 --fail 'max(loss) > 3.5' --quiet";

// A table with a row checksum: its key columns, the value columns the checksum protects, and
// which rows the trials aim at (those the readers below read).
struct Table {
  std::string name, keys, values, rows;
};
const std::vector<Table> kTables = {
    {"runs", "id", "config plan meta", "1"},
    {"steps", "run step", "lr loss_bits grad_norm_bits param_digest batch_ref batch_hash rng_ref extra", "1"},
    // The checkpoint at 40 follows the last step: only `train --resume` reads it.
    {"checkpoints", "run step name", "blob dtype shape", "step <= 30"},
    // The run page always shows the monitors of the first and the last step.
    {"metrics", "run step key", "value", "key LIKE 'L%' AND step IN (0, 39)"},
    {"probes", "key", "job plan plan_hash window verdict metrics wall_s", "1"},
    {"kv", "run key", "value", "1"},
};

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  for (size_t at = 0; at < s.size();) {
    const size_t end = std::min(s.find(' ', at), s.size());
    out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// One flipped bit: where it is, and the window of steps the readers replay around it.
struct Flip {
  std::string table, row, column;
  bool key = false;  // a key column: the row moves (to another step, run or name)
  int64_t from = 10, to = 19;
};

// Flips one bit of one column of one row of `t` in the store at `path`. Flips that SQLite
// refuses (a key that exists, a NaN into a NOT NULL column) and empty or NULL values are drawn
// again.
Flip flip_one(const std::string& path, const Table& t, std::mt19937_64& rng) {
  rwd::store::Db db(path, SQLITE_OPEN_READWRITE);
  db.exec("PRAGMA ignore_check_constraints=1", "letting a flipped JSON text in");
  const std::vector<std::string> keys = words(t.keys);
  std::string quoted = "quote(" + keys[0] + ")";
  for (size_t k = 1; k < keys.size(); ++k) quoted += " || ' AND " + keys[k] + "=' || quote(" + keys[k] + ")";
  std::vector<std::string> rows;
  {
    rwd::store::Statement st(db, ("SELECT " + quoted + " FROM " + t.name + " WHERE " + t.rows + " ORDER BY 1").c_str());
    while (st.step()) rows.push_back(keys[0] + "=" + st.col_text(0));
  }
  if (rows.empty()) throw std::runtime_error("no row of table " + t.name + " to flip");
  const std::vector<std::string> values = words(t.values);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Flip f;
    f.table = t.name;
    f.row = rows[rng() % rows.size()];
    // A key column one time in four (the row moves), else a value column.
    f.key = rng() % 4 == 0;
    f.column = f.key ? keys[rng() % keys.size()] : values[rng() % values.size()];
    const std::string where = " WHERE " + f.row;
    std::string type, text;
    int64_t integer = 0;
    double real = 0;
    {
      // The window: the step's ten (steps, checkpoints), else 10:19.
      const std::string step = t.name == "steps" || t.name == "checkpoints" ? "step" : "10";
      rwd::store::Statement get(db, ("SELECT typeof(" + f.column + "), " + f.column + ", " + step + " FROM " +
                                     t.name + where).c_str());
      if (!get.step()) continue;
      type = get.col_text(0);
      if (type == "integer") integer = get.col_int(1);
      if (type == "real") real = get.col_double(1);
      if (type == "text") text = get.col_text(1);
      f.from = std::min<int64_t>(30, get.col_int(2) / 10 * 10);
      f.to = f.from + 9;
    }
    rwd::store::Statement set(db, ("UPDATE " + t.name + " SET " + f.column + "=?" + where).c_str());
    if (type == "integer") {
      set.bind(1, integer ^ (int64_t(1) << (rng() % 32)));
    } else if (type == "real") {
      uint64_t bits;
      std::memcpy(&bits, &real, sizeof bits);
      bits ^= uint64_t(1) << (rng() % 64);
      std::memcpy(&real, &bits, sizeof real);
      set.bind(1, real);
    } else if (type == "text" && !text.empty()) {
      text[rng() % text.size()] ^= static_cast<char>(1 << (rng() % 8));
      set.bind(1, text);
    } else {
      continue;  // NULL or empty: nothing stored to flip
    }
    try {
      set.run();
    } catch (const rwd::store::StoreError&) {
      continue;
    }
    return f;
  }
  throw std::runtime_error("no bit of table " + t.name + " could be flipped");
}

struct Reader {
  std::string name, args;
};

// The readers of a flipped row of `table` (window from:to), which must each say "store corrupted".
std::vector<Reader> readers_of(const Flip& f, const std::string& s, const std::string& page) {
  const std::string window = std::to_string(f.from) + ":" + std::to_string(f.to);
  const Reader replay{"replay", "replay --store " + s + " --from " + std::to_string(f.from) + " --to " +
                                    std::to_string(f.to) + " --verify"};
  const Reader bisect{"bisect", "bisect --store " + s + " --window " + window + " --fail 'max(loss) > 1000' --quiet"};
  const Reader cached{"bisect", "bisect --store " + s + kCachedBisect};
  const Reader view{"view", "view " + s + " -o " + page};
  if (f.table == "runs" || f.table == "steps") return {replay, bisect, view};
  if (f.table == "checkpoints") return {replay, bisect};
  if (f.table == "metrics") return {view};
  if (f.table == "probes") return {cached};
  return {view};  // kv: the run page lists every bisect job with its log and verdict
}

struct Outcome {
  Flip flip;
  Cmd verify;
  std::vector<std::pair<Reader, Cmd>> reads;
};

class RowFlipTrials : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = rwd::testing::temp_dir("rowflip");
    base_ = dir_ + "/base.db";
    const std::string data = dir_ + "/train.bin";
    ASSERT_EQ(rewind_cmd("data synth --tokens 300000 --vocab 64 -o " + data).code, 0);
    Cmd c = rewind_cmd("train --data " + data + " --record " + base_ + kTrain);
    ASSERT_EQ(c.code, 0) << c.out;
    c = rewind_cmd("bisect --store " + base_ + kCachedBisect);
    ASSERT_EQ(c.code, 0) << c.out;
    // The WAL into the main file: a trial copies one file.
    rwd::store::Db db(base_, SQLITE_OPEN_READWRITE);
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)", "checkpointing the WAL");
  }
  static void TearDownTestSuite() { rwd::testing::remove_tree(dir_); }
  inline static std::string dir_, base_;
};

TEST_F(RowFlipTrials, EveryFlippedRowIsCorruptionNeverAFinding) {
  {
    rwd::store::Db db(base_, SQLITE_OPEN_READONLY);
    ASSERT_GT(db.query_int("SELECT count(*) FROM probes", "counting probes"), 0);
    ASSERT_GT(db.query_int("SELECT count(*) FROM kv", "counting kv rows"), 0);
  }
  const int n = kTrialsPerTable * static_cast<int>(kTables.size());
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::atomic<int> next{0};
  // Two trials at a time: each is one to three short processes, mostly LibTorch's start-up.
  auto work = [&] {
    for (int i; (i = next++) < n;) {
      const Table& t = kTables[static_cast<size_t>(i) % kTables.size()];
      const std::string s = dir_ + "/trial" + std::to_string(i) + ".db";
      Outcome& o = outcomes[static_cast<size_t>(i)];
      try {
        if (run_shell("cp " + base_ + " " + s).code != 0) throw std::runtime_error("cannot copy the store");
        std::mt19937_64 rng(kSeed + static_cast<uint64_t>(i));
        o.flip = flip_one(s, t, rng);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
        continue;
      }
      for (const Reader& r : readers_of(o.flip, s, dir_ + "/page" + std::to_string(i) + ".html"))
        o.reads.emplace_back(r, rewind_cmd(r.args));
    }
  };
  std::thread other(work);
  work();
  other.join();
  // `rewind store verify`, in this process (one at a time: it prints to stdout).
  for (int i = 0; i < n; ++i) {
    Outcome& o = outcomes[static_cast<size_t>(i)];
    if (errors[static_cast<size_t>(i)].empty())
      o.verify.code = rwd::store::test::run_store_cli({"store", "verify", dir_ + "/trial" + std::to_string(i) + ".db"},
                                                     &o.verify.out);
  }

  struct Count {
    int trials = 0, verify = 0, values = 0, values_read = 0, keys = 0, keys_read = 0;
  };
  std::map<std::string, Count> counts;
  for (int i = 0; i < n; ++i) {
    const Outcome& o = outcomes[static_cast<size_t>(i)];
    ASSERT_TRUE(errors[static_cast<size_t>(i)].empty()) << "trial " << i << ": " << errors[static_cast<size_t>(i)];
    const Flip& f = o.flip;
    const std::string what = "trial " + std::to_string(i) + ": table " + f.table + ", " + f.row + ", column " + f.column;
    Count& c = counts[f.table];
    ++c.trials;
    const bool verified = o.verify.code == 3 && o.verify.out.find("BAD table " + f.table + ",") != std::string::npos;
    EXPECT_TRUE(verified) << what << "\n" << o.verify.out;
    c.verify += verified;
    bool all = true;
    for (const auto& [r, cmd] : o.reads) {
      const std::string msg = what + "\n" + r.args + "\n" + cmd.out;
      EXPECT_NE(cmd.code, 4) << msg;
      EXPECT_EQ(cmd.out.find("diverged"), std::string::npos) << msg;
      EXPECT_EQ(cmd.out.find("failure at step"), std::string::npos) << msg;
      // A moved checkpoint row leaves its checkpoint without a tensor: read as missing (a data
      // error, train/ reads the checkpoint), not as a bad row.
      const bool moved_tensor = f.key && f.table == "checkpoints";
      const bool corrupted = cmd.code == 3 && (moved_tensor || cmd.out.find("rewind: error: store corrupted: ") != std::string::npos);
      // A moved probe, kv or metrics row is not read at all: a probe cache miss, a job or a
      // heat-map cell fewer; nor is a moved checkpoint RNG tensor, which a restore goes without.
      const bool unread = f.key && cmd.code == 0 &&
                          (f.table == "probes" || f.table == "kv" || f.table == "metrics" ||
                           (f.table == "checkpoints" && f.row.find("name='rng/") != std::string::npos));
      EXPECT_TRUE(corrupted || unread) << msg;
      all &= corrupted;
    }
    (f.key ? c.keys : c.values) += 1;
    (f.key ? c.keys_read : c.values_read) += all;
  }
  int total = 0;
  for (const auto& [table, c] : counts) {
    total += c.trials;
    std::printf("table %-11s %d trials: verify named %d; every reader of the row said corrupted in %d of %d "
                "value flips, %d of %d key flips\n",
                table.c_str(), c.trials, c.verify, c.values_read, c.values, c.keys_read, c.keys);
  }
  EXPECT_GE(total, 50);
}

// Schema version 0 is no store rewind wrote: every command, read-only or read-write, refuses it
// with the same line, exit 3 (the migration path is never reached).
TEST_F(RowFlipTrials, SchemaVersionZeroIsOneLineEverywhere) {
  const std::string s = dir_ + "/v0.db";
  ASSERT_EQ(run_shell("cp " + base_ + " " + s).code, 0);
  {
    rwd::store::Db db(s, SQLITE_OPEN_READWRITE);
    db.exec("PRAGMA user_version=0", "stamping version 0");
  }
  const std::string want = "rewind: error: store " + s + ": damaged store: schema version 0 (rewind stores are version 1 to " +
                           std::to_string(rwd::store::kSchemaVersion) + ")";
  for (const std::string& args : {"store verify " + s, "store info " + s, "replay --store " + s + " --from 10 --to 19 --verify",
                                  "train --resume " + s + " --steps 45", "store thin " + s + " --keep-last 1",
                                  "view " + s + " -o " + dir_ + "/v0.html"}) {
    const Cmd c = rewind_cmd(args);
    EXPECT_EQ(c.code, 3) << args << "\n" << c.out;
    EXPECT_NE(c.out.find(want), std::string::npos) << args << "\n" << c.out;
  }
  rwd::store::Db db(s, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.query_int("PRAGMA user_version", "reading the version"), 0) << "a command migrated it";
}

}  // namespace
