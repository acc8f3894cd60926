// StoreWorker: a background thread with a store connection of its own that runs queued jobs
// in order. The recorder keeps two: one commits the steps, one writes the checkpoints, so
// the training thread never waits for SQLite's write lock, a commit or compression.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "store/store.h"

namespace rwd::store {

class StoreWorker {
 public:
  using Job = std::function<void(Store&)>;
  // Opens `path` read-write for the worker. `name` appears in errors ("step writer failed:
  // ..."); at most `max_queued` jobs wait to start (push blocks beyond that).
  StoreWorker(const std::string& path, const StoreOptions& options, size_t max_queued,
              std::string name);
  ~StoreWorker();  // runs the jobs still queued (none after a failure), then stops
  StoreWorker(const StoreWorker&) = delete;
  StoreWorker& operator=(const StoreWorker&) = delete;

  // Queues `job`, first waiting while `max_queued` jobs wait to start; adds the wait to
  // *waited_seconds. Returns the job's ticket: 1, 2, ... in push order. Once a job has thrown,
  // later jobs are dropped and push and the waits below throw StoreError(kData) naming it.
  uint64_t push(Job job, double* waited_seconds = nullptr);
  bool has_room();             // push would not wait
  // The errors thrown keep the failed job's StoreError::lib_code (store::write_failure).
  // Waits until push would not wait (adding the wait to *waited_seconds); throws as push.
  void wait_for_room(double* waited_seconds = nullptr);
  uint64_t pushed();           // the last ticket handed out (0: none)
  void wait_done(uint64_t ticket);  // until job `ticket` and all before it have run
  void flush() { wait_done(pushed()); }
  double busy_seconds();       // time spent running jobs

 private:
  void loop();
  void wait_for_room_locked(std::unique_lock<std::mutex>& lock, double* waited_seconds);
  [[noreturn]] void fail_locked();

  Store store_;
  const size_t max_queued_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, Job>> queue_;
  uint64_t pushed_ = 0, done_ = 0;  // tickets handed out; tickets finished (run or dropped)
  bool stop_ = false;
  std::string error_;
  int error_code_ = 0;  // the failed job's StoreError::lib_code (0: another exception)
  double busy_seconds_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace rwd::store
