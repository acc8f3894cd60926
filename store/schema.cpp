// The rewind store schema (version 1 and the migrations to the current version), the checks
// that recognize a store. Foreign keys tie every blob reference to the blobs table.
#include "store/schema.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "store/store.h"

namespace rwd::store {
namespace {

// Tables of schema version 1. Sizes are bytes; timestamps ISO-8601 UTC text.
// blobs.shuffle: element size of the byte shuffle applied per chunk before zstd (1 = none).
// blob_chunks' foreign key is deferred so that a blob's frames can be inserted before its row
// (the row needs the total stored size); both land in the same transaction.
const char* const kSchemaV1 = R"sql(
CREATE TABLE runs(
  id INTEGER PRIMARY KEY,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  config TEXT NOT NULL CHECK (json_valid(config)),
  plan TEXT NOT NULL,
  meta TEXT NOT NULL CHECK (json_valid(meta)));
CREATE TABLE blobs(
  hash TEXT PRIMARY KEY,
  raw_size INTEGER NOT NULL CHECK (raw_size >= 0),
  stored_size INTEGER NOT NULL,
  n_chunks INTEGER NOT NULL CHECK (n_chunks >= 1),
  level INTEGER NOT NULL,
  shuffle INTEGER NOT NULL CHECK (shuffle IN (1, 2, 4, 8))) WITHOUT ROWID;
CREATE TABLE blob_chunks(
  hash TEXT NOT NULL REFERENCES blobs(hash) DEFERRABLE INITIALLY DEFERRED,
  idx INTEGER NOT NULL,
  frame BLOB NOT NULL,
  UNIQUE (hash, idx));
CREATE TABLE steps(
  run INTEGER NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  lr REAL NOT NULL,
  loss_bits INTEGER NOT NULL,
  grad_norm_bits INTEGER NOT NULL,
  param_digest TEXT,
  batch_ref TEXT REFERENCES blobs(hash),
  batch_hash TEXT NOT NULL,
  rng_ref TEXT REFERENCES blobs(hash),
  extra TEXT CHECK (extra IS NULL OR json_valid(extra)),
  PRIMARY KEY (run, step)) WITHOUT ROWID;
CREATE TABLE checkpoints(
  run INTEGER NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  name TEXT NOT NULL,
  blob TEXT NOT NULL REFERENCES blobs(hash),
  dtype TEXT NOT NULL,
  shape TEXT NOT NULL,
  PRIMARY KEY (run, step, name)) WITHOUT ROWID;
CREATE TABLE tensors(
  run INTEGER NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  layer INTEGER NOT NULL,
  head INTEGER NOT NULL,
  name TEXT NOT NULL,
  dtype TEXT NOT NULL,
  shape TEXT NOT NULL,
  blob TEXT NOT NULL REFERENCES blobs(hash),
  PRIMARY KEY (run, step, layer, head, name)) WITHOUT ROWID;
CREATE TABLE metrics(
  run INTEGER NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  key TEXT NOT NULL,
  value REAL,
  PRIMARY KEY (run, step, key)) WITHOUT ROWID;
CREATE TABLE probes(
  key TEXT PRIMARY KEY,
  job TEXT NOT NULL,
  plan TEXT NOT NULL,
  plan_hash TEXT NOT NULL,
  window TEXT NOT NULL,
  verdict TEXT NOT NULL,
  metrics TEXT NOT NULL CHECK (json_valid(metrics)),
  wall_s REAL NOT NULL,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))) WITHOUT ROWID;
CREATE INDEX probes_by_job ON probes(job);
CREATE TABLE kv(
  run INTEGER NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (run, key)) WITHOUT ROWID;
)sql";

const char* const kTables[] = {"runs",    "blobs",   "blob_chunks", "steps", "checkpoints",
                               "tensors", "metrics", "probes",      "kv"};

// The columns of version 1's tables, as the readers name them.
const std::pair<std::string, std::string> kColumnsV1[] = {
    {"runs", "id created config plan meta"},
    {"blobs", "hash raw_size stored_size n_chunks level shuffle"},
    {"blob_chunks", "hash idx frame"},
    {"steps", "run step lr loss_bits grad_norm_bits param_digest batch_ref batch_hash rng_ref extra"},
    {"checkpoints", "run step name blob dtype shape"},
    {"tensors", "run step layer head name dtype shape blob"},
    {"metrics", "run step key value"},
    {"probes", "key job plan plan_hash window verdict metrics wall_s created"},
    {"kv", "run key value"}};

