// WalCheckpointer: PASSIVE WAL checkpoints on a thread and connection of their own.
#include "store/wal_checkpointer.h"

#include "store/background_priority.h"
#include "store/schema.h"
#include "store/store.h"

namespace rwd::store {

WalCheckpointer::WalCheckpointer(const std::string& path, const StoreOptions& options, size_t every)
    : db_(path, SQLITE_OPEN_READWRITE), every_(every) {
  configure_connection(db_, Mode::kReadWrite, options);
  thread_ = std::thread([this] { loop(); });
}

WalCheckpointer::~WalCheckpointer() { stop(); }

void WalCheckpointer::committed(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += bytes;
    if (pending_ < every_) return;
  }
  cv_.notify_one();
}

void WalCheckpointer::finish() {
  stop();
  if (error_) std::rethrow_exception(error_);
}

void WalCheckpointer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void WalCheckpointer::loop() {
  yield_to_training();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || pending_ >= every_; });
    if (pending_ < every_) return;  // stopped with less than `every` left for the owner
    pending_ = 0;
    lock.unlock();
    try {
      db_.checkpoint_wal("checkpointing the WAL beside the writer");
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      return;
    }
    lock.lock();
  }
}

}  // namespace rwd::store
