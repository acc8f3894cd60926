// `rewind train`: train a GPT under a precision plan, optionally recording into a store;
// `--resume STORE` continues a recording bitwise from its last checkpoint (--plan, --plan-from
// and the recording options apply from its next step on; what cannot apply is refused);
// `--fork STORE --at S` starts a new run from step S of a recording.
#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/options.h"
#include "common/error.h"
#include "train/recorder.h"
#include "replay/replayer.h"
#include "train/device_memory.h"
#include "train/dist.h"
#include "train/run_spec.h"
#include "train/trainer.h"
#include "store/store.h"
#include "store/writer_lock.h"

namespace rwd::cli {

namespace {

// Where a recorded iteration's host time went besides the training step (milliseconds).
struct RecordingMs {
  double checkpoint = 0, digest = 0, store = 0;
};

// wall_ms: the whole iteration (checkpoint, step, digest, recording), what a run's length is
// made of; r.seconds covers the training step alone, and on a GPU the host's recording work
// overlaps the device's optimizer work, so only the wall time shows what recording costs.
// When recording, the line adds the iteration's recording parts on the training thread: the
// checkpoint snapshot (and any wait for the writer), the parameter digest, and the step's
// store part: copying the row and captures and queueing them for the step writer, which
// commits in the background. On a GPU the digest reads its sums back, so it includes waiting
// for the device work queued before it (the optimizer's); the checkpoint's copy runs on the
// device in the background.
void print_step(const train::StepResult& r, double wall_ms, bool resumed_check, const RecordingMs* rec) {
  char parts[128] = "";
  if (rec != nullptr) {
    std::snprintf(parts, sizeof parts, " (recording: checkpoint %.1f, digest %.1f, store %.1f ms)",
                  rec->checkpoint, rec->digest, rec->store);
  }
  std::printf("step %6lld | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms%s%s\n",
              static_cast<long long>(r.step), static_cast<double>(r.loss), r.lr,
              static_cast<double>(r.grad_norm), wall_ms, parts, resumed_check ? " | matches recording" : "");
  std::fflush(stdout);
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Replicas must hold the same parameters after every step (checkpoints are written once, by
// rank 0): every rank's digest is compared with rank 0's, through the host.
void check_replicas(train::Comm& comm, const std::string& digest, int64_t step) {
  const int64_t mine = static_cast<int64_t>(std::stoull(digest.substr(digest.find(':') + 1), nullptr, 16));
  const std::vector<int64_t> all = comm.host_allgather_int64(mine);
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      throw Error(ExitCode::kInternal, "replicas diverged at step " + std::to_string(step) + ": rank " +
                                           std::to_string(r) + "'s parameters differ from rank 0's");
}

// A rank's parameter digest of `step`, not yet compared with the other ranks'.
struct UncheckedDigest {
  int64_t step = -1;
  std::function<std::string()> digest;
};

std::string dashed(std::string key) {
  for (char& c : key)
    if (c == '_') c = '-';
  return key;
}

// A run that goes on from a recording (`how`: "--resume" or "--fork") has the recording's
// model and optimisation: --preset, --config and the config keys (but --max-iters, the same
// as --steps) are refused, as is --device, --attention or --threads other than the recorded
// one (the run goes on bitwise only there), each in one line naming the option.
void refuse_new_run_options(const cxxopts::ParseResult& r, const std::string& how) {
  std::vector<std::string> keys = {"preset", "config"};
  for (int i = 0; i < train::kNumConfigKeys; ++i) keys.push_back(dashed(train::kConfigKeys[i]));
  for (const std::string& k : keys)
    if (k != "max-iters" && r.count(k))
      throw UsageError("train " + how + ": --" + k + " cannot apply: the model and optimisation are the recorded " +
                       "run's (a new run takes them)");
}

void refuse_other_recorded(const cxxopts::ParseResult& r, const train::RunSpec& spec, const std::string& how) {
  const std::string run = "run " + std::to_string(spec.run_id);
  auto differs = [&](const char* key, const std::string& given, const std::string& recorded, const std::string& what) {
    if (r.count(key) && given != recorded)
      throw UsageError("train " + how + ": --" + key + " " + given + " cannot apply: " + run + " was recorded " + what +
                       " and goes on bitwise only there");
  };
  differs("device", r["device"].as<std::string>(), spec.device, "on " + spec.device);
  differs("attention", r["attention"].as<std::string>(), spec.attention, "with --attention " + spec.attention);
  differs("threads", std::to_string(r["threads"].as<int>()), std::to_string(spec.threads),
          "with " + std::to_string(spec.threads) + " thread(s)");
}

// --steps (or --max-iters): the total step count; `next`: the first step this run would train.
void set_total(const cxxopts::ParseResult& r, train::RunSpec& spec, int64_t next, const std::string& recorded_to) {
  if (r.count("max-iters")) train::set_config_value(spec.config, "max-iters", r["max-iters"].as<std::string>());
  if (r.count("steps")) spec.config.max_iters = r["steps"].as<int>();
  if (spec.config.max_iters > next) return;
  const std::string total = std::to_string(spec.config.max_iters);
  throw UsageError("nothing to do: " + recorded_to + " and " +
                   (r.count("steps") || r.count("max-iters") ? "--steps " + total + " asks for no step after it"
                                                              : "its max_iters is " + total + " (no --steps given)") +
                   "; --steps is the total step count (max_iters): give more than " + std::to_string(next));
}

// --keep-last K / --keep-every M when given (each at least 1); returns whether one was.
bool retention_options(const cxxopts::ParseResult& r, train::RunSpec& spec) {
  auto take = [&](const char* key, int& out) {
    if (!r.count(key)) return false;
    out = r[key].as<int>();
    if (out < 1) throw UsageError(std::string("train: --") + key + " must be 1 or more, got " + std::to_string(out));
    return true;
  };
  const bool last = take("keep-last", spec.keep_last);
  const bool every = take("keep-every", spec.keep_every);
  return last || every;
}

// --monitor-every, checked where it is read: before a store is created or its meta rewritten.
int monitor_every_option(const cxxopts::ParseResult& r) {
  const int n = r["monitor-every"].as<int>();
  if (n < 1) throw UsageError("--monitor-every must be at least 1");
  return n;
}

// --checkpoint-every K: K >= 1, else the store would hold no checkpoint (0) or one its readers
// refuse (negative), and nothing could replay, resume or bisect it.
int checkpoint_every_option(const cxxopts::ParseResult& r) {
  const int k = r["checkpoint-every"].as<int>();
  if (k < 1)
    throw UsageError("train: --checkpoint-every must be 1 or more, got " + std::to_string(k) +
                     " (a recording needs checkpoints to replay from)");
  return k;
}

// A CPU model whose training state cannot fit in the memory available, refused before it is
// allocated (LibTorch would fail deep in an allocator). The estimate is a lower bound: FP32
// weights, gradients and two AdamW moments, 16 bytes a parameter, activations left out.
void refuse_model_beyond_memory(const train::Config& c, const std::string& device) {
  if (device != "cpu") return;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib && key != "MemAvailable:") meminfo.ignore(256, '\n');
  if (key != "MemAvailable:" || kib <= 0) return;
  const double e = c.n_embd;
  const double params = (double(c.vocab_size) + c.block_size) * e + double(c.n_layer) * 12.0 * e * e;
  const double need_gib = params * 16.0 / double(1 << 30), have_gib = kib / double(1 << 20);
  if (need_gib > have_gib) {
    char line[256];
    std::snprintf(line, sizeof line, "train: this model (%.3g parameters) needs at least %.1f GiB for its training "
                  "state; %.1f GiB of memory is available", params, need_gib, have_gib);
    throw UsageError(line);
  }
}

// --record PATH, checked before the model is built: an existing store is refused, and a stub
// (a file a recording killed as it started left, holding nothing) is said to be replaced,
// which Store::create then does.
void check_record_path(const cxxopts::ParseResult& r, const train::DistEnv& env) {
  if (!r.count("record") || env.rank != 0) return;
  const std::string path = r["record"].as<std::string>();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;
  if (const std::optional<std::string> why = store::Store::stub_reason(path)) {
    std::printf("record: %s is %s; nothing is stored in it, so it is replaced\n", path.c_str(), why->c_str());
    // Store::create replaces a file-level stub itself; an empty rewind store (a run never
    // added) goes here, under the writer lock, so a recording that holds it keeps it.
    if (st.st_size > 0) {
      const store::WriterLock lock(path, "replacing an empty store (rewind train --record)");
      if (!store::Store::stub_reason(path)) return;  // it is a stub no more; create refuses it
      for (const char* side : {"", "-wal", "-shm", "-journal"}) ::unlink((path + side).c_str());
    }
    return;
  }
  throw store::data_error("store " + path + ": already exists; refusing to overwrite it (record into a new file, "
                          "or go on with it: rewind train --resume " + path + ")");
}

// The recording options a resumed or forked run takes from the command line when given
// (--checkpoint-every, --digest-every, --monitor-every, --batches, --keep-last, --keep-every);
// otherwise the recorded ones.
void recording_options(const cxxopts::ParseResult& r, train::RunSpec& spec) {
  retention_options(r, spec);
  if (r.count("checkpoint-every")) spec.checkpoint_every = checkpoint_every_option(r);
  if (r.count("digest-every")) spec.digest_every = r["digest-every"].as<int>();
  if (r.count("monitor-every")) spec.monitor_every = monitor_every_option(r);
  if (r.count("batches")) {
    const std::string batches = r["batches"].as<std::string>();
    if (batches != "offsets" && batches != "full") throw UsageError("--batches must be offsets or full");
    spec.full_batches = batches == "full";
  }
}

// --plan-from STEP:SPEC on a run that goes on from step `from` (resume, fork): a change of the
// schedule at STEP, which must be `from` or later (earlier steps are the recording's).
void add_plan_from(train::PlanSchedule& sched, const cxxopts::ParseResult& r, int64_t from, const std::string& how) {
  if (!r.count("plan-from")) return;
  for (const auto& a : r["plan-from"].as<std::vector<std::string>>()) {
    train::PlanSchedule one;
    one.add_change(a);
    if (one.changes[0].first < from)
      throw UsageError("train " + how + ": --plan-from " + a + " cannot apply: step " +
                       std::to_string(one.changes[0].first) + " is recorded; this run goes on from step " +
                       std::to_string(from) + " (a plan change starts there or later)");
    sched.add_change(a);
  }
}

// A resumed or forked run takes its recorded rank count (its gradients are summed in that order).
void require_recorded_ranks(const train::RunSpec& spec, const train::DistEnv& env, const char* verb) {
  if (spec.world_size != env.world)
    throw UsageError("run " + std::to_string(spec.run_id) + " was recorded on " + std::to_string(spec.world_size) +
                     " rank(s); " + verb + " it with --nproc-per-node " + std::to_string(spec.world_size));
}

// --plan SPEC on a run going on from step `from` (resume, fork): SPEC on top of every recorded
// change at `from` or later, so the run keeps SPEC throughout; earlier changes are untouched.
void extra_on_changes(train::PlanSchedule& sched, const std::string& extra, int64_t from) {
  if (extra.empty()) return;
  for (auto& ch : sched.changes)
    if (ch.first >= from) ch.second += ";" + extra;
}

// --plan SPEC on `train --resume`: on top of the recorded plan from step `next` (the first
// step the resume records) on, as a change of the schedule at `next` and on top of every
// recorded change after it; then --plan-from. Steps before `next` keep their recorded plan.
// Every plan is parsed now, before anything is written. Returns whether the schedule changed.
bool resume_plan(train::RunSpec& spec, const cxxopts::ParseResult& r, int64_t next) {
  const std::string extra = r["plan"].as<std::string>();
  train::PlanSchedule& sched = spec.plan;
  const size_t before = sched.changes.size();
  if (!extra.empty()) {
    extra_on_changes(sched, extra, next);
    sched.add_change(std::to_string(next) + ":" + extra);
  }
  add_plan_from(sched, r, next, "--resume");
  for (const auto& ch : sched.changes) sched.at(ch.first, spec.config.n_layer, spec.config.n_head);
  return sched.changes.size() != before;
}

}  // namespace

int run_train(int argc, char** argv) {
  cxxopts::Options opts("rewind train",
                        "train a GPT with BF16 mixed precision under a precision plan\n\n"
                        "  rewind train --data train.bin --steps 200 --record run.db\n"
                        "  rewind train --preset small-cpu --data train.bin --plan 'L*.H*.softmax=stable(beta=2)'\n"
                        "  rewind train --resume run.db --steps 400\n"
                        "  rewind train --fork run.db --at 4500 --plan 'L2.H*.qk=fp32' --record fixed.db --steps 8000\n");
  add_config_options(opts);
  opts.add_options()
      ("data", "nanoGPT uint16 token file", cxxopts::value<std::string>())
      ("steps", "total number of steps (max_iters; with --resume the step to train to)", cxxopts::value<int>())
      ("plan", "precision plan, e.g. 'L2.H8.pv=fp32' (P̄V in FP32), 'pv=sr' (P̄ rounded to BF16 stochastically), "
               "'qk=sr' / 'acc=sr' (S / running O and l likewise); docs/plan.md has every value; with --resume or "
               "--fork on top of the recorded one",
       cxxopts::value<std::string>()->default_value(""))
      ("plan-from", "STEP:SPEC: apply SPEC on top of the plan from STEP on (repeatable)",
       cxxopts::value<std::vector<std::string>>())
      ("device", "cpu | cuda[:N] (CUDA builds; deterministic mode)", cxxopts::value<std::string>()->default_value("cpu"))
      ("attention", "rewind (our kernels, the plan) | sdpa (PyTorch's, LibTorch >= 2) | torch (FP32 math); baselines take no plan",
       cxxopts::value<std::string>()->default_value("rewind"))
      ("threads", "CPU threads (recorded; replay uses the same)", cxxopts::value<int>()->default_value("1"))
      ("record", "record into this store (created; never overwritten)", cxxopts::value<std::string>())
      ("resume", "continue the last run recorded in this store from its last checkpoint (--plan, --plan-from "
                 "and the recording options apply from its next step on)", cxxopts::value<std::string>())
      ("fork", "start a new run from step --at of the last run recorded in this store (read only), "
               "with --plan applied on top of its recorded plan", cxxopts::value<std::string>())
      ("at", "with --fork: the step to start from (restored from the checkpoint at or before it)",
       cxxopts::value<int64_t>())
      ("checkpoint-every", "checkpoint every K steps (later while the writer is busy)", cxxopts::value<int>()->default_value("20"))
      ("checkpoint-wait", "wait for a busy checkpoint writer: checkpoints exactly K apart")
      ("keep-last", "retention: keep the last K checkpoints (the first is always kept), deleting older ones "
                    "as newer ones are stored (recorded with the run: a resume keeps it)", cxxopts::value<int>())
      ("keep-every", "retention: and beyond the last K, the first checkpoint of every M steps", cxxopts::value<int>())
      ("digest-every", "parameter digest every N steps", cxxopts::value<int>()->default_value("1"))
      ("monitor-every", "per-head monitors every N steps, from step 0 (recorded with the run; the "
                        "attention forward of the other steps skips their counts)",
       cxxopts::value<int>()->default_value("1"))
      ("batches", "offsets (sample offsets + hash) | full (store tokens)", cxxopts::value<std::string>()->default_value("offsets"))
      ("capture", "attention tensors to keep, e.g. 'steps=10:12;L1.H*'", cxxopts::value<std::string>()->default_value(""))
      ("zstd-level", "zstd level of the store", cxxopts::value<int>()->default_value("1"))
      ("zstd-threads", "checkpoint compression threads (0: the idle cores, at most 2)",
       cxxopts::value<int>()->default_value("0"))
      ("log-every", "print every N steps", cxxopts::value<int>()->default_value("1"));
  add_launch_options(opts, "each of the nnodes x K ranks runs gradient_accumulation_steps / (nnodes x K) of every "
                           "step's micro-batches; rank 0 alone writes the store (default 1)");
  opts.add_options()("h,help", "show help");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (const LaunchSpec ls = launch_spec(r, "train", 0); launches(ls)) return launch_ranks(ls, argc, argv);
  const train::DistEnv env = train::DistEnv::from_env();
  quiet_unless_rank0(env.rank);
  std::unique_ptr<train::Comm> comm;

  store::StoreOptions so;
  so.zstd_level = r["zstd-level"].as<int>();
  so.zstd_workers = r["zstd-threads"].as<int>();
  if (so.zstd_workers < 0) throw UsageError("--zstd-threads must be 0 or more");
  std::unique_ptr<store::Store> st;
  train::RunSpec spec;
  std::shared_ptr<train::TokenFile> data;
  std::shared_ptr<train::Trainer> trainer;
  int64_t recorded_last = -1;  // resume: steps up to here are already in the store
  int64_t fork_at = -1;        // fork: the new recording starts with a checkpoint at this step
  std::string forked_from;

  if (r.count("fork") + r.count("resume") + (r.count("at") && !r.count("fork")) > 1 || (r.count("fork") && !r.count("at")))
    throw UsageError("train: --fork STORE needs --at STEP and excludes --resume");
  if (r.count("fork")) {
    // A branch of a recorded run: the same model, data and batches from step --at on, under
    // another plan. The source store is only read; the branch is a new run (--record) or none.
    refuse_new_run_options(r, "--fork");
    check_record_path(r, env);
    store::Store src = store::Store::open(r["fork"].as<std::string>(), store::Mode::kReadOnly, so);
    spec = train::RunSpec::load(src, 0);
    fork_at = r["at"].as<int64_t>();
    auto range = src.step_range(spec.run_id);
    if (!range || fork_at < range->first || fork_at > range->second + 1)
      throw UsageError("train: --at " + std::to_string(fork_at) + " is outside the recording" +
                       (range ? " (steps " + std::to_string(range->first) + ".." + std::to_string(range->second) + ")"
                              : " (no recorded steps)"));
    require_recorded_ranks(spec, env, "fork");
    refuse_other_recorded(r, spec, "--fork");
    set_total(r, spec, fork_at, "the branch starts at step " + std::to_string(fork_at));
    recording_options(r, spec);
    set_threads(spec.threads);
    comm = train::connect_ranks(env, spec.device);
    replay::RestoreOptions ro;
    ro.data_path = r.count("data") ? r["data"].as<std::string>() : "";
    ro.comm = comm.get();
    replay::Restored rs = replay::restore_before(src, spec.run_id, fork_at, ro);
    data = std::move(rs.data);
    trainer = std::move(rs.trainer);
    // The branch's schedule: the recorded plan at --at with --plan on top, and every later
    // recorded change with --plan on top of it too, so the branch keeps its plan throughout.
    const std::string extra = r["plan"].as<std::string>();
    const auto& c = spec.config;
    train::PlanSchedule branch;
    branch.base = plan::apply(spec.plan.at(fork_at, c.n_layer, c.n_head), extra).canonical();
    for (const auto& ch : spec.plan.changes)
      if (ch.first > fork_at) branch.changes.push_back(ch);  // earlier ones are in the base
    extra_on_changes(branch, extra, fork_at + 1);
    add_plan_from(branch, r, fork_at, "--fork");
    for (const auto& ch : branch.changes) branch.at(ch.first, c.n_layer, c.n_head);  // bad --plan: fails now
    spec.plan = branch;
    forked_from = src.path() + " run " + std::to_string(spec.run_id) + " step " + std::to_string(fork_at);
    std::printf("forking run %lld at step %lld (checkpoint %lld) under plan '%s'\n",
                static_cast<long long>(spec.run_id), static_cast<long long>(fork_at),
                static_cast<long long>(rs.checkpoint_step), branch.base.c_str());
    if (r.count("record") && env.rank == 0) {
      st = std::make_unique<store::Store>(store::Store::create(r["record"].as<std::string>(), so));
      spec.run_id = st->add_run(spec.config.to_json(), spec.plan.to_json(), spec.meta_json());
      st->put_kv(spec.run_id, "forked_from", forked_from);
    }
  } else if (r.count("resume")) {
    if (r.count("record"))
      throw UsageError("train --resume: --record cannot apply: a resumed run records into its own store "
                       "(--fork STORE --at S --record NEW starts a new one)");
    refuse_new_run_options(r, "--resume");
    // Every rank reads the checkpoint; rank 0 alone writes.
    st = std::make_unique<store::Store>(store::Store::open(
        r["resume"].as<std::string>(), env.rank == 0 ? store::Mode::kReadWrite : store::Mode::kReadOnly, so));
    spec = train::RunSpec::load(*st, 0);
    require_recorded_ranks(spec, env, "resume");
    refuse_other_recorded(r, spec, "--resume");
    auto ckpts = st->checkpoint_steps(spec.run_id);
    if (ckpts.empty())
      throw Error(ExitCode::kData, "missing checkpoint: nothing to resume from" +
                                       std::string(store::Store::stub_reason(st->path())
                                                       ? " (a recording killed before its first checkpoint); "
                                                         "`rewind train --record " + st->path() + "` replaces it"
                                                       : ""));
    auto range = st->step_range(spec.run_id);
    recorded_last = range ? range->second : -1;
    // The first step this resume records: after the last recorded one, or the checkpoint of a
    // run with no step yet (an import). Steps from the checkpoint to there are rerun and checked.
    const int64_t next = std::max(recorded_last + 1, ckpts.back());
    const std::string run = "run " + std::to_string(spec.run_id);
    const std::string recorded =
        range ? "steps " + std::to_string(range->first) + ".." + std::to_string(range->second) + " recorded"
              : "no step recorded yet";
    set_total(r, spec, next, run + " is recorded to step " + std::to_string(next) + " (" + recorded + ")");
    recording_options(r, spec);
    // A retention or monitor schedule given here is the run's from now on (stored), so a later
    // resume keeps it.
    const bool new_retention = r.count("keep-last") || r.count("keep-every");
    const bool plan_changed = resume_plan(spec, r, next);
    set_threads(spec.threads);
    comm = train::connect_ranks(env, spec.device);
    replay::RestoreOptions ro;
    ro.data_path = r.count("data") ? r["data"].as<std::string>() : "";
    ro.comm = comm.get();
    replay::Restored rs = replay::restore_before(*st, spec.run_id, ckpts.back(), ro);
    data = std::move(rs.data);
    trainer = std::move(rs.trainer);
    const std::string rerun = ckpts.back() < next ? "; " + std::to_string(ckpts.back()) + ".." +
                                                        std::to_string(next - 1) + " are rerun and checked against them"
                                                  : "";
    std::printf("resuming %s from its checkpoint at step %lld (%s%s); training steps %lld..%lld\n", run.c_str(),
                static_cast<long long>(ckpts.back()), recorded.c_str(), rerun.c_str(), static_cast<long long>(next),
                static_cast<long long>(spec.config.max_iters - 1));
    if ((new_retention || r.count("monitor-every")) && env.rank == 0) spec.store_resume_options(*st);
    if (plan_changed) {
      // Recorded as a change of the run's schedule at `next`, so replay and bisect of the
      // resumed steps use the plan they were trained under.
      if (env.rank == 0) st->update_run_plan(spec.run_id, spec.plan.to_json());
      std::printf("plan from step %lld on: '%s' (recorded in the run's plan schedule)\n", static_cast<long long>(next),
                  spec.plan.at(next, spec.config.n_layer, spec.config.n_head).canonical().c_str());
    }
  } else {
    if (!r.count("data")) throw UsageError("train: --data is required (make one with `rewind data synth`)");
    check_record_path(r, env);
    spec.config = config_from(r);
    if (r.count("steps")) spec.config.max_iters = r["steps"].as<int>();
    refuse_model_beyond_memory(spec.config, r["device"].as<std::string>());
    // Before anything is opened or written: a head dim the CUDA kernels lack is a usage error.
    spec.config.validate_for_device(r["device"].as<std::string>(),
                                    train::attention_impl(r["attention"].as<std::string>()) ==
                                        train::AttentionImpl::kRewind);
    spec.plan.base = r["plan"].as<std::string>();
    if (r.count("plan-from"))
      for (const auto& a : r["plan-from"].as<std::vector<std::string>>()) spec.plan.add_change(a);
    // Parse every plan now so a bad spec fails before anything is written.
    for (const auto& ch : spec.plan.changes) spec.plan.at(ch.first, spec.config.n_layer, spec.config.n_head);
    spec.threads = new_run_threads(r["threads"].as<int>());
    set_threads(spec.threads);
    spec.checkpoint_every = checkpoint_every_option(r);
    data = std::make_unique<train::TokenFile>(r["data"].as<std::string>());
    // One batch row reads block_size + 1 tokens from an offset below size - block_size - 1:
    // a shorter file fails at the first step, so it is refused before the store is created.
    const size_t need = static_cast<size_t>(spec.config.block_size) + 2;
    if (data->size() < need)
      throw UsageError("train: --data " + data->path() + " holds " + std::to_string(data->size()) +
                       " tokens; a batch of block size " + std::to_string(spec.config.block_size) +
                       " needs at least " + std::to_string(need));
    spec.data_path = data->path();
    spec.data_fingerprint = data->fingerprint();
    spec.digest_every = r["digest-every"].as<int>();
    spec.monitor_every = monitor_every_option(r);
    retention_options(r, spec);
    const std::string batches = r["batches"].as<std::string>();
    if (batches != "offsets" && batches != "full") throw UsageError("--batches must be offsets or full");
    spec.full_batches = batches == "full";
    spec.device = r["device"].as<std::string>();
    spec.attention = r["attention"].as<std::string>();
    spec.world_size = env.world;
    const torch::Device device = train::setup_device(train::rank_device(spec.device, env));
    spec.device_name = train::device_name(device);
    trainer = std::make_unique<train::Trainer>(
        spec.config, spec.plan.at(0, spec.config.n_layer, spec.config.n_head), *data, device,
        train::attention_impl(spec.attention));
    comm = train::connect_ranks(env, spec.device);
    trainer->set_comm(comm.get());
    if (r.count("record") && env.rank == 0) {
      st = std::make_unique<store::Store>(store::Store::create(r["record"].as<std::string>(), so));
      spec.run_id = st->add_run(spec.config.to_json(), spec.plan.to_json(), spec.meta_json());
    }
  }

  trainer->set_monitor_every(spec.monitor_every);
  std::unique_ptr<train::Recorder> rec;
  if (st && env.rank == 0) {
    train::RecordOptions ro;
    ro.checkpoint_every = spec.checkpoint_every;
    ro.wait_for_writer = r.count("checkpoint-wait") > 0;
    ro.digest_every = spec.digest_every;
    ro.full_batches = spec.full_batches;
    ro.retention = {spec.keep_last, spec.keep_every};
    ro.capture = train::CaptureSpec::parse(r["capture"].as<std::string>(), spec.config.n_layer, spec.config.n_head);
    rec = std::make_unique<train::Recorder>(st->path(), spec.run_id, ro, so);
  }
  const int log_every = std::max(1, r["log-every"].as<int>());
  const int64_t total = spec.config.max_iters;
  const auto& cfg = spec.config;
  std::printf("training %d layers x %d heads, width %d, seq %d, batch %dx%d, %lld steps, %s, %d threads%s\n",
              cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.batch_size,
              cfg.gradient_accumulation_steps, static_cast<long long>(total), spec.device.c_str(),
              at::get_num_threads(), env.active() ? (", " + std::to_string(env.world) + " ranks").c_str() : "");
  // Every rank knows whether the run records (rank 0 alone holds the recorder).
  const bool records = r.count("record") > 0 || r.count("resume") > 0;
  if (env.rank == 0 && records != (rec != nullptr))
    throw Error(ExitCode::kInternal, "train: the ranks cannot tell whether the run records");
  UncheckedDigest unchecked;  // ranks: the last step's digest, compared after the next step is queued
  while (trainer->step() < total) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t s = trainer->step();
    trainer->set_plan(spec.plan.at(s, cfg.n_layer, cfg.n_head));
    const bool already = s <= recorded_last;
    RecordingMs rms;
    if (rec && !already && (rec->checkpoint_due(s) || s == fork_at) && st->nearest_checkpoint(spec.run_id, s) != s) {
      const auto tc = std::chrono::steady_clock::now();
      rec->checkpoint(s, *trainer);
      rms.checkpoint = ms_since(tc);
    }
    std::vector<int> cap_layers;
    if (rec && rec->options().capture.active(s)) cap_layers = rec->options().capture.layers;
    // Every rank computes the digest the recording asks for (in the fused update on a GPU,
    // read back behind the step); ranks compare theirs with rank 0's one step later, through
    // the host, so no rank waits for its GPU here.
    const bool want_digest = records && train::digest_due(spec.digest_every, s);
    trainer->set_want_digest(want_digest);
    train::StepResult res = trainer->train_step(cap_layers);
    const auto td = std::chrono::steady_clock::now();
    std::function<std::string()> digest = res.digest;
    if (comm) {
      if (unchecked.digest) check_replicas(*comm, unchecked.digest(), unchecked.step);
      unchecked = want_digest ? UncheckedDigest{s, res.digest} : UncheckedDigest{};
    }
    rms.digest = ms_since(td);
    if (already) {
      auto old = st->get_step(spec.run_id, s);
      if (!old || old->loss_bits != store::float_bits(res.loss) || old->grad_norm_bits != store::float_bits(res.grad_norm))
        throw Error(ExitCode::kFinding, "resume diverged at step " + std::to_string(s) + " from the recording");
    } else if (rec) {
      const auto tr = std::chrono::steady_clock::now();
      rec->record_step(res, digest, *data, cfg.block_size);
      rms.store = ms_since(tr);
    }
    const double wall_ms = ms_since(t0);
    if (s % log_every == 0 || s + 1 == total || !std::isfinite(res.loss))
      print_step(res, wall_ms, already, rec && !already ? &rms : nullptr);
  }
  if (unchecked.digest) check_replicas(*comm, unchecked.digest(), unchecked.step);
  if (std::string phases = trainer->phase_report(); !phases.empty()) std::printf("%s\n", phases.c_str());
  if (rec) {
    if (rec->checkpoint_due(total, /*at_end=*/true) && st->nearest_checkpoint(spec.run_id, total) != total)
      rec->checkpoint(total, *trainer);
    rec->flush();
    const train::Recorder::Costs cc = rec->costs();
    if (cc.checkpoints > 0) {
      // What checkpoints cost the run: if "waited" grows (--checkpoint-wait) or checkpoints
      // are deferred, the writer cannot keep up with --checkpoint-every; a larger K (or a
      // lower --zstd-level) keeps them on schedule.
      std::printf("checkpoints: %d, training spent %.2f s copying them and %.2f s waiting for the "
                  "writer, which compressed and stored them in %.2f s in the background\n",
                  cc.checkpoints, cc.snapshot_seconds, cc.checkpoint_waited_seconds,
                  cc.checkpoint_writer_seconds);
      if (cc.late > 0) {
        std::printf("checkpoints: %d taken late, by up to %lld steps, because the writer was busy "
                    "(%d more due ones folded into them); --checkpoint-wait keeps them exactly %d "
                    "apart instead\n",
                    cc.late, static_cast<long long>(cc.max_late_steps), cc.folded, spec.checkpoint_every);
      }
    }
    if (const store::Retention keep{spec.keep_last, spec.keep_every}; keep.active())
      std::printf("retention (%s): %d older checkpoints deleted once newer ones were stored (%.2f MiB of blobs, "
                  "%.2f s of the checkpoint writer); their pages are reused, `rewind store thin` gives free pages back\n",
                  keep.text().c_str(), cc.thinned,
                  static_cast<double>(cc.thinned_bytes) / (1 << 20), cc.thin_seconds);
    std::printf("steps: committed in %.2f s by the step writer in the background; training waited "
                "%.2f s for room in its queue\n", cc.step_writer_seconds, cc.step_waited_seconds);
    std::printf("recorded run %lld into %s\n", static_cast<long long>(spec.run_id), st->path().c_str());
  }
  // What the caching allocator held at most (CUDA runs; experiments/train_bench/memory_bench.sh).
  if (const std::string peak = train::peak_memory_report(torch::Device(train::rank_device(spec.device, env)));
      !peak.empty())
    std::printf("%s\n", peak.c_str());
  return 0;
}

}  // namespace rwd::cli