// Tables whose rows carry a checksum (row_sum.h) since version 2.
const char* const kSummedTables[] = {"runs", "steps", "checkpoints", "metrics", "probes", "kv"};

// Version 2: a row_sum column in every table a replay or a verdict reads. ADD COLUMN rewrites
// no row: rows already stored keep a NULL checksum and read as unchecked.
void migrate_1_to_2(Db& db) {
  for (const char* table : kSummedTables) {
    db.exec(std::string("ALTER TABLE ") + table + " ADD COLUMN row_sum INTEGER",
            "adding row checksums");
  }
}

// A migration rewrites a store of version `from` into version `from + 1`. A new store is
// version 1's tables with every migration applied, so both reach the same schema.
struct Migration {
  int from;
  std::function<void(Db&)> apply;
};
const std::vector<Migration>& migrations() {
  static const std::vector<Migration> kMigrations = {{1, migrate_1_to_2}};
  return kMigrations;
}

// The oldest version this rewind reads without migrating it (read-only opens): version 1 lacks
// only the checksums, which its readers then skip.
constexpr int kOldestReadable = 1;

}  // namespace

void precheck_store_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw data_error("store " + path + ": no such file");
  if (S_ISDIR(st.st_mode)) throw data_error("store " + path + ": is a directory, not a store");
  if (!S_ISREG(st.st_mode)) throw data_error("store " + path + ": not a regular file");
}

void check_store_header(Db& db) {
  const std::string& path = db.path();
  // Read through the connection's own file handle, never a descriptor of our own: closing any
  // descriptor of the file drops every POSIX lock this process holds on it, the SHARED lock of
  // its other connections included. A process that then closed its last connection to the
  // store would take the EXCLUSIVE lock, checkpoint and delete the WAL that a recording in
  // this process goes on appending to, and the store would end up malformed.
  sqlite3_file* file = nullptr;
  if (sqlite3_file_control(db.get(), "main", SQLITE_FCNTL_FILE_POINTER, &file) != SQLITE_OK ||
      file == nullptr || file->pMethods == nullptr) {
    throw data_error("store " + path + ": cannot read the file");
  }
  // The SQLite header: 16 magic bytes, then the page size (big-endian; 1 means 65536). A file
  // shorter than the header reads as zeros past its end (SQLITE_IOERR_SHORT_READ).
  unsigned char header[100] = {};
  const int rc = file->pMethods->xRead(file, header, sizeof header, 0);
  if (rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ) {
    throw data_error("store " + path + ": cannot read the file");
  }
  sqlite3_int64 size = 0;
  if (file->pMethods->xFileSize(file, &size) != SQLITE_OK) {
    throw data_error("store " + path + ": cannot read the file");
  }
  static const char kMagic[] = "SQLite format 3";  // 15 chars + NUL = 16 bytes
  if (rc != SQLITE_OK || std::memcmp(header, kMagic, 16) != 0) {
    throw data_error("store " + path + ": not a rewind store (not an SQLite database)");
  }
  long page = (header[16] << 8) | header[17];
  if (page == 1) page = 65536;
  if (page < 512 || (page & (page - 1)) != 0) {
    throw data_error("store " + path + ": not a rewind store (corrupt SQLite header)");
  }
  // In-header page count (offset 28), trusted by SQLite when the change counter (24) matches
  // offset 92. Without a WAL the main file must hold every page, else it was truncated.
  auto be32 = [&](int o) {
    return (uint32_t(header[o]) << 24) | (uint32_t(header[o + 1]) << 16) |
           (uint32_t(header[o + 2]) << 8) | uint32_t(header[o + 3]);
  };
  struct stat wal;
  const bool has_wal = ::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
  const uint32_t pages = be32(28);
  if (!has_wal && pages != 0 && be32(24) == be32(92) && static_cast<int64_t>(pages) * page > size) {
    throw data_error("store " + path + ": truncated (" + std::to_string(size) + " bytes, its header says " +
                     std::to_string(int64_t(pages) * page) + ")");
  }
  // A part page at the end beside a WAL is what a WAL checkpoint cut short (the disk filled
  // while it extended the file, e.g. as the recorder's last connection closed): the WAL still
  // holds every page it was copying, so the store reads whole.
  if (!has_wal && size % page != 0) {
    throw data_error("store " + path + ": truncated or corrupt (" + std::to_string(size) +
                     " bytes is not a whole number of " + std::to_string(page) + "-byte pages)");
  }
}

