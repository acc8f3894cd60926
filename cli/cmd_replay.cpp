// `rewind replay`: re-execute a recorded window from the nearest checkpoint; --verify checks
// every bit; a plan that differs from the recording yields the divergence curve instead.
#include <cmath>
#include <cstdio>
#include <optional>
#include <cxxopts.hpp>

#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/options.h"
#include "cli/replay_script.h"
#include "common/error.h"
#include "common/progress.h"
#include "replay/replayer.h"
#include "store/store.h"

namespace rwd::cli {

int run_replay(int argc, char** argv) {
  cxxopts::Options opts("rewind replay",
                        "re-execute steps FROM..TO of a recording, starting at the nearest checkpoint\n\n"
                        "  rewind replay --store run.db --from 40 --to 59 --verify\n"
                        "  rewind replay --store run.db --from 40 --to 59 --plan 'L1.H2.pv=fp32'\n"
                        "  rewind replay --cmd 'python3 train.py' --store run.db --from 40 --to 59 --verify\n");
  opts.add_options()
      ("store", "the recording", cxxopts::value<std::string>())
      ("from", "first step of the window", cxxopts::value<int64_t>())
      ("to", "last step of the window (inclusive)", cxxopts::value<int64_t>())
      ("run", "run id (default: the last run)", cxxopts::value<int64_t>()->default_value("0"))
      ("plan", "plan applied on top of the recorded one inside the window", cxxopts::value<std::string>())
      ("verify", "compare loss, grad norm, batch and digest bits with the recording")
      ("data", "token file (default: the recorded path; its fingerprint must match)", cxxopts::value<std::string>())
      ("json", "write the per-step curve (replayed vs recorded) to this file", cxxopts::value<std::string>())
      ("cmd", "the training script of a run recorded by rewind.record in Python, run by /bin/sh with "
       "the window in its environment (REWIND_REPLAY)", cxxopts::value<std::string>());
  add_launch_options(opts, "default: the recording's count over --nnodes; a run recorded on N ranks replays "
                           "bitwise on N, on another count it gives the divergence curve");
  opts.add_options()("h,help", "show help");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("store") || !r.count("from") || !r.count("to"))
    throw UsageError("replay: --store, --from and --to are required");
  if (r.count("cmd")) {
    if (r.count("data") || r.count("nproc-per-node") || r.count("nnodes"))
      throw UsageError("replay: --data, --nproc-per-node and --nnodes do not apply to --cmd (the script reads its "
                       "own data; its launcher goes in the command)");
    ScriptReplayOptions so;
    so.store = r["store"].as<std::string>();
    so.run = r["run"].as<int64_t>();
    so.from = r["from"].as<int64_t>();
    so.to = r["to"].as<int64_t>();
    if (r.count("plan")) so.plan = r["plan"].as<std::string>();
    so.verify = r.count("verify") > 0;
    so.cmd = r["cmd"].as<std::string>();
    if (r.count("json")) so.json = r["json"].as<std::string>();
    return replay_script(so);
  }
  {
    store::Store peek = store::Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
    if (is_script_run(peek, r["run"].as<int64_t>()))
      throw UsageError("replay: this run was recorded by a Python script (rewind.record); replay it with "
                       "--cmd \"python3 train.py ...\"");
  }
  // Ranks: as many as recorded unless asked otherwise (as bisect does), so `replay --verify`
  // of an N-rank recording verifies without flags.
  int recorded = 1;
  if (!r.count("nproc-per-node") && !inside_job()) {
    store::Store peek = store::Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
    recorded = train::RunSpec::load(peek, r["run"].as<int64_t>()).world_size;
  }
  if (const LaunchSpec ls = launch_spec(r, "replay", recorded); launches(ls)) return launch_ranks(ls, argc, argv);
  const train::DistEnv env = train::DistEnv::from_env();
  quiet_unless_rank0(env.rank);

