// Probe batches: cache lookups, in-process execution, and long-lived worker processes started
// with posix_spawn (exec of the rewind binary), each writing its probes into the store.
#include "bisect/probe_pool.h"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>

#include "common/error.h"
#include "common/fd_io.h"
#include "common/hash.h"
#include "common/local_port.h"
#include "train/data.h"

extern char** environ;

namespace rwd::bisect {

namespace {

// The environment of a worker: ours, with CUDA_VISIBLE_DEVICES replaced when a GPU is given,
// and what we know of the token file (its fingerprint and largest token: each worker would
// otherwise read all of train.bin again).
// A rank of a group (an N-rank recording probed by G groups of N ranks) also gets
// its place in the group: RANK, LOCAL_RANK, WORLD_SIZE and the group's own rendezvous.
std::vector<std::string> worker_env(const std::string& gpu, const std::string& facts,
                                    const std::vector<std::string>& rank_vars = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (!gpu.empty() && std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0) continue;
    if (!facts.empty() && std::strncmp(*e, "REWIND_TOKEN_FILE_FACTS=", 24) == 0) continue;
    bool replaced = false;
    for (const auto& v : rank_vars) replaced = replaced || std::strncmp(*e, v.c_str(), v.find('=') + 1) == 0;
    if (!replaced) env.emplace_back(*e);
  }
  if (!gpu.empty()) env.push_back("CUDA_VISIBLE_DEVICES=" + gpu);
  if (!facts.empty()) env.push_back(facts);
  for (const auto& v : rank_vars) env.push_back(v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

ProbePool::ProbePool(store::Store& s, const train::RunSpec& run, const Predicate& pred,
                     PoolOptions options)
    : store_(s), run_(run), pred_(pred), options_(std::move(options)) {
  if (options_.jobs < 1) throw UsageError("bisect: --jobs must be >= 1");
  if (options_.runner && (options_.comm || options_.ranks != 1))
    throw UsageError("bisect: probes of a script (--cmd) run on one rank each");
  if (options_.ranks < 1) throw UsageError("bisect: a worker's ranks must be at least 1");
  if (options_.comm) {
    world_ = options_.comm->world();
    if (options_.jobs != 1 || !options_.gpus.empty() || options_.ranks != 1)
      throw UsageError("bisect: probes on several ranks run one at a time (jobs 1, no GPU list)");
  }
  if (options_.ranks > 1) world_ = options_.ranks;
}

// The fd a worker writes its replies to (its standard output stays the user's terminal's).
constexpr int kReplyFd = 3;

ProbePool::~ProbePool() {
  stop_workers();
  if (!options_.comm || released_ || in_probe_) return;
  try {
    release_ranks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: bisect: cannot release the other ranks: %s\n", e.what());
  }
}

void ProbePool::release_ranks() {
  if (!options_.comm || released_) return;
  released_ = true;
  options_.comm->broadcast_text("");
}

std::vector<ProbeOutcome> ProbePool::run(const std::vector<ProbeSpec>& batch, int stop_after_fails) {
  std::vector<ProbeOutcome> out(batch.size());
  std::vector<std::string> keys;
  std::vector<bool> known(batch.size(), false);
  std::map<std::string, size_t> first;  // key -> index of its first occurrence in batch
  std::vector<ProbeSpec> todo;
  for (size_t i = 0; i < batch.size(); ++i) {
    keys.push_back(key(batch[i]));
    if (first.count(keys[i])) continue;
    first[keys[i]] = i;
    if (!options_.fresh) {
      auto rec = store_.get_probe(keys[i]);
      std::optional<ProbeOutcome> o = rec ? from_record(*rec) : std::nullopt;
      if (o) {
        out[i] = *o;
        known[i] = true;
        ++cached_;
        continue;
      }
    }
    todo.push_back(batch[i]);
  }
  int failed = 0;  // of the batch so far (a race ends at stop_after_fails)
  for (size_t i = 0; i < batch.size(); ++i) failed += known[i] && out[i].fails;
  const auto settled = [&] { return stop_after_fails > 0 && failed >= stop_after_fails; };
  auto skip = [&](const ProbeSpec& p) {  // a race already decided: not run
    ProbeOutcome o;
    o.key = key(p);
    o.cut = true;
    ++skipped_;
    return o;
  };
  std::vector<ProbeOutcome> fresh;
  if (options_.runner && options_.jobs > 1) {
    if (settled())
      for (const auto& p : todo) fresh.push_back(skip(p));
    else
      fresh = run_external(todo, stop_after_fails > 0 ? stop_after_fails - failed : 0);
  } else if (options_.jobs == 1 && options_.ranks == 1) {
    for (const auto& p : todo) {
      if (settled()) {
        fresh.push_back(skip(p));
        continue;
      }
      if (options_.comm) {
        if (released_) throw BisectError(ExitCode::kInternal, "probe asked for after the ranks were released");
        in_probe_ = true;
        options_.comm->broadcast_text(p.to_json());  // the other ranks run it with us
      }
      ProbeOutcome o;
      const double sent = since_began();
      if (options_.runner) {
        const auto t0 = std::chrono::steady_clock::now();
        EarlyVerdict early(store_, p, run_, pred_);
        const ExternalRun r = options_.runner(p, run_, 0, [&early](const ExternalRun& so_far) {
          return early.stop(so_far) ? Watch::kStop : Watch::kGoOn;
        });
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        o = judge_probe(store_, p, run_, pred_, key(p), r, wall);
        o.held_at = early.held_at();
      } else {
        o = execute_probe(store_, p, run_, pred_, options_.comm);
      }
      in_probe_ = false;
      o.sent_s = sent;
      o.done_s = since_began();
      store_.put_probe(to_record(p, o));
      failed += o.fails;
      ++executed_;
      fresh.push_back(o);
    }
  } else if (settled()) {  // decided by cached probes
    for (const auto& p : todo) fresh.push_back(skip(p));
  } else if (!todo.empty()) {
    fresh = run_workers(todo, stop_after_fails > 0 ? stop_after_fails - failed : 0);
  }
  for (auto& o : fresh) {
    size_t i = first.at(o.key);
    o.cached = false;
    out[i] = o;
    known[i] = true;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!known[i]) out[i] = out[first.at(keys[i])];
    if (on_done) on_done(batch[i], out[i]);
  }
  return out;
}

double ProbePool::since_began() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
}

std::string ProbePool::key(const ProbeSpec& p) const {
  const std::string k = probe_key(p, run_, pred_, world_);
  return options_.key_extra.empty() ? k : hex64(fnv1a64(k + "\n" + options_.key_extra));
}

void ProbePool::start_workers() {
  // The data file checked once here (the workers restore from the same checkpoint data).
  std::string facts;
  try {
    train::TokenFile data(run_.data_path);
    data.fingerprint();
    data.max_token();
    facts = train::token_file_facts_env();
  } catch (const Error&) {
    // unreadable here: each worker reports it with its own one-line error
  }
  std::signal(SIGPIPE, SIG_IGN);  // a worker that died: its write fails instead of killing us
  const int n = std::max(1, options_.ranks);
  for (int slot = 0; slot < options_.jobs; ++slot) {
    // The slot's GPUs: one per rank, in turn from the list (LOCAL_RANK r takes the r-th).
    std::string gpu;
    for (int r = 0; r < n && !options_.gpus.empty(); ++r)
      gpu += (r ? "," : "") + options_.gpus[static_cast<size_t>(slot * n + r) % options_.gpus.size()];
    std::vector<std::string> rank_vars;
    if (n > 1)
      rank_vars = {"WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                   "MASTER_PORT=" + std::to_string(free_local_port()), "RANK=0", "LOCAL_RANK=0"};
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0)
      throw BisectError(ExitCode::kInternal, std::string("pipe: ") + std::strerror(errno));
    Worker w;
    w.to = in[1];
    w.from = out[0];
    // Rank 0 serves the slot's probes (pipes on fd 0 and kReplyFd); ranks 1.. follow it.
    for (int r = 0; r < n; ++r) {
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      if (r == 0) {
        posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        posix_spawn_file_actions_adddup2(&fa, out[1], kReplyFd);
      } else {
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
      }
      for (int fd : {in[0], in[1], out[0], out[1]})
        if (r > 0 || (fd != 0 && fd != kReplyFd)) posix_spawn_file_actions_addclose(&fa, fd);
      for (const Worker& other : workers_) {  // the other workers' pipes stay theirs
        posix_spawn_file_actions_addclose(&fa, other.to);
        posix_spawn_file_actions_addclose(&fa, other.from);
      }
      std::vector<std::string> args = {options_.exe, "bisect", "__probe", "--store", store_.path()};
      if (r == 0) args.insert(args.end(), {"--serve", std::to_string(kReplyFd)});
      else args.push_back("--follow");
      if (n > 1) {
        args.insert(args.end(), {"--device", run_.device});
        rank_vars[3] = "RANK=" + std::to_string(r);
        rank_vars[4] = "LOCAL_RANK=" + std::to_string(r);
      }
      std::vector<std::string> env = worker_env(gpu, facts, rank_vars);
      auto argv = c_strings(args);
      auto envp = c_strings(env);
      // SIGUSR1 (a cut request) blocked until the worker's handler is in place (probe_server).
      posix_spawnattr_t attr;
      posix_spawnattr_init(&attr);
      sigset_t mask;
      sigemptyset(&mask);
      sigaddset(&mask, SIGUSR1);
      posix_spawnattr_setsigmask(&attr, &mask);
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
      pid_t pid = -1;
      const int rc = posix_spawn(&pid, options_.exe.c_str(), &fa, &attr, argv.data(), envp.data());
      posix_spawnattr_destroy(&attr);
      posix_spawn_file_actions_destroy(&fa);
      if (rc != 0) {
        for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
        for (pid_t f : w.followers) kill(f, SIGKILL);
        if (w.pid > 0) kill(w.pid, SIGKILL);
        throw BisectError(ExitCode::kInternal,
                          "cannot start a probe worker (" + options_.exe + "): " + std::strerror(rc));
      }
      if (r == 0) w.pid = pid;
      else w.followers.push_back(pid);
    }
    close(in[0]);
    close(out[1]);
    workers_.push_back(w);
  }
}

namespace {

// Workers told to end and not yet collected. Their ends (a CUDA context torn down: 0.3-0.5 s
// on a GPU) overlap the bisect's reports, and nobody waits for them: those still ending when
// the bisect exits end after it (and init collects them).
std::mutex g_ending_mu;
std::vector<pid_t>& ending() {
  static std::vector<pid_t> pids;
  return pids;
}

}  // namespace

void reap_ended_workers() {
  std::lock_guard<std::mutex> lock(g_ending_mu);
  std::vector<pid_t>& pids = ending();
  pids.erase(std::remove_if(pids.begin(), pids.end(),
                            [](pid_t pid) {
                              int st = 0;
                              pid_t r;
                              while ((r = waitpid(pid, &st, WNOHANG)) < 0 && errno == EINTR) {
                              }
                              return r != 0;  // collected, or not ours to wait for
                            }),
             pids.end());
}

void ProbePool::stop_workers() {
  if (workers_.empty()) return;
  std::lock_guard<std::mutex> lock(g_ending_mu);
  for (Worker& w : workers_) {
    close(w.to);  // an idle worker reads the end of its input and exits
    close(w.from);
    if (w.busy && w.pid > 0) kill(w.pid, SIGKILL);  // cut short by an error: nobody waits for it
    if (w.pid > 0) ending().push_back(w.pid);
    // A group's followers end when rank 0 releases them; without it (rank 0 killed or ended on
    // an error) they would wait inside a collective until its timeout.
    for (pid_t f : w.followers) {
      if (w.busy || w.pid < 0) kill(f, SIGKILL);
      ending().push_back(f);
    }
  }
  workers_.clear();
}

std::vector<ProbeOutcome> ProbePool::run_workers(const std::vector<ProbeSpec>& todo, int stop_after_fails) {
  if (workers_.empty()) start_workers();
  std::vector<int> on(workers_.size(), -1);  // the todo index each worker runs
  std::vector<ProbeOutcome> out(todo.size());
  std::vector<bool> answered(todo.size(), false);
  std::vector<double> sent(todo.size(), -1);
  size_t next = 0;
  int failed = 0;
  std::string first_error;
  auto fail = [&](size_t i, const std::string& why) {
    if (first_error.empty()) first_error = "probe worker for " + todo[i].label() + ": " + why;
  };
  const auto settled = [&] { return stop_after_fails > 0 && failed >= stop_after_fails; };
  for (;;) {
    // Hand out probes to idle workers, unless an error stopped the batch or a race is decided.
    for (size_t k = 0; k < workers_.size() && next < todo.size() && first_error.empty() && !settled(); ++k) {
      if (workers_[k].busy || workers_[k].pid < 0) continue;
      if (!write_all(workers_[k].to, todo[next].to_json() + "\n")) {
        fail(next, "the worker has ended");
        break;
      }
      workers_[k].busy = workers_[k].warmed = true;
      workers_[k].cutting = false;
      ++workers_[k].serial;
      ++executed_;
      sent[next] = since_began();
      on[k] = static_cast<int>(next++);
    }
    // A worker the first batch leaves idle gets ready for the next one (its cold start, 2-4 s
    // for gpt2-small, would otherwise fall into the next round); the batch does not wait for it.
    for (Worker& w : workers_)
      if (!w.busy && !w.warmed && w.pid > 0 && !todo.empty() && first_error.empty()) {
        if (!write_all(w.to, "warm " + todo.front().to_json() + "\n")) continue;  // its end shows later
        w.busy = w.warming = w.warmed = true;
        ++w.serial;
      }
    // A decided race: the probes still running are cut short (their workers stay warm).
    for (Worker& w : workers_)
      if (settled() && w.busy && !w.warming && !w.cutting && w.pid > 0) {
        union sigval v;
        v.sival_ptr = nullptr;
        v.sival_int = static_cast<int>(w.serial);
        sigqueue(w.pid, SIGUSR1, v);
        w.cutting = true;
      }
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    bool running = false;  // a probe of this batch
    for (size_t k = 0; k < workers_.size(); ++k)
      if (workers_[k].busy) {
        fds.push_back({workers_[k].from, POLLIN, 0});
        which.push_back(k);
        running = running || !workers_[k].warming;
      }
    // Every probe answered (or an error, or a decided race, and nothing of ours left running);
    // warm-ups still going are read by a later batch.
    const bool more = next < todo.size() && first_error.empty() && !settled();
    if (!running && !(more && !fds.empty())) break;
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw BisectError(ExitCode::kInternal, std::string("poll: ") + std::strerror(errno));
    }
    for (size_t f = 0; f < fds.size(); ++f) {
      if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = workers_[which[f]];
      const int job = w.warming ? -1 : on[which[f]];
      const size_t i = job >= 0 ? static_cast<size_t>(job) : 0;
      char buf[4096];
      const ssize_t n = read(w.from, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // it ended inside the probe (or its warm-up)
        int st = 0;
        while (waitpid(w.pid, &st, 0) < 0 && errno == EINTR) {
        }
        const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        w.busy = w.warming = false;
        w.pid = -1;
        fail(i, "exited with status " + std::to_string(code) + (job < 0 ? " getting ready" : ""));
        continue;
      }
      w.replies.append(buf, static_cast<size_t>(n));
      const size_t eol = w.replies.find('\n');
      if (eol == std::string::npos) continue;
      const std::string line = w.replies.substr(0, eol);
      w.replies.erase(0, eol + 1);
      w.busy = false;
      if (job < 0) {
        w.warming = false;
        if (line != "warm") fail(i, "getting ready: " + line);
      } else if (line == "cut") {
        out[i].key = key(todo[i]);
        out[i].cut = true;
        out[i].sent_s = sent[i];
        out[i].done_s = since_began();
        answered[i] = true;
        ++cut_;
      } else if (line == "done") {
        auto rec = store_.get_probe(key(todo[i]));
        std::optional<ProbeOutcome> o = rec ? from_record(*rec) : std::nullopt;
        if (!o) {
          fail(i, "left no probe in the store");
          continue;
        }
        out[i] = *o;
        out[i].sent_s = sent[i];
        out[i].done_s = since_began();
        answered[i] = true;
        failed += o->fails;
      } else {
        fail(i, line);
      }
    }
  }
  if (!first_error.empty()) {
    stop_workers();  // a worker that ended is not restarted: the bisect ends here
    throw BisectError(ExitCode::kInternal, first_error);
  }
  for (size_t i = 0; i < todo.size(); ++i) {
    if (answered[i]) continue;
    if (!settled()) throw BisectError(ExitCode::kInternal, "no probe worker is left");
    out[i].key = key(todo[i]);  // a decided race: never started
    out[i].cut = true;
    ++skipped_;
  }
  return out;
}

}  // namespace rwd::bisect
