// The probes of a runner (bisect --cmd: the user's script) on several threads at once
// (PoolOptions::runner with jobs > 1): each thread runs the next probe of the batch on its slot
// (a script process of its own, on a GPU of its own), and this thread judges and stores the
// outcomes in the batch's order, as the one-at-a-time path does.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "bisect/probe_pool.h"

namespace rwd::bisect {

std::vector<ProbeOutcome> ProbePool::run_external(const std::vector<ProbeSpec>& todo) {
  struct Ran {
    bool done = false;
    ExternalRun run;
    double sent_s = 0, done_s = 0, wall_s = 0;
    std::exception_ptr error;
  };
  std::vector<Ran> ran(todo.size());
  std::atomic<size_t> next{0};
  auto work = [&](int slot) {
    for (size_t i = next++; i < todo.size(); i = next++) {
      Ran& r = ran[i];
      r.sent_s = since_began();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        r.run = options_.runner(todo[i], run_, slot);
      } catch (...) {
        r.error = std::current_exception();
        next = todo.size();  // the first error ends the bisect: no probe is started after it
      }
      r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.done_s = since_began();
      r.done = true;
    }
  };
  const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(options_.jobs), todo.size()));
  std::vector<std::thread> pool;
  for (int slot = 1; slot < threads; ++slot) pool.emplace_back(work, slot);
  work(0);
  for (std::thread& t : pool) t.join();

  std::vector<ProbeOutcome> out;
  for (size_t i = 0; i < todo.size(); ++i) {
    Ran& r = ran[i];
    if (r.error) std::rethrow_exception(r.error);  // the probes before it are stored
    if (!r.done) break;
    ProbeOutcome o = judge_probe(store_, todo[i], run_, pred_, key(todo[i]), r.run, r.wall_s);
    o.sent_s = r.sent_s;
    o.done_s = r.done_s;
    store_.put_probe(to_record(todo[i], o));
    ++executed_;
    out.push_back(o);
  }
  return out;
}

}  // namespace rwd::bisect