  // Every rank replays; rank 0 alone writes (the divergence curve), where it can: a store it
  // may not write (a read-only file or mount, a full disk) is replayed read-only all the same.
  const std::string path = r["store"].as<std::string>();
  std::optional<store::Store> opened;
  if (env.rank == 0) {
    try {
      opened.emplace(store::Store::open(path, store::Mode::kReadWrite));
    } catch (const store::StoreError& e) {
      const int rc = e.lib_code() & 0xFF;
      if (rc != SQLITE_READONLY && rc != SQLITE_IOERR && rc != SQLITE_FULL && rc != SQLITE_CANTOPEN) throw;
    }
  }
  if (!opened) opened.emplace(store::Store::open(path, store::Mode::kReadOnly));
  store::Store& st = *opened;
  replay::ReplayOptions o;
  o.run = r["run"].as<int64_t>();
  o.from = r["from"].as<int64_t>();
  o.to = r["to"].as<int64_t>();
  if (r.count("plan")) o.plan = r["plan"].as<std::string>();
  o.restore.verify = r.count("verify") > 0;
  if (r.count("data")) o.restore.data_path = r["data"].as<std::string>();
  train::RunSpec spec = train::RunSpec::load(st, o.run);
  set_threads(spec.threads);
  std::unique_ptr<train::Comm> comm = train::connect_ranks(env, spec.device);
  o.restore.comm = comm.get();
  auto ckpt = st.nearest_checkpoint(spec.run_id, o.from);
  const int64_t total = o.to - (ckpt ? *ckpt : o.from) + 1;
  Progress progress("replay step", total);
  int64_t done = 0;
  o.restore.on_step = [&](const train::StepResult& s, bool) {
    if (env.rank == 0) progress.update(++done, "step " + std::to_string(s.step) + " loss " + std::to_string(s.loss));
  };
  replay::ReplayResult res = replay::replay(st, o);

  std::printf("replayed steps %lld..%lld of run %lld from checkpoint %lld in %.2f s\n",
              static_cast<long long>(o.from), static_cast<long long>(o.to),
              static_cast<long long>(res.run.run_id), static_cast<long long>(res.checkpoint_step), res.seconds);
  if (res.plan_differs || res.world_differs) {
    if (res.plan_differs)
      std::printf("plan in the window: %s (differs from the recording)\n", res.plan_canonical.c_str());
    if (res.world_differs)
      std::printf("replayed on %d rank(s), recorded on %d: the curve, not bits, is compared\n",
                  env.world, res.run.world_size);
    std::printf("%8s %14s %14s %14s %14s\n", "step", "loss", "recorded", "grad norm", "recorded");
    for (const auto& w : res.window) {
      std::printf("%8lld %14.6f %14.6f %14.6f %14.6f\n", static_cast<long long>(w.replayed.step),
                  static_cast<double>(w.replayed.loss), w.recorded ? static_cast<double>(w.recorded->loss()) : NAN,
                  static_cast<double>(w.replayed.grad_norm),
                  w.recorded ? static_cast<double>(w.recorded->grad_norm()) : NAN);
    }
    const std::string key = "divergence/" + std::to_string(o.from) + ":" + std::to_string(o.to) + "/" +
                            plan::parse(res.plan_canonical, spec.config.n_layer, spec.config.n_head).hash_hex() +
                            (res.world_differs ? "/ranks" + std::to_string(env.world) : "");
    if (env.rank == 0 && st.read_only()) {
      std::printf("divergence curve not stored: the store cannot be written here (read-only or full)\n");
    } else if (env.rank == 0) {
      st.put_kv(res.run.run_id, key, replay::divergence_json(res));
      std::printf("divergence curve stored as kv '%s'\n", key.c_str());
    }
  } else if (o.restore.verify) {
    // Replay starts at a checkpoint: every step from there is verified, not only the window's.
    std::printf("verified: every step from %lld to %lld is bitwise identical to the recording",
                static_cast<long long>(res.checkpoint_step), static_cast<long long>(o.to));
    if (res.checkpoint_step < o.from)
      std::printf(" (replayed from the checkpoint at step %lld, the nearest at or before %lld)",
                  static_cast<long long>(res.checkpoint_step), static_cast<long long>(o.from));
    std::printf("\n");
  }
  if (r.count("json") && env.rank == 0) {
    const std::string path = r["json"].as<std::string>();
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw Error(ExitCode::kData, "cannot write '" + path + "'");
    std::fputs(replay::divergence_json(res).c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace rwd::cli
