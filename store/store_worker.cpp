// StoreWorker: one thread, one connection, jobs in push order; the first failure stops it.
#include "store/store_worker.h"

#include <chrono>

#include "store/background_priority.h"

namespace rwd::store {

StoreWorker::StoreWorker(const std::string& path, const StoreOptions& options, size_t max_queued,
                         std::string name)
    : store_(Store::open(path, Mode::kReadWrite, options)),
      max_queued_(max_queued == 0 ? 1 : max_queued),
      name_(std::move(name)),
      thread_([this] { loop(); }) {}

StoreWorker::~StoreWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StoreWorker::loop() {
  yield_to_training();
  for (;;) {
    std::pair<uint64_t, Job> job;
    bool run = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      run = error_.empty();
    }
    cv_.notify_all();  // a push waiting for room may go on
    std::string err;
    int code = 0;
    const auto t0 = std::chrono::steady_clock::now();
    if (run) {
      try {
        job.second(store_);
      } catch (const StoreError& e) {
        err = e.what();
        code = e.lib_code();
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    job.second = nullptr;  // release what the job held before reporting it done
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!err.empty() && error_.empty()) {
        error_ = err;
        error_code_ = code;
      }
      done_ = job.first;
    }
    cv_.notify_all();
  }
}

void StoreWorker::fail_locked() {
  throw StoreError(ExitCode::kData, name_ + " failed: " + error_, error_code_);
}

void StoreWorker::wait_for_room_locked(std::unique_lock<std::mutex>& lock, double* waited_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  cv_.wait(lock, [this] { return queue_.size() < max_queued_ || !error_.empty(); });
  if (waited_seconds != nullptr) {
    *waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!error_.empty()) fail_locked();
}

void StoreWorker::wait_for_room(double* waited_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_for_room_locked(lock, waited_seconds);
}

uint64_t StoreWorker::push(Job job, double* waited_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_for_room_locked(lock, waited_seconds);
  const uint64_t ticket = ++pushed_;
  queue_.emplace_back(ticket, std::move(job));
  lock.unlock();
  cv_.notify_all();
  return ticket;
}

bool StoreWorker::has_room() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() < max_queued_;
}

uint64_t StoreWorker::pushed() {
  std::lock_guard<std::mutex> lock(mu_);
  return pushed_;
}

void StoreWorker::wait_done(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket || !error_.empty(); });
  if (!error_.empty()) fail_locked();
}

double StoreWorker::busy_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_seconds_;
}

}  // namespace rwd::store
