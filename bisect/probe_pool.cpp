// Probe batches: cache lookups, in-process execution, and worker processes started with
// posix_spawn (exec of the rewind binary), each writing its probe into the store.
#include "bisect/probe_pool.h"

#include <ATen/Parallel.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/error.h"
#include "train/data.h"

extern char** environ;

namespace rwd::bisect {

namespace {

// The environment of a worker: ours, with CUDA_VISIBLE_DEVICES replaced when a GPU is given,
// and what we know of the token file (its fingerprint and largest token: each worker would
// otherwise read all of train.bin again).
std::vector<std::string> worker_env(const std::string& gpu, const std::string& facts) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (!gpu.empty() && std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0) continue;
    if (!facts.empty() && std::strncmp(*e, "REWIND_TOKEN_FILE_FACTS=", 24) == 0) continue;
    if (std::strncmp(*e, "REWIND_WARM_BYTES=", 18) == 0) continue;
    env.emplace_back(*e);
  }
  env.push_back("REWIND_WARM_BYTES=0");  // a worker runs one probe: a kept checkpoint is only memory
  if (!gpu.empty()) env.push_back("CUDA_VISIBLE_DEVICES=" + gpu);
  if (!facts.empty()) env.push_back(facts);
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
  if (options_.comm) {
    world_ = options_.comm->world();
    if (options_.jobs != 1 || !options_.gpus.empty())
      throw UsageError("bisect: probes on several ranks run one at a time (jobs 1, no GPU list)");
  }
}

ProbePool::~ProbePool() {
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

std::vector<ProbeOutcome> ProbePool::run(const std::vector<ProbeSpec>& batch) {
  std::vector<ProbeOutcome> out(batch.size());
  std::vector<std::string> keys;
  std::vector<bool> known(batch.size(), false);
  std::map<std::string, size_t> first;  // key -> index of its first occurrence in batch
  std::vector<ProbeSpec> todo;
  for (size_t i = 0; i < batch.size(); ++i) {
    keys.push_back(probe_key(batch[i], run_, pred_, world_));
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
  std::vector<ProbeOutcome> fresh;
  if (options_.jobs == 1 || (todo.size() == 1 && options_.gpus.empty())) {
    for (const auto& p : todo) {
      if (options_.comm) {
        if (released_) throw BisectError(ExitCode::kInternal, "probe asked for after the ranks were released");
        in_probe_ = true;
        options_.comm->broadcast_text(p.to_json());  // the other ranks run it with us
      }
      ProbeOutcome o = execute_probe(store_, p, run_, pred_, options_.comm);
      in_probe_ = false;
      store_.put_probe(to_record(p, o));
      fresh.push_back(o);
    }
  } else if (!todo.empty()) {
    fresh = run_workers(todo);
  }
  executed_ += static_cast<int>(fresh.size());
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

std::vector<ProbeOutcome> ProbePool::run_workers(const std::vector<ProbeSpec>& todo) {
  const int slots = options_.jobs;
  std::vector<int> slot_busy(slots, 0);
  std::map<pid_t, std::pair<size_t, int>> running;  // pid -> (todo index, slot)
  std::vector<int> status(todo.size(), -1);
  size_t next = 0;
  std::string first_error;
  auto reap_one = [&]() {
    int st = 0;
    pid_t pid;
    do {
      pid = waitpid(-1, &st, 0);
    } while (pid < 0 && errno == EINTR);
    if (pid < 0) throw BisectError(ExitCode::kInternal, std::string("waitpid: ") + std::strerror(errno));
    auto it = running.find(pid);
    if (it == running.end()) return;  // not one of ours (cannot happen: we spawn nothing else)
    status[it->second.first] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    slot_busy[it->second.second] = 0;
    running.erase(it);
  };
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
  while (next < todo.size() || !running.empty()) {
    if (next < todo.size() && static_cast<int>(running.size()) < slots && first_error.empty()) {
      int slot = 0;
      while (slot_busy[slot]) ++slot;
      const std::string gpu =
          options_.gpus.empty() ? "" : options_.gpus[slot % options_.gpus.size()];
      std::vector<std::string> args = {options_.exe,   "bisect", "__probe", "--store",
                                       store_.path(), "--probe", todo[next].to_json()};
      std::vector<std::string> env = worker_env(gpu, facts);
      auto argv = c_strings(args);
      auto envp = c_strings(env);
      pid_t pid = 0;
      int rc = posix_spawn(&pid, options_.exe.c_str(), nullptr, nullptr, argv.data(), envp.data());
      if (rc != 0) {
        first_error = "cannot start a probe worker (" + options_.exe + "): " + std::strerror(rc);
        continue;
      }
      slot_busy[slot] = 1;
      running[pid] = {next, slot};
      ++next;
      continue;
    }
    if (running.empty()) break;
    reap_one();
  }
  if (!first_error.empty()) throw BisectError(ExitCode::kInternal, first_error);
  std::vector<ProbeOutcome> out;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (status[i] != 0)
      throw BisectError(ExitCode::kInternal, "probe worker for " + todo[i].label() +
                                                 " exited with status " + std::to_string(status[i]));
    const std::string key = probe_key(todo[i], run_, pred_);
    auto rec = store_.get_probe(key);
    std::optional<ProbeOutcome> o = rec ? from_record(*rec) : std::nullopt;
    if (!o)
      throw BisectError(ExitCode::kInternal,
                        "probe worker for " + todo[i].label() + " left no probe in the store");
    out.push_back(*o);
  }
  return out;
}

int probe_worker(const std::string& store_path, const std::string& probe_json) {
  ProbeSpec p = ProbeSpec::from_json(probe_json);
  store::Store s = store::Store::open(store_path, store::Mode::kReadWrite);
  train::RunSpec run = train::RunSpec::load(s, p.run);
  at::set_num_threads(run.threads);  // the recorded thread count: replay is bitwise per count
  Predicate pred = Predicate::parse(p.predicate);
  ProbeOutcome o = execute_probe(s, p, run, pred);
  s.put_probe(to_record(p, o));
  return 0;
}

int follow_probes(const std::string& store_path, train::Comm& comm) {
  store::Store s = store::Store::open(store_path, store::Mode::kReadOnly);
  for (;;) {
    const std::string text = comm.broadcast_text("");
    if (text.empty()) return 0;
    // The same spec, store and predicate as rank 0: the same replay, collective for collective.
    const ProbeSpec p = ProbeSpec::from_json(text);
    const train::RunSpec run = train::RunSpec::load(s, p.run);
    execute_probe(s, p, run, Predicate::parse(p.predicate), &comm);
  }
}

}  // namespace rwd::bisect
