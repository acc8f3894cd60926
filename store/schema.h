// Store file checks, table creation and schema versioning (PRAGMA user_version + a migration
// table), kept apart from the data access code so that a schema change touches one file.
#pragma once

#include <string>

#include "store/sqlite_db.h"

namespace rwd::store {

struct StoreOptions;
enum class Mode;

// Cheap checks before SQLite opens the file: it exists and is a regular file.
void precheck_store_file(const std::string& path);

// Checks on a connection just opened, before it reads or writes a page, so that junk gets a
// clear one-line error: an SQLite header, a sane page size, whole pages. Reads through SQLite's
// own file handle: a descriptor of our own, once closed, would drop the locks of every
// connection this process has to the store (see schema.cpp).
void check_store_header(Db& db);

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
