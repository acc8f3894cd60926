// WriterLock: who writes a store besides its readers. A recording and `store thin` each hold an
// exclusive flock() on STORE-lock (a file beside the store, like SQLite's -wal and -shm) while
// they write, so thin refuses a store being recorded and two recordings never share one.
#pragma once

#include <string>

namespace rwd::store {

// The kernel drops the lock when its process dies (kill -9 included), so a lock file left
// behind by one holds nothing. Not a lock on the store file itself: closing any descriptor of
// that file would drop this process's POSIX locks, SQLite's included.
class WriterLock {
 public:
  // Takes the lock for `what` ("a recording (rewind train)"), written into the file so that
  // a refused writer can say who holds it. Throws StoreError(kData) in one line when another
  // process holds it ("store run.db: a recording (rewind train, pid 4242) is writing it") or
  // the lock file cannot be created.
  WriterLock(const std::string& store_path, const std::string& what);
  ~WriterLock();  // removes the file and releases the lock
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

  static std::string lock_path(const std::string& store_path) { return store_path + "-lock"; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace rwd::store
