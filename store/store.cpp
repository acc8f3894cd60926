// Store lifecycle (create/open) and runs (blobs: store_blobs.cpp; steps: store_steps.cpp).
#include "store/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <optional>
#include <utility>

#include "store/row_sum.h"
#include "store/schema.h"
#include "store/writer_lock.h"

namespace rwd::store {
namespace {

// The store file and the side files SQLite and the writer lock keep beside it.
void remove_store_files(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
}

// An SQLite file whose schema table is empty (page 1 a table leaf with no cell), or one with a
// hot rollback journal of a transaction that began on an empty file: nothing was committed.
// Read with a descriptor of our own: no connection of this process is open on such a file.
bool schema_free_file(const std::string& path) {
  auto read_head = [](const std::string& p, unsigned char* buf, size_t n) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const ssize_t got = ::pread(fd, buf, n, 0);
    ::close(fd);
    return got == static_cast<ssize_t>(n);
  };
  struct stat wal;
  if (::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0) return false;  // SQLite's to read
  unsigned char head[108] = {};
  if (!read_head(path, head, sizeof head) || std::memcmp(head, "SQLite format 3", 16) != 0) return false;
  // A journal header: 8 magic bytes, page count, nonce, then the database's size in pages
  // when the transaction began.
  static const unsigned char kJournalMagic[8] = {0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7};
  unsigned char journal[20] = {};
  if (read_head(path + "-journal", journal, sizeof journal) && std::memcmp(journal, kJournalMagic, 8) == 0) {
    return journal[16] == 0 && journal[17] == 0 && journal[18] == 0 && journal[19] == 0;
  }
  return head[100] == 0x0D && head[103] == 0 && head[104] == 0;
}

bool missing_or_empty(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT;
  return S_ISREG(st.st_mode) && st.st_size == 0;
}


constexpr const char* kRunColumns = "SELECT id, created, config, plan, meta";

}  // namespace

Store::Store(Db db, Mode mode, const StoreOptions& options, int schema_version)
    : db_(std::move(db)),
      mode_(mode),
      options_(options),
      schema_version_(schema_version),
      row_sums_(schema_version >= 2),
      compressor_(options.zstd_level, options.zstd_workers) {}

Store Store::create(const std::string& path, const StoreOptions& options) {
  std::optional<WriterLock> holding;  // keeps a recording that holds the stub from losing it
  struct stat existing;
  const bool exists = ::stat(path.c_str(), &existing) == 0;
  if (!exists && errno != ENOENT) throw data_error("store " + path + ": cannot create it: " + std::strerror(errno));
  if (exists) {
    if (!S_ISREG(existing.st_mode) || (existing.st_size != 0 && !schema_free_file(path)))
      throw data_error("store " + path + ": already exists; refusing to overwrite it");
    holding.emplace(path, "replacing a stub (rewind train --record)");
    remove_store_files(path);
  } else {
    // Side files without their store (its file deleted by hand) are no store's: a stale WAL
    // would be replayed into the new file.
    for (const char* side : {"-wal", "-shm", "-journal"}) ::unlink((path + side).c_str());
  }
  const std::string tmp = path + ".creating-" + std::to_string(::getpid());
  remove_store_files(tmp);
  try {
    {
      Db db(tmp, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
      configure_connection(db, Mode::kReadWrite, options);
      create_schema(db, options);
    }  // closed: the WAL is copied into the file and removed
    // link() and not rename(): it fails where another process created `path` meanwhile.
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      if (err == EEXIST) throw data_error("store " + path + ": already exists; refusing to overwrite it");
      if (err != EPERM && err != ENOTSUP && err != EXDEV)  // no hard links on this file system
        throw data_error("store " + path + ": cannot create it: " + std::strerror(err));
      if (!missing_or_empty(path)) throw data_error("store " + path + ": already exists; refusing to overwrite it");
      if (::rename(tmp.c_str(), path.c_str()) != 0)
        throw data_error("store " + path + ": cannot create it: " + std::strerror(errno));
    }
  } catch (...) {
    remove_store_files(tmp);
    throw;
  }
  ::unlink(tmp.c_str());
  holding.reset();
  return open(path, Mode::kReadWrite, options);
}

std::optional<std::string> Store::stub_reason(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  if (st.st_size == 0) return std::string("an empty file");
  if (schema_free_file(path)) return std::string("an SQLite file with no tables");
  try {
    Store s = open(path, Mode::kReadOnly);
    Statement n(s.db_,
                "SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM blobs) + "
                "(SELECT count(*) FROM blob_chunks) + (SELECT count(*) FROM probes) + "
                "(SELECT count(*) FROM kv) + (SELECT count(*) FROM steps)");
    if (n.step() && n.col_int(0) == 0) return std::string("a rewind store with no run in it");
    // A run added and killed before its first checkpoint: nothing to replay or resume from.
    Statement rows(s.db_,
                   "SELECT (SELECT count(*) FROM checkpoints) + (SELECT count(*) FROM steps) + "
                   "(SELECT count(*) FROM tensors) + (SELECT count(*) FROM metrics) + (SELECT count(*) FROM probes)");
    if (rows.step() && rows.col_int(0) == 0) return std::string("a rewind store with no checkpoint and no step in it");
  } catch (const StoreError&) {
  }
  return std::nullopt;
}

