// SQLite RAII wrappers; every call is checked and failures become one-line StoreErrors.
#include "store/sqlite_db.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "store/store_error.h"

namespace rwd::store {
namespace {

// Problems with the file itself map to kData; API misuse (our bug) maps to kInternal.
ExitCode exit_code_for(int rc) {
  switch (rc & 0xFF) {
    case SQLITE_MISUSE:
    case SQLITE_RANGE:
    case SQLITE_ERROR:
    case SQLITE_NOMEM:
      return ExitCode::kInternal;
    default:
      return ExitCode::kData;
  }
}

// Whether a write to the store at `path` (or its -wal) can fail for lack of room: its file
// system has under 1 MiB free (a failed write fills it to the last block first), or the store
// or its WAL is within 1 MiB of the process's file size limit (`ulimit -f`).
bool no_room_for(const std::string& path) {
  constexpr uint64_t kSlack = uint64_t(1) << 20;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) == 0 &&
      std::min(fs.f_bavail, fs.f_bfree) * uint64_t(fs.f_frsize) < kSlack) {
    return true;
  }
  struct rlimit lim;
  if (::getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return false;
  for (const std::string& f : {path, path + "-wal"}) {
    struct stat st;
    if (::stat(f.c_str(), &st) == 0 && uint64_t(st.st_size) + kSlack > lim.rlim_cur) return true;
  }
  return false;
}

// "file:PATH?immutable=1" with the characters a URI gives a meaning escaped.
std::string immutable_uri(const std::string& path) {
  std::string uri = "file:";
  for (char c : path) {
    if (c == '%' || c == '?' || c == '#') {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", static_cast<unsigned char>(c));
      uri += hex;
    } else {
      uri += c;
    }
  }
  return uri + "?immutable=1";
}

bool on_read_only_file_system(const std::string& path) {
  struct statvfs fs;
  return ::statvfs(path.c_str(), &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0;
}

}  // namespace

WriteFailure write_failure(int lib_code) {
  if (lib_code == SQLITE_READONLY_DBMOVED) return WriteFailure::kMoved;
  switch (lib_code & 0xFF) {
    case SQLITE_FULL:
      return WriteFailure::kDiskFull;
    case SQLITE_READONLY:
      return WriteFailure::kReadOnly;
    default:
      return WriteFailure::kOther;
  }
}

Db::Db(const std::string& path, int flags, bool force_immutable) : path_(path) {
  // A reader of a store on a read-only file system: nothing can change the file there, and
  // without its -shm SQLite could not read a WAL database at all, so it is opened immutable.
  // A -wal left there (by a writer that died) keeps the plain open and its clear error.
  struct stat wal;
  const bool immutable = (flags & SQLITE_OPEN_READONLY) != 0 &&
                         (force_immutable || (on_read_only_file_system(path) && ::stat((path + "-wal").c_str(), &wal) != 0));
  const std::string name = immutable ? immutable_uri(path) : path;
  if (immutable) flags |= SQLITE_OPEN_URI;
  int rc = sqlite3_open_v2(name.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw StoreError(
        ExitCode::kData,
        "store " + path + ": cannot open: " + msg + " (sqlite code " + std::to_string(rc) + ")",
        rc);
  }
  sqlite3_extended_result_codes(db_, 1);
}

Db::~Db() {
  // close_v2 never fails for a valid handle; statements are finalized by their owners first.
  if (db_) sqlite3_close_v2(db_);
}

Db::Db(Db&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)) {}

