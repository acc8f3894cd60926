// Store file checks, table creation and schema versioning (PRAGMA user_version + a migration
// table), kept apart from the data access code so that a schema change touches one file.
#pragma once

#include <string>

#include "store/sqlite_db.h"

namespace rwd::store {

struct StoreOptions;
enum class Mode;

// Cheap checks before SQLite sees the file, so that junk gets a clear one-line error and is
// never opened for writing: exists, regular file, SQLite header, whole pages.
void precheck_store_file(const std::string& path);

// Per-connection settings: foreign keys, busy timeout, and for writers synchronous=NORMAL (in
// WAL mode a commit then survives a process crash; only power loss may drop the last ones) and
// StoreOptions::wal_autocheckpoint.
void configure_connection(Db& db, Mode mode, const StoreOptions& options);

// Creates every table in a fresh, empty database and stamps application_id and user_version.
void create_schema(Db& db, const StoreOptions& options);

// Checks that `db` is a rewind store of a version we can read; migrates older versions when
// writable. Returns the (possibly migrated) schema version. Throws StoreError(kData) otherwise.
// Writes nothing unless a migration runs.
int check_schema(Db& db, Mode mode);

}  // namespace rwd::store
