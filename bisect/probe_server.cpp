// The worker side of probe batches: a one-shot worker (`rewind bisect --probe-worker`), the
// long-lived probe server a pool feeds line by line (cut short by SIGUSR1), and the other
// ranks of a probe group following rank 0's probes.
#include <ATen/Parallel.h>
#include <signal.h>

#include <atomic>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "bisect/probe_pool.h"
#include "common/error.h"
#include "common/fd_io.h"

namespace rwd::bisect {

namespace {

// One worker probe: run at the recording's thread count (replay is bitwise per count), then
// written into the store's probe cache.
// Returns false when the probe was cut short (nothing stored).
bool run_into_cache(store::Store& s, const ProbeSpec& p, const std::function<bool()>& cut_short = {},
                    train::Comm* comm = nullptr) {
  const train::RunSpec run = train::RunSpec::load(s, p.run);
  at::set_num_threads(run.threads);
  const ProbeOutcome o = execute_probe(s, p, run, Predicate::parse(p.predicate), comm, cut_short);
  if (o.cut) return false;
  s.put_probe(to_record(p, o));
  return true;
}

// The serial of the probe a SIGUSR1 asked to cut short (sigqueue's value); 0: none.
std::atomic<long> g_cut_serial{0};

void on_cut(int, siginfo_t* info, void*) { g_cut_serial.store(info->si_value.sival_int); }

}  // namespace

int probe_worker(const std::string& store_path, const std::string& probe_json) {
  const ProbeSpec p = ProbeSpec::from_json(probe_json);
  store::Store s = store::Store::open(store_path, store::Mode::kReadWrite);
  run_into_cache(s, p);
  return 0;
}

int probe_server(const std::string& store_path, int reply_fd, const std::string& device) {
  // Cut requests (see run_workers): SA_RESTART keeps the read of the next probe going. The
  // pool starts us with SIGUSR1 blocked, so one sent before this handler exists waits for it.
  struct sigaction sa {};
  sa.sa_sigaction = on_cut;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
  store::Store s = store::Store::open(store_path, store::Mode::kReadWrite);
  // Rank 0 of a group: every line goes to the other ranks too, which run it in lockstep
  // (follow_probes); no cuts (a probe on ranks stops only where all of them stop).
  std::unique_ptr<train::Comm> comm = train::connect_ranks(train::DistEnv::from_env(), device);
  std::string line;
  long serial = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const long mine = ++serial;
    bool stored = true;
    const bool warm_up = line.rfind("warm ", 0) == 0;
    try {
      if (comm) comm->broadcast_text(line);
      if (warm_up) {
        const ProbeSpec p = ProbeSpec::from_json(line.substr(5));
        const train::RunSpec run = train::RunSpec::load(s, p.run);
        at::set_num_threads(run.threads);
        warm_probe(s, p, run, comm.get());
      } else if (comm) {
        stored = run_into_cache(s, ProbeSpec::from_json(line), {}, comm.get());
      } else {
        stored = run_into_cache(s, ProbeSpec::from_json(line), [mine] { return g_cut_serial.load() == mine; });
      }
    } catch (const std::exception& e) {
      std::string why = e.what();
      why = why.substr(0, why.find('\n'));
      write_all(reply_fd, "error: " + why + "\n");
      const auto* err = dynamic_cast<const Error*>(&e);
      return err ? static_cast<int>(err->code()) : static_cast<int>(ExitCode::kInternal);
    }
    if (!write_all(reply_fd, warm_up ? "warm\n" : stored ? "done\n" : "cut\n")) break;  // nobody listens
  }
  if (comm) comm->broadcast_text("");  // the other ranks end
  return 0;
}

int follow_probes(const std::string& store_path, train::Comm& comm) {
  store::Store s = store::Store::open(store_path, store::Mode::kReadOnly);
  for (;;) {
    const std::string text = comm.broadcast_text("");
    if (text.empty()) return 0;
    // The same spec, store and predicate as rank 0: the same replay, collective for collective.
    const bool warm_up = text.rfind("warm ", 0) == 0;  // a group's warm-up (probe_server)
    const ProbeSpec p = ProbeSpec::from_json(warm_up ? text.substr(5) : text);
    const train::RunSpec run = train::RunSpec::load(s, p.run);
    at::set_num_threads(run.threads);
    if (warm_up) warm_probe(s, p, run, &comm);
    else execute_probe(s, p, run, Predicate::parse(p.predicate), &comm);
  }
}

}  // namespace rwd::bisect
