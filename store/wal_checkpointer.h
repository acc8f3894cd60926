// A helper thread with a connection of its own that copies the WAL into the main file while a
// writer goes on committing big blobs, so that copy and its fsyncs overlap the writer's work.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "store/sqlite_db.h"

namespace rwd::store {

struct StoreOptions;

class WalCheckpointer {
 public:
  // Opens its connection to the store at `path` now (errors throw here); then runs a PASSIVE
  // checkpoint (Store::checkpoint_wal) each time `every` more bytes were committed. PASSIVE
  // neither waits for nor blocks other connections: the writer keeps committing meanwhile.
  WalCheckpointer(const std::string& path, const StoreOptions& options, size_t every);
  // Stops and joins the thread; an error of its last pass is dropped (the writer's is thrown).
  ~WalCheckpointer();
  WalCheckpointer(const WalCheckpointer&) = delete;
  WalCheckpointer& operator=(const WalCheckpointer&) = delete;

  // The writer committed `bytes` more to the WAL.
  void committed(size_t bytes);
  // Stops the thread once it has made the pass already due (if `every` bytes are waiting) and
  // rethrows its first error (a full disk during a pass, say); what is left in the WAL is the
  // owner's next checkpoint_wal's.
  void finish();

 private:
  void loop();
  void stop();

  Db db_;
  size_t every_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace rwd::store
