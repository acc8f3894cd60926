// RAII wrappers over the SQLite C API: Db owns a sqlite3*, Statement a sqlite3_stmt*,
// Transaction a BEGIN IMMEDIATE .. COMMIT that rolls back in its destructor unless committed.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rwd::store {

class Db {
 public:
  Db() = default;
  // flags: SQLITE_OPEN_READONLY or SQLITE_OPEN_READWRITE [| SQLITE_OPEN_CREATE]. A read-only
  // open of a file on a read-only file system with no -wal beside it is made `immutable=1`:
  // SQLite could not read a WAL database there otherwise (it cannot create the -shm).
  // immutable: open a read-only connection `immutable=1` whatever the file system (a reader
  // whose plain open failed because the -shm could not be created: a full disk, a directory
  // it may not write).
  Db(const std::string& path, int flags, bool immutable = false);
  ~Db();
  Db(Db&& other) noexcept;
  Db& operator=(Db&& other) noexcept;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }
  // Runs one or more statements that return no rows we need; `doing` names the action for errors.
  void exec(const std::string& sql, const char* doing);
  // Returns the integer in the first column of the first row of a query (e.g. a PRAGMA).
  int64_t query_int(const std::string& sql, const char* doing);
  // Throws StoreError (kData for corrupt/not-a-db/busy/io, kInternal for misuse) naming `doing`.
  // A write that failed for lack of room (SQLITE_FULL, errno ENOSPC, EDQUOT or EFBIG, or an
  // I/O error with under 1 MiB left on the file system or below `ulimit -f`) carries lib_code
  // SQLITE_FULL, one on a read-only file system SQLITE_READONLY.
  [[noreturn]] void fail(int rc, const std::string& doing) const;
  // Copies what the WAL holds into the main file and fsyncs both, without waiting for (or
  // blocking) other connections: PRAGMA wal_checkpoint(PASSIVE). BUSY (another connection is
  // checkpointing) is no error: what is left waits for the next call. A no-op outside WAL mode.
  // truncate: wal_checkpoint(TRUNCATE) instead, which waits (busy timeout) for the other
  // writers' transactions, holds new ones back while it copies the rest, and empties the WAL
  // file: while another connection commits all the time, PASSIVE never finds the WAL fully
  // copied, so SQLite never restarts it and the file grows with every byte ever written.
  void checkpoint_wal(const char* doing, bool truncate = false);
  // Whether the file was deleted or renamed since it was opened: SQLite then keeps writing to
  // the unlinked inode (or the WAL) without an error, so writers ask before each commit.
  bool file_moved() const;

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

// Why a write failed, from a StoreError's lib_code: what `rewind train --record` tells the user.
enum class WriteFailure { kOther, kDiskFull, kReadOnly, kMoved };
WriteFailure write_failure(int lib_code);

class Statement {
 public:
  Statement(Db& db, const char* sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& operator=(Statement&&) = delete;

  // Bind helpers use 1-based indices like SQLite and return *this for chaining.
  Statement& bind(int i, int64_t v);
  Statement& bind(int i, double v);
  Statement& bind(int i, const std::string& v);
  Statement& bind_blob(int i, const void* data, size_t size);  // data must outlive step()
  Statement& bind_null(int i);
  Statement& bind_opt(int i, const std::optional<std::string>& v);

  // Returns true when a row is available, false when done; throws on error.
  bool step();
  // Steps a statement expected to produce no rows (INSERT/UPDATE).
  void run();
  void reset();

  bool is_null(int col) const;
  int64_t col_int(int col) const;
  double col_double(int col) const;
  std::string col_text(int col) const;
  std::optional<std::string> col_opt_text(int col) const;
  // Pointer valid until the next step()/reset(); size via col_bytes.
  const void* col_blob(int col) const;
  size_t col_bytes(int col) const;

 private:
  Db* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

class Transaction {
 public:
  // BEGIN IMMEDIATE takes the write lock up front (waiting up to busy_timeout), so a writer
  // never fails half-way with SQLITE_BUSY when upgrading from a read lock.
  explicit Transaction(Db& db);
  ~Transaction();
  Transaction(Transaction&& other) noexcept;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  Transaction& operator=(Transaction&&) = delete;

  void commit();
  bool active() const { return db_ != nullptr; }

 private:
  Db* db_;
};

// Runs `body` inside the transaction already open on `db` (e.g. a step's), or else inside a
// new one that commits when body returns and rolls back if it throws.
template <class F>
void in_transaction(Db& db, F&& body) {
  if (sqlite3_get_autocommit(db.get())) {
    Transaction txn(db);
    body();
    txn.commit();
  } else {
    body();
  }
}

}  // namespace rwd::store