void configure_connection(Db& db, Mode mode, const StoreOptions& options) {
  int rc = sqlite3_busy_timeout(db.get(), options.busy_timeout_ms);
  if (rc != SQLITE_OK) db.fail(rc, "setting busy timeout");
  db.exec("PRAGMA foreign_keys=ON", "enabling foreign keys");
  if (mode == Mode::kReadWrite) {
    db.exec("PRAGMA synchronous=NORMAL", "setting synchronous");
    rc = sqlite3_wal_autocheckpoint(db.get(), std::max(0, options.wal_autocheckpoint));
    if (rc != SQLITE_OK) db.fail(rc, "setting the WAL auto-checkpoint");
    // Once checkpointed, a WAL that grew to hold a whole checkpoint's blobs is cut back to
    // 64 MiB instead of keeping its peak size on disk until the store is closed.
    db.exec("PRAGMA journal_size_limit=67108864", "limiting the WAL size");
  }
}

void create_schema(Db& db, const StoreOptions& options) {
  db.exec("PRAGMA page_size=" + std::to_string(options.page_size), "setting page size");
  // Before the first table, the only time it can be set without a VACUUM: pages that deleted
  // checkpoints free can be given back to the file system by `store thin` with an
  // incremental vacuum instead of rewriting the whole file. It costs one pointer-map page per
  // ~3300 pages (0.03%) and changes nothing a reader sees, so the schema version stays.
  db.exec("PRAGMA auto_vacuum=INCREMENTAL", "setting incremental auto-vacuum");
  {
    Statement wal(db, "PRAGMA journal_mode=WAL");
    if (!wal.step() || wal.col_text(0) != "wal") {
      throw data_error("store " + db.path() + ": cannot switch to WAL journal mode");
    }
  }
  Transaction txn(db);
  db.exec(kSchemaV1, "creating tables");
  for (const Migration& m : migrations()) m.apply(db);
  db.exec("PRAGMA application_id=" + std::to_string(kApplicationId), "stamping application id");
  db.exec("PRAGMA user_version=" + std::to_string(kSchemaVersion), "stamping schema version");
  txn.commit();
}

int check_schema(Db& db, Mode mode) {
  const std::string where = "store " + db.path() + ": ";
  int64_t app = db.query_int("PRAGMA application_id", "reading application id");
  if (app != kApplicationId) {
    throw data_error(where + "not a rewind store (SQLite database without rewind tables)");
  }
  int version = static_cast<int>(db.query_int("PRAGMA user_version", "reading schema version"));
  if (version > kSchemaVersion) {
    throw data_error(where + "schema version " + std::to_string(version) +
                     " is newer than this rewind supports (" + std::to_string(kSchemaVersion) +
                     "); upgrade rewind");
  }
  if (version < kOldestReadable) {
    // No rewind wrote such a store (create stamps the version with the tables, in one
    // transaction): the same answer read-only and read-write.
    throw data_error(where + "damaged store: schema version " + std::to_string(version) +
                     " (rewind stores are version " + std::to_string(kOldestReadable) + " to " +
                     std::to_string(kSchemaVersion) + ")");
  }
  if (version < kSchemaVersion && mode == Mode::kReadWrite) {
    Transaction txn(db);
    while (version < kSchemaVersion) {
      const Migration* m = nullptr;
      for (const Migration& cand : migrations()) {
        if (cand.from == version) m = &cand;
      }
      if (!m) {
        throw data_error(where + "no migration from schema version " + std::to_string(version));
      }
      m->apply(db);
      ++version;
      db.exec("PRAGMA user_version=" + std::to_string(version), "stamping schema version");
    }
    txn.commit();
  }
  for (const char* table : kTables) {
    Statement st(db, "SELECT 1 FROM sqlite_schema WHERE type='table' AND name=?");
    st.bind(1, std::string(table));
    if (!st.step()) throw data_error(where + "damaged store: table '" + table + "' is missing");
  }
  // Every column the readers name, so that a table rebuilt without one is refused here, in
  // one line, and not by a reader's SQL later.
  Statement col(db, "SELECT 1 FROM pragma_table_info(?) WHERE name=?");
  auto require = [&](const std::string& table, const std::string& column) {
    col.reset();
    col.bind(1, table).bind(2, column);
    if (!col.step()) {
      throw data_error(where + "damaged store: table '" + table + "' has no column '" + column + "'");
    }
  };
  for (const auto& [table, columns] : kColumnsV1) {
    for (size_t at = 0; at < columns.size();) {
      const size_t end = std::min(columns.find(' ', at), columns.size());
      require(table, columns.substr(at, end - at));
      at = end + 1;
    }
  }
  if (version >= 2) {
    for (const char* table : kSummedTables) require(table, "row_sum");
  }
  return version;
}

}  // namespace rwd::store