Store Store::open(const std::string& path, Mode mode, const StoreOptions& options) {
  precheck_store_file(path);
  // A stub says what it is, not "not an SQLite database" or a failed rollback of its journal.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && (st.st_size == 0 || schema_free_file(path))) {
    throw data_error("store " + path + ": " + (st.st_size == 0 ? "an empty file" : "an SQLite file with no tables") +
                     ", not a store: nothing is stored in it (a recording killed as it started leaves one); "
                     "`rewind train --record " + path + "` replaces it");
  }
  auto open_as = [&](bool immutable) {
    Db db(path, mode == Mode::kReadOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE, immutable);
    check_store_header(db);
    if (mode == Mode::kReadWrite && sqlite3_db_readonly(db.get(), "main") == 1) {
      throw data_error("store " + path + ": is read-only (file permissions or file system); "
                       "cannot write to it", SQLITE_READONLY);
    }
    configure_connection(db, mode, options);
    const int version = check_schema(db, mode);
    Store s(std::move(db), mode, options, version);
    s.immutable_ = immutable;
    return s;
  };
  if (mode == Mode::kReadWrite) return open_as(false);
  try {
    return open_as(false);
  } catch (const StoreError& e) {
    // A WAL reader needs the -shm beside the store; where it cannot be created (a full disk, a
    // directory this user may not write) and no WAL holds frames the file lacks, the file is
    // the whole store and is read as it is: immutable, no side file.
    const int rc = e.lib_code() & 0xFF;
    struct stat wal;
    const bool wal_empty = ::stat((path + "-wal").c_str(), &wal) != 0 || wal.st_size == 0;
    if (!wal_empty || (rc != SQLITE_IOERR && rc != SQLITE_CANTOPEN && rc != SQLITE_READONLY && rc != SQLITE_FULL))
      throw;
    return open_as(true);
  }
}

Store Store::open_or_create(const std::string& path, const StoreOptions& options) {
  if (missing_or_empty(path)) return create(path, options);
  return open(path, Mode::kReadWrite, options);
}

void Store::check_row(const Statement& st, int col, int64_t want, const char* table,
                      const std::function<std::string()>& row) const {
  if (st.is_null(col) || st.col_int(col) == want) return;
  throw data_error(row_corrupt_message(path(), table, row()));
}

void Store::require_writable(const char* doing) const {
  if (mode_ == Mode::kReadOnly) {
    throw StoreError(ExitCode::kInternal,
                     "store " + path() + ": " + doing + ": store was opened read-only");
  }
}

Transaction Store::begin_step() {
  require_writable("beginning a step");
  return Transaction(db_);
}

void Store::checkpoint_wal(bool truncate) {
  if (mode_ == Mode::kReadOnly) return;
  db_.checkpoint_wal("checkpointing the WAL", truncate);
}

void Store::check_in_place() {
  if (db_.file_moved()) {
    throw data_error("store " + path() + ": the file was deleted or moved while open",
                     SQLITE_READONLY_DBMOVED);
  }
}

int64_t Store::add_run(const std::string& config_json, const std::string& plan,
                       const std::string& meta_json) {
  require_writable("adding a run");
  int64_t id = 0;
  // The id is part of the checksum and known only once the row is in: both in one transaction.
  in_transaction(db_, [&] {
    Statement st(db_, "INSERT INTO runs(config, plan, meta) VALUES (?, ?, ?)");
    st.bind(1, config_json).bind(2, plan).bind(3, meta_json);
    st.run();
    id = sqlite3_last_insert_rowid(db_.get());
    if (!row_sums_) return;
    Statement sum(db_, "UPDATE runs SET row_sum=? WHERE id=?");
    sum.bind(1, run_row_sum(id, config_json, plan, meta_json)).bind(2, id);
    sum.run();
  });
  return id;
}

void Store::update_run_plan(int64_t run, const std::string& plan) { update_run(run, "plan", plan); }

void Store::update_run_meta(int64_t run, const std::string& meta_json) { update_run(run, "meta", meta_json); }

void Store::update_run(int64_t run, const char* column, const std::string& text) {
  require_writable("changing a run's plan or metadata");
  in_transaction(db_, [&] {
    // Read (and so checked) first: a corrupt row is not signed anew.
    std::optional<RunInfo> r = this->run(run);
    if (!r) throw data_error("store " + path() + ": has no run " + std::to_string(run));
    (std::string(column) == "plan" ? r->plan : r->meta) = text;
    Statement st(db_, ("UPDATE runs SET " + std::string(column) + "=?" +
                       (row_sums_ ? ", row_sum=?" : "") + " WHERE id=?")
                          .c_str());
    st.bind(1, text);
    if (row_sums_) st.bind(2, run_row_sum(run, r->config, r->plan, r->meta));
    st.bind(row_sums_ ? 3 : 2, run);
    st.run();
  });
}

std::vector<RunInfo> Store::runs() {
  std::vector<RunInfo> out;
  Statement st(db_, (std::string(kRunColumns) + row_sum_column() + " FROM runs ORDER BY id").c_str());
  while (st.step()) out.push_back(read_run(st));
  return out;
}

std::optional<RunInfo> Store::run(int64_t id) {
  Statement st(db_, (std::string(kRunColumns) + row_sum_column() + " FROM runs WHERE id=?").c_str());
  st.bind(1, id);
  if (!st.step()) return std::nullopt;
  return read_run(st);
}

RunInfo Store::read_run(const Statement& st) const {
  RunInfo r{st.col_int(0), st.col_text(1), st.col_text(2), st.col_text(3), st.col_text(4)};
  check_row(st, 5, run_row_sum(r.id, r.config, r.plan, r.meta), "runs",
            [&] { return "run " + std::to_string(r.id); });
  return r;
}

}  // namespace rwd::store
