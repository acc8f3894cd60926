// run_ordered: worker threads take items in increasing order from a shared counter; the calling
// thread consumes finished items in order. One mutex guards all shared state (items are big:
// a tensor or a 64 MiB chunk, so the lock is taken a few hundred times per checkpoint).
#include "store/ordered_work.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace rwd::store {
namespace {

struct Shared {
  std::mutex mu;
  std::condition_variable work_cv;  // a worker may start an item, or must stop
  std::condition_variable done_cv;  // an item was produced, or a worker failed
  size_t next = 0;                  // next item to start
  size_t in_flight = 0;             // weight of the items started and not yet consumed
  std::vector<char> produced;
  std::exception_ptr error;  // the first failure of a worker
  bool stop = false;
};

// Stops and joins the workers however the calling thread leaves run_ordered.
class Workers {
 public:
  explicit Workers(Shared& s) : s_(s) {}
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      s_.stop = true;
    }
    s_.work_cv.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  void add(std::thread t) { threads_.push_back(std::move(t)); }

 private:
  Shared& s_;
  std::vector<std::thread> threads_;
};

void worker_loop(Shared& s, size_t n, size_t window, int worker,
                 const std::function<void(size_t, int)>& produce,
                 const std::function<size_t(size_t)>& weight) {
  for (;;) {
    size_t i;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.work_cv.wait(lock, [&] {
        return s.stop || s.error || s.next >= n || s.in_flight == 0 ||
               s.in_flight + weight(s.next) <= window;
      });
      if (s.stop || s.error || s.next >= n) return;
      i = s.next++;
      s.in_flight += weight(i);
    }
    try {
      produce(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.error) s.error = std::current_exception();
      s.done_cv.notify_all();
      s.work_cv.notify_all();
      return;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    s.produced[i] = 1;
    s.done_cv.notify_all();
  }
}

}  // namespace

void run_ordered(size_t n, int threads, size_t window,
                 const std::function<void(size_t, int)>& produce,
                 const std::function<void(size_t)>& consume,
                 const std::function<size_t(size_t)>& weight_or_null) {
  if (threads <= 0) {
    for (size_t i = 0; i < n; ++i) {
      produce(i, 0);
      consume(i);
    }
    return;
  }
  const std::function<size_t(size_t)> weight =
      weight_or_null ? weight_or_null : [](size_t) { return size_t(1); };
  Shared s;
  s.produced.assign(n, 0);
  std::exception_ptr error;
  {
    Workers workers(s);  // declared after `s`: joined before `s` dies, also when consume throws
    const int n_threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
    for (int w = 0; w < n_threads; ++w) {
      workers.add(std::thread(worker_loop, std::ref(s), n, window, w, std::cref(produce),
                              std::cref(weight)));
    }
    for (size_t i = 0; i < n; ++i) {
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.done_cv.wait(lock, [&] { return s.produced[i] || s.error; });
        if (s.error) {
          error = s.error;
          break;
        }
      }
      consume(i);
      {
        std::lock_guard<std::mutex> lock(s.mu);
        s.in_flight -= weight(i);
      }
      s.work_cv.notify_all();  // the window moved: a worker may start another item
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace rwd::store