Db& Db::operator=(Db&& other) noexcept {
  if (this != &other) {
    if (db_) sqlite3_close_v2(db_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

void Db::fail(int rc, const std::string& doing) const {
  std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  // SQLite reports a write cut short by a full disk as SQLITE_FULL, but one refused outright
  // (ENOSPC on an empty write, EFBIG past `ulimit -f`, EROFS) as a generic I/O error, and the
  // errno it keeps is often that of a later call; so the file system is asked as well.
  if ((rc & 0xFF) == SQLITE_IOERR || (rc & 0xFF) == SQLITE_FULL) {
    const int sys = db_ ? sqlite3_system_errno(db_) : 0;
    if (sys == EROFS || on_read_only_file_system(path_)) {
      rc = SQLITE_READONLY;
      msg += " (read-only file system)";
    } else if ((rc & 0xFF) == SQLITE_FULL || sys == ENOSPC || sys == EDQUOT || sys == EFBIG ||
               no_room_for(path_)) {
      rc = SQLITE_FULL;
      msg += " (disk full)";
    }
  }
  throw StoreError(
      exit_code_for(rc),
      "store " + path_ + ": " + doing + ": " + msg + " (sqlite code " + std::to_string(rc) + ")",
      rc);
}

bool Db::file_moved() const {
  int moved = 0;
  return sqlite3_file_control(db_, "main", SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK &&
         moved != 0;
}

void Db::checkpoint_wal(const char* doing, bool truncate) {
  const int mode = truncate ? SQLITE_CHECKPOINT_TRUNCATE : SQLITE_CHECKPOINT_PASSIVE;
  const int rc = sqlite3_wal_checkpoint_v2(db_, "main", mode, nullptr, nullptr);
  if (rc != SQLITE_OK && rc != SQLITE_BUSY) fail(rc, doing);
}

void Db::exec(const std::string& sql, const char* doing) {
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) fail(rc, doing);
}

int64_t Db::query_int(const std::string& sql, const char* doing) {
  Statement st(*this, sql.c_str());
  if (!st.step()) fail(SQLITE_ERROR, std::string(doing) + ": no row");
  return st.col_int(0);
}

Statement::Statement(Db& db, const char* sql) : db_(&db), sql_(sql) {
  int rc = sqlite3_prepare_v2(db.get(), sql, -1, &stmt_, nullptr);
  if (rc != SQLITE_OK) db.fail(rc, std::string("preparing \"") + sql + "\"");
}

Statement::~Statement() {
  if (stmt_) sqlite3_finalize(stmt_);
}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), sql_(std::move(other.sql_)) {}

Statement& Statement::bind(int i, int64_t v) {
  int rc = sqlite3_bind_int64(stmt_, i, v);
  if (rc != SQLITE_OK) db_->fail(rc, "binding to \"" + sql_ + "\"");
  return *this;
}

Statement& Statement::bind(int i, double v) {
  int rc = sqlite3_bind_double(stmt_, i, v);
  if (rc != SQLITE_OK) db_->fail(rc, "binding to \"" + sql_ + "\"");
  return *this;
}

Statement& Statement::bind(int i, const std::string& v) {
  int rc = sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) db_->fail(rc, "binding to \"" + sql_ + "\"");
  return *this;
}

Statement& Statement::bind_blob(int i, const void* data, size_t size) {
  // A zero-length blob must still be a BLOB, not NULL: give SQLite a non-null pointer.
  static const char kEmpty = 0;
  int rc = sqlite3_bind_blob64(stmt_, i, size ? data : &kEmpty, size, SQLITE_STATIC);
  if (rc != SQLITE_OK) db_->fail(rc, "binding to \"" + sql_ + "\"");
  return *this;
}

Statement& Statement::bind_null(int i) {
  int rc = sqlite3_bind_null(stmt_, i);
  if (rc != SQLITE_OK) db_->fail(rc, "binding to \"" + sql_ + "\"");
  return *this;
}

Statement& Statement::bind_opt(int i, const std::optional<std::string>& v) {
  return v ? bind(i, *v) : bind_null(i);
}

bool Statement::step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  db_->fail(rc, "running \"" + sql_ + "\"");
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

bool Statement::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
int64_t Statement::col_int(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::col_double(int col) const { return sqlite3_column_double(stmt_, col); }

std::string Statement::col_text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}

std::optional<std::string> Statement::col_opt_text(int col) const {
  if (is_null(col)) return std::nullopt;
  return col_text(col);
}

const void* Statement::col_blob(int col) const { return sqlite3_column_blob(stmt_, col); }
size_t Statement::col_bytes(int col) const {
  return static_cast<size_t>(sqlite3_column_bytes(stmt_, col));
}

Transaction::Transaction(Db& db) : db_(&db) {
  db.exec("BEGIN IMMEDIATE", "starting a write transaction");
}

Transaction::~Transaction() {
  // Destructors never throw: a failed rollback leaves SQLite to roll back on close.
  if (db_) sqlite3_exec(db_->get(), "ROLLBACK", nullptr, nullptr, nullptr);
}

Transaction::Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}

void Transaction::commit() {
  if (!db_) throw StoreError(ExitCode::kInternal, "commit of a finished transaction");
  Db* db = db_;
  db->exec("COMMIT", "committing a transaction");
  db_ = nullptr;
}

}  // namespace rwd::store
