// The probes of a runner (bisect --cmd: the user's script) on several threads at once
// (PoolOptions::runner with jobs > 1): each thread runs the next probe of the batch on its slot
// (a script process of its own, on a GPU of its own), and this thread judges and stores the
// outcomes in the batch's order, as the one-at-a-time path does. A race (stop_after_fails > 0)
// counts the failures as the threads see them: a probe whose early verdict says it fails counts
// at that step, one that ran whole when it ends; once enough have failed, the probes still
// running are told to cut (their runner's watch says kCut) and the rest are not started.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <thread>

#include "bisect/probe_pool.h"

namespace rwd::bisect {

std::vector<ProbeOutcome> ProbePool::run_external(const std::vector<ProbeSpec>& todo, int stop_after_fails) {
  struct Ran {
    bool started = false, done = false;
    ExternalRun run;
    double sent_s = 0, done_s = 0, wall_s = 0;
    std::exception_ptr error;
  };
  std::vector<Ran> ran(todo.size());
  // Made here, on this thread: each reads the store (the recorded history and losses).
  std::vector<std::unique_ptr<EarlyVerdict>> early;
  for (const ProbeSpec& p : todo) early.push_back(std::make_unique<EarlyVerdict>(store_, p, run_, pred_));
  std::atomic<size_t> next{0};
  std::atomic<int> failed{0};
  const auto settled = [&] { return stop_after_fails > 0 && failed.load() >= stop_after_fails; };
  auto work = [&](int slot) {
    for (size_t i = next++; i < todo.size() && !settled(); i = next++) {
      Ran& r = ran[i];
      EarlyVerdict& verdict = *early[i];
      r.started = true;
      r.sent_s = since_began();
      const auto t0 = std::chrono::steady_clock::now();
      bool counted = false;  // this probe's failure is in `failed`
      try {
        r.run = options_.runner(todo[i], run_, slot, [&](const ExternalRun& so_far) {
          if (verdict.stop(so_far)) {
            if (!counted) failed += 1;
            counted = true;
            return Watch::kStop;
          }
          return settled() ? Watch::kCut : Watch::kGoOn;
        });
        if (!counted && !r.run.cut && stop_after_fails > 0 && verdict.fails(r.run)) failed += 1;
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
    if (!r.started || r.run.cut) {  // a decided race: not started, or cut short (nothing stored)
      ProbeOutcome o;
      o.key = key(todo[i]);
      o.cut = true;
      if (r.started) {
        o.sent_s = r.sent_s;
        o.done_s = r.done_s;
        ++executed_;
        ++cut_;
      } else {
        ++skipped_;
      }
      out.push_back(o);
      continue;
    }
    ProbeOutcome o = judge_probe(store_, todo[i], run_, pred_, key(todo[i]), r.run, r.wall_s);
    o.held_at = early[i]->held_at();
    o.sent_s = r.sent_s;
    o.done_s = r.done_s;
    store_.put_probe(to_record(todo[i], o));
    ++executed_;
    out.push_back(o);
  }
  return out;
}

}  // namespace rwd::bisect
