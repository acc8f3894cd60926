// `rewind bisect`: localize a precision failure in a recording — in time (--find-window) and
// to layers, heads and ops (--window); `bisect log` lists every probe; `bisect __probe` is the
// hidden worker that --jobs starts, one long-lived process per slot.
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <memory>
#include <optional>

#include "bisect/driver.h"
#include "bisect/probe_pool.h"
#include "bisect/report.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/options.h"
#include "cli/run_kind.h"
#include "cli/script_server.h"
#include "cli/script_window.h"
#include "common/error.h"
#include "common/proc_stat.h"
#include "common/switches.h"
#include "plan/plan.h"
#include "store/store.h"
#include "train/plan_schedule.h"

namespace rwd::cli {

namespace {

std::pair<int64_t, int64_t> parse_window(const std::string& w) {
  size_t colon = w.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument(w);
    size_t a_end = 0, b_end = 0;
    int64_t a = std::stoll(w.substr(0, colon), &a_end);
    int64_t b = std::stoll(w.substr(colon + 1), &b_end);
    if (a_end != colon || b_end != w.size() - colon - 1) throw std::invalid_argument(w);
    return {a, b};
  } catch (const std::logic_error&) {
    throw UsageError("bisect: --window must be A:B (two step numbers), got '" + w + "'");
  }
}

std::vector<std::string> parse_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  if (out.empty()) throw UsageError("bisect: --gpus needs a list such as 0,1");
  return out;
}

int run_log(int argc, char** argv) {
  cxxopts::Options opts("rewind bisect log", "print every bisect probe of a store, like `git bisect log`");
  opts.add_options()
      ("store", "the recording", cxxopts::value<std::string>())
      ("run", "run id (default: the last run)", cxxopts::value<int64_t>()->default_value("0"))
      ("h,help", "show help");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("store")) throw UsageError("bisect log: --store is required");
  store::Store st = store::Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  std::fputs(bisect::bisect_log(st, r["run"].as<int64_t>()).c_str(), stdout);
  return 0;
}

int run_worker(int argc, char** argv) {
  cxxopts::Options opts("rewind bisect __probe", "internal: run probes into the store's cache");
  opts.add_options()("store", "", cxxopts::value<std::string>())("probe", "", cxxopts::value<std::string>())(
      "serve", "", cxxopts::value<int>())("follow", "")("device", "", cxxopts::value<std::string>()->default_value("cpu"));
  auto r = opts.parse(argc, argv);
  if (!r.count("store") || r.count("probe") + r.count("serve") + r.count("follow") != 1)
    throw UsageError("bisect __probe: --store and one of --probe, --serve and --follow are required");
  if (r.count("follow")) {  // rank 1.. of a worker group
    const train::DistEnv env = train::DistEnv::from_env();
    quiet_unless_rank0(env.rank);
    std::unique_ptr<train::Comm> comm = train::connect_ranks(env, r["device"].as<std::string>());
    if (!comm) throw UsageError("bisect __probe --follow: WORLD_SIZE must be at least 2");
    const int code = bisect::follow_probes(r["store"].as<std::string>(), *comm);
    std::fflush(nullptr);
    std::_Exit(code);
  }
  if (r.count("serve")) {
    // Its store closed and its probes committed, a server ends without LibTorch's and CUDA's
    // teardown (freeing the warm trainer, the allocator's cache, the context: most of the
    // 0.5-0.7 s the bisect waited for its workers' ends on an H200); the driver reclaims the GPU.
    const int code =
        bisect::probe_server(r["store"].as<std::string>(), r["serve"].as<int>(), r["device"].as<std::string>());
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return bisect::probe_worker(r["store"].as<std::string>(), r["probe"].as<std::string>());
}

// Seconds since this process started (its start time in /proc, 10 ms ticks); -1 if unknown.
double process_age_s() {
  const std::optional<ProcStat> stat = read_proc_stat("self");
  if (!stat) return -1;
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  return now.tv_sec + now.tv_nsec * 1e-9 - static_cast<double>(stat->start_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Prints the verdict, writes the report where asked; returns the exit code. REWIND_TIMES=bisect:
// where the process's time went besides its probes (stderr).
int finish(const bisect::BisectReport& rep, const cxxopts::ParseResult& r, double began_s) {
  const double searched_s = process_age_s();
  std::printf("%s", rep.verdict.c_str());
  if (r.count("report")) {
    const std::string dir = r["report"].as<std::string>();
    bisect::write_report(rep, dir);
    std::printf("report: %s/report.html (also report.md, report.json)\n", dir.c_str());
  }
  std::fflush(stdout);
  const double reported_s = process_age_s();
  bisect::reap_ended_workers();  // those that ended while the reports were written
  if (switches::listed(switches::Switch::kTimes, "bisect"))
    std::fprintf(stderr,
                 "rewind: bisect times (s since the process started): options read %.2f, search done %.2f "
                 "(its own clock: %.2f s), reports written %.2f, ended workers collected %.2f\n",
                 began_s, searched_s, rep.wall_s, reported_s, process_age_s());
  return rep.exit_code;
}

// bisect --cmd: the script's run as the probes see it (its attention layers and heads, its plan
// schedule) and a runner that computes each probe's window by running the script with the
// probe's plan at the window's first step and at each recorded plan change inside it: one
// process of the script serves every probe (cli/script_server.h) unless `per_probe`.
using ScriptServers = std::vector<std::unique_ptr<ScriptServer>>;

std::shared_ptr<ScriptServers> use_script(bisect::BisectOptions& o, const std::string& cmd, bool per_probe,
                                          bool jobs_given) {
  store::Store st = store::Store::open(o.store_path, store::Mode::kReadOnly);
  const store::RunInfo info = find_run(st, o.run);
  if (!is_script_run(st, info.id))
    throw UsageError("bisect: run " + std::to_string(info.id) + " was recorded by rewind train; bisect it without --cmd");
  train::RunSpec run;
  run.run_id = info.id;
  run.config = script_config(st, info);
  run.plan = train::PlanSchedule::from_json(info.plan);
  o.run_spec = run;
  // The space: the attention ops of every head, and the module kinds the script runs under
  // rewind.op (kv "ops"); the others are no ops of the script, so the reference leaves them
  // as recorded and the search leaves them out (bisect::space_between).
  const std::vector<std::string> modules = script_modules(st, info.id);
  o.attention_only = modules.empty();
  if (!modules.empty())
    for (const std::string m : {"qkv", "proj", "mlp", "ln", "head"})
      if (std::find(modules.begin(), modules.end(), m) == modules.end())
        o.reference += m == "head" ? ";head=low" : ";L*." + m + "=low";
  o.pool.key_extra = "cmd " + cmd;
  o.beyond_recording = false;  // the script's loop and data end where its recording does
  const std::string store_path = o.store_path;
  // A served script ends a probe at its verdict (or a cut); REWIND_SCRIPT_STOP=0 runs it whole.
  o.pool.runner_stops = !per_probe && switches::on(switches::Switch::kScriptStop);
  // A server a slot (--jobs), each on its GPUs of --gpus (round robin) where given: one, or for
  // a data-parallel script's run of N ranks N in order (its launcher's ranks).
  const size_t ranks = static_cast<size_t>(recorded_ranks(info.meta));
  if (!o.pool.gpus.empty() && ranks > 1) {
    if (o.pool.gpus.size() % ranks != 0)
      throw UsageError("bisect --cmd: run " + std::to_string(info.id) + " was recorded on " + std::to_string(ranks) +
                       " ranks: --gpus lists " + std::to_string(ranks) + " GPUs a job, got " +
                       std::to_string(o.pool.gpus.size()));
    if (!jobs_given) o.pool.jobs = static_cast<int>(o.pool.gpus.size() / ranks);
  }
  auto servers = std::make_shared<ScriptServers>();
  for (int slot = 0; slot < o.pool.jobs; ++slot) {
    std::vector<std::pair<std::string, std::string>> env;
    std::string devices;
    for (size_t i = 0; i < ranks && !o.pool.gpus.empty(); ++i)
      devices += (i ? "," : "") + o.pool.gpus[(static_cast<size_t>(slot) * ranks + i) % o.pool.gpus.size()];
    if (!devices.empty()) env.emplace_back("CUDA_VISIBLE_DEVICES", devices);
    servers->push_back(std::make_unique<ScriptServer>(!per_probe, env, o.pool.runner_stops));
  }
  o.pool.runner = [cmd, store_path, servers](const bisect::ProbeSpec& p, const train::RunSpec& run, int slot,
                                             const bisect::StepWatch& watch) {
    ScriptWindowRequest req;
    req.what = "bisect --cmd";
    req.cmd = cmd;
    req.store = store_path;
    req.run = run.run_id;
    req.from = p.from;
    req.to = p.to;
    req.stop_nonfinite = true;
    req.quiet = true;  // the bisect's output is its progress and verdict
    req.plans.emplace_back(p.from, bisect::probe_plan(p, run, p.from).canonical());
    for (const auto& change : run.plan.changes)
      if (change.first > p.from && change.first <= p.to)
        req.plans.emplace_back(change.first, bisect::probe_plan(p, run, change.first).canonical());
    // The window's steps as the script reports them, each judged as it comes: the probe ends at
    // the step where its verdict is decided (whatever the script ran after it is dropped, so the
    // outcome does not depend on how soon the script heard of it).
    bisect::ExternalRun r;
    bool decided = false;
    const auto on_step = [&](const ScriptStep& s) {
      if (s.step < p.from) return false;  // from the checkpoint to the window, under the recorded plan
      r.values["loss"].push_back(s.loss());
      r.values["grad_norm"].push_back(s.grad_norm());
      r.values["lr"].push_back(s.lr);
      for (const auto& [k, v] : s.metrics) r.values[k].push_back(v);
      r.step_s.push_back(s.seconds);
      const bisect::Watch w = watch(r);
      if (w == bisect::Watch::kGoOn) return false;
      decided = true;
      if (w == bisect::Watch::kCut) r.cut = true;
      else if (s.step < p.to) r.stopped_at = s.step;
      return true;
    };
    const ScriptWindow w = (*servers)[static_cast<size_t>(slot)]->run(req, on_step);
    if (!decided && w.stopped && !w.steps.empty() && w.steps.back().step < p.to) r.stopped_at = w.steps.back().step;
    return r;
  };
  return servers;
}

}  // namespace

int run_bisect(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], "log")) return run_log(argc - 1, argv + 1);
  if (argc >= 2 && !std::strcmp(argv[1], "__probe")) return run_worker(argc - 1, argv + 1);
  cxxopts::Options opts(
      "rewind bisect",
      "localize a failure of a recorded run by replaying it under candidate precision plans\n\n"
      "  rewind bisect --store run.db --window 20:59 --fail 'max(loss) > 1.5 * loss[20] || nan'\n"
      "  rewind bisect --store run.db --find-window --fail 'nan || max(loss) > 6' --jobs 2\n"
      "  rewind bisect log --store run.db\n"
      "  rewind bisect --cmd \"python3 train.py\" --store run.db --window 20:39 --fail nan   # a Python script's run\n\n"
      "A probe replays the window from the checkpoint at or before its start with a candidate plan\n"
      "and judges it with --fail. The recorded plan must fail and all-FP32 must pass; then layers,\n"
      "heads and ops are narrowed by group testing (every culprit acting alone, any number of\n"
      "them; ddmin where only a combination fails) to the culprits, the fixing set that promotes\n"
      "them all is verified and the stabilized softmax and stochastic rounding of P (pv=sr) are\n"
      "tried. --find-window first bisects the checkpoints before the failure step in time (all-FP32\n"
      "or --fix replays). A verdict says which steps it checked: after the search the fixing set\n"
      "and the reference are trained on past the window (the hold check, --hold-check N); --hold N\n"
      "instead judges every probe through the failure step + N, from the point of no return the\n"
      "time search finds. Probes are cached in the store: a killed bisect resumes, a repeated one\n"
      "costs no probes (--fresh ignores it).\n\n"
      "One meaning per predicate: max, min, mean, first, last and comparisons read the judged\n"
      "window; the recorded steps before it are its history, which spike's EMA runs over, x[STEP]\n"
      "may name, and growth(x) divides by (its value at the step before the window). A probe\n"
      "judges its replayed window so; the time search judges each recorded step t as the window\n"
      "[t, t]. The failure step F (without --until) is the first step where the predicate turns\n"
      "true after having been false: a loss that starts high is no failure at step 0. If the\n"
      "recorded plan passes in the window [c*, F] found in time, the window is widened to the\n"
      "recorded failure step or the next checkpoint, and the widening is reported.\n"
      "A run recorded on N data-parallel ranks is probed on N ranks (--nproc-per-node, default the\n"
      "recording's count), so a probe of the recorded plan reproduces the recording bit for bit; on\n"
      "another count the probes sum gradients in another order (a warning says so). One group of\n"
      "ranks runs one probe at a time: rank 0 hands each probe to the others and alone writes;\n"
      "--jobs G runs G groups of N ranks at once (--gpus: N GPUs a group, in order).\n"
      "Exit codes: 4 a failure was localized (or a window found with --window-only), 0 not\n"
      "reproducible / not a precision failure (the reason is printed), 2 usage, 3 data.\n");
  opts.add_options()
      ("store", "the recording", cxxopts::value<std::string>())
      ("run", "run id (default: the last run)", cxxopts::value<int64_t>()->default_value("0"))
      ("cmd", "a run recorded by a Python script (rewind.record): the command that runs it, e.g. "
              "\"python3 train.py\"; each probe runs it once over the window under the probe's plan, "
              "all of them inside one Python process that runs the script again for each",
       cxxopts::value<std::string>())
      ("script-per-probe", "with --cmd: start the script anew for every probe (a script that cannot run "
                           "twice in one Python process)")
      ("window", "A:B, the window of steps to narrow (inclusive)", cxxopts::value<std::string>())
      ("fail", "failure predicate, e.g. 'nan || max(loss) > 1.5 * loss[A]'", cxxopts::value<std::string>())
      ("jobs", "probes run in parallel, in as many long-lived worker processes (with N ranks: groups of N; "
               "with --cmd: script processes)",
       cxxopts::value<int>()->default_value("1"))
      ("gpus", "GPU ids, one per worker (sets CUDA_VISIBLE_DEVICES), e.g. 0,1; with N ranks (rewind's own "
               "or a script's launcher) N a worker",
       cxxopts::value<std::string>())
      ("report", "write report.json, report.md, report.html into this folder", cxxopts::value<std::string>())
      ("fresh", "ignore cached probes (and overwrite them)")
      ("find-window", "bisect the checkpoints in time to find the causal window first")
      ("until", "failure step F for --find-window (default: where --fail first turns true)", cxxopts::value<int64_t>())
      ("window-only", "with --find-window: stop after the time bisection")
      ("fix", "plan of the time probes (default: the reference)", cxxopts::value<std::string>())
      ("reference", "the healthy end of the search: the plan a promoted element takes its settings from "
                    "(default: everything FP32, S and the accumulators too; e.g. "
                    "'L*.H*.qk=low;L*.H*.acc=fp32' asks which heads' eager-regime roundings matter)",
       cxxopts::value<std::string>())
      ("search", "narrowing engine: cheap (default: a single culprit first sought with the cheaper of two "
                 "equivalent probes, then group testing; verdicts implied by monotone failure are not probed), "
                 "groups (group testing alone) or ddmin (delta debugging without group testing, "
                 "a benchmark baseline)", cxxopts::value<std::string>()->default_value("cheap"))
      ("hold", "N: healthy means the predicate stays false through the failure step + N (with --window A:B, B + N). "
               "--find-window then finds the point of no return (the latest checkpoint from which the reference holds "
               "that long, confirmed by the checkpoint before it), and every probe is judged over that horizon",
       cxxopts::value<int64_t>())
      ("hold-check", "N: without --hold, train the fixing set and the reference on from the window's start through "
                     "N steps past the window once the search is done (default min(1000, 10x the window); 0: none, "
                     "the verdict then claims the window alone)", cxxopts::value<int64_t>())
      ("granularity", "how deep the narrowing goes: layers, heads or ops (default)",
       cxxopts::value<std::string>()->default_value("ops"))
      ("budget", "minutes for the search: it descends layers -> heads -> ops only while the last level's time fits in "
                 "what is left, and runs the stabilized-softmax and stochastic-rounding checks and the hold check only if "
                 "they fit (long "
                 "probes; 0: no budget)", cxxopts::value<double>()->default_value("0"))
      ("early-band", "K, with --hold: the leading indicator, every probe's largest max logit over its heads against "
                     "K x the reference branch's at the same step; the verdict reports how often its call (above the "
                     "band for --early-steps steps) agreed with the probe's outcome", cxxopts::value<double>())
      ("early-steps", "steps in a row above the band that make a call (default 5)", cxxopts::value<int>()->default_value("5"))
      ("early-stop", "with --early-band: judge a probe failing where the indicator calls it, and stop it there "
                     "(trust it only where its agreement was measured)")
      ("quiet", "no progress line");
  add_launch_options(opts, "every probe runs on them (default: the recording's count over --nnodes)");
  opts.add_options()("h,help", "show help");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("store")) throw UsageError("bisect: --store is required");
  if (!r.count("fail")) throw UsageError("bisect: --fail EXPR is required");
  const double began_s = process_age_s();

  bisect::BisectOptions o;
  o.store_path = r["store"].as<std::string>();
  o.run = r["run"].as<int64_t>();
  if (r.count("script-per-probe") && !r.count("cmd")) throw UsageError("bisect: --script-per-probe goes with --cmd");
  if (!r.count("cmd")) {
    store::Store peek = store::Store::open(o.store_path, store::Mode::kReadOnly);
    if (is_script_run(peek, o.run))
      throw UsageError("bisect: this run was recorded by a Python script (rewind.record); give the command that "
                       "runs it: rewind bisect --cmd \"python3 train.py ...\"");
  }
  if (r.count("window")) o.window = parse_window(r["window"].as<std::string>());
  o.fail = r["fail"].as<std::string>();
  o.pool.jobs = r["jobs"].as<int>();
  if (o.pool.jobs < 1) throw UsageError("bisect: --jobs must be >= 1");
  // Each job is a worker process with a model of its own: on the CPU more jobs than cores only
  // queue for them (and by the hundred exhaust memory), while the search, given more parallel
  // slots, speculates more probes. So the count is capped at the cores, and the cap is said.
  if (!r.count("gpus") && o.pool.jobs > machine_cores()) {
    std::printf("bisect: --jobs %d capped at %d, the cores this process may use (each job is a worker process "
                "with its own model)\n", o.pool.jobs, machine_cores());
    o.pool.jobs = machine_cores();
  }
  if (r.count("gpus")) {
    o.pool.gpus = parse_list(r["gpus"].as<std::string>());
    if (!r.count("jobs")) o.pool.jobs = static_cast<int>(o.pool.gpus.size());
  }
  o.pool.fresh = r.count("fresh") > 0;
  o.find_window = r.count("find-window") > 0;
  if (r.count("until")) o.until = r["until"].as<int64_t>();
  o.window_only = r.count("window-only") > 0;
  if (r.count("reference")) o.reference = r["reference"].as<std::string>();
  o.fix = r.count("fix") ? r["fix"].as<std::string>() : o.reference;
  // --report DIR is a folder (made when missing): a file there would fail only once the whole
  // bisect has run, so it is refused before the first probe.
  if (r.count("report")) {
    struct stat st;
    const std::string dir = r["report"].as<std::string>();
    if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      throw UsageError("bisect: --report " + dir + " is a file; it names a folder (for report.json, report.md, report.html)");
  }
  o.progress = r.count("quiet") == 0;
  if (r.count("hold")) {
    o.hold = r["hold"].as<int64_t>();
    if (*o.hold < 0) throw UsageError("bisect: --hold N needs N >= 0 steps past the failure step");
    if (r.count("hold-check")) throw UsageError("bisect: --hold-check is the check after a window-local search; --hold judges every probe");
  }
  if (r.count("hold-check")) {
    o.hold_check = r["hold-check"].as<int64_t>();
    if (*o.hold_check < 0) throw UsageError("bisect: --hold-check N needs N >= 0");
  }
  const std::string grain = r["granularity"].as<std::string>();
  if (grain != "layers" && grain != "heads" && grain != "ops")
    throw UsageError("bisect: --granularity must be layers, heads or ops, got '" + grain + "'");
  o.depth = grain == "layers" ? 0 : grain == "heads" ? 1 : 2;
  o.budget_min = r["budget"].as<double>();
  if (r.count("report")) {  // each finished phase rewrites the report: a killed bisect keeps what it found
    const std::string dir = r["report"].as<std::string>();
    o.on_interim = [dir](const bisect::BisectReport& rep) { bisect::write_report(rep, dir); };
  }
  if (r.count("early-band")) {
    o.early_band = r["early-band"].as<double>();
    if (!(o.early_band > 0)) throw UsageError("bisect: --early-band K needs K > 0");
  }
  o.early_steps = r["early-steps"].as<int>();
  if (o.early_steps < 1) throw UsageError("bisect: --early-steps must be >= 1");
  o.early_stop = r.count("early-stop") > 0;
  if (o.early_stop && !r.count("early-band")) throw UsageError("bisect: --early-stop goes with --early-band K");
  if (!(o.budget_min >= 0)) throw UsageError("bisect: --budget must be >= 0 minutes");
  const std::string engine = r["search"].as<std::string>();
  if (engine != "cheap" && engine != "groups" && engine != "ddmin")
    throw UsageError("bisect: --search must be groups, cheap or ddmin, got '" + engine + "'");
  o.group_testing = engine != "ddmin";
  o.cheap_direction = engine == "cheap";
  if (r.count("cmd")) {
    if (r.count("nproc-per-node") || r.count("nnodes"))
      throw UsageError("bisect --cmd: --nproc-per-node and --nnodes are for rewind's own runs; a data-parallel "
                       "script's launcher goes in the command (--cmd \"torchrun --nproc_per_node N train.py\")");
    const bool per_probe = r.count("script-per-probe") > 0;
    const std::shared_ptr<ScriptServers> servers =
        use_script(o, r["cmd"].as<std::string>(), per_probe, r.count("jobs") > 0);
    bisect::BisectReport rep = bisect::run_bisect(o);
    // What ran the probes: one serving process a job, or a process a probe (and why).
    int started = 0;
    bool fell_back = false;
    for (const auto& s : *servers) {
      started += s->started();
      fell_back |= !per_probe && !s->serving();
    }
    if (rep.executed > 0) {
      rep.verdict += "script: " + std::to_string(started) + " process" + (started == 1 ? "" : "es") + " of the command ran " +
                     std::to_string(rep.executed) + " probe" + (rep.executed == 1 ? "" : "s") +
                     (per_probe ? " (--script-per-probe: one a probe)\n"
                      : fell_back ? " (it could not serve them from one process: a data-parallel script's ranks "
                                    "(torchrun), no script file to run again (python3 -c, a script on standard "
                                    "input), or an older rewind package)\n"
                                  : " (one serving process a job)\n");
    }
    return finish(rep, r, began_s);
  }
  train::RunSpec spec;
  {
    store::Store st = store::Store::open(o.store_path, store::Mode::kReadOnly);
    spec = train::RunSpec::load(st, o.run);
  }
  // --fix is read only by the time probes and the hold check, after the search has run: a
  // malformed one is refused now, like --reference.
  if (o.fix != bisect::kFullPrecision) {
    try {
      plan::apply(plan::Plan::defaults(spec.config.n_layer, spec.config.n_head), o.fix);
    } catch (const UsageError& e) {
      throw UsageError("bisect: --fix '" + o.fix + "': " + e.what());
    }
  }
  // Ranks: as many as recorded unless asked otherwise (replay's rule: another count warns).
  const LaunchSpec ls = launch_spec(r, "bisect", spec.world_size);
  const int nproc = ls.nproc;
  const train::DistEnv env = train::DistEnv::from_env();
  const int world = inside_job() ? env.world : ls.world();
  if (ls.nnodes > 1 && (o.pool.jobs != 1 || !o.pool.gpus.empty()))
    throw UsageError("bisect: --jobs and --gpus run groups of ranks on this machine; on --nnodes " +
                     std::to_string(ls.nnodes) +
                     " every probe runs on all the nodes' ranks, one at a time (use --jobs 1)");
  if (world > 1 && inside_job() && (o.pool.jobs != 1 || !o.pool.gpus.empty()))
    throw UsageError("bisect: inside a job of " + std::to_string(world) + " ranks every probe runs on all of them, "
                     "one at a time: --jobs and --gpus are not supported there (use --jobs 1)");
  // Parallel probes of an N-rank recording run on groups of N ranks, each a worker
  // (rank 0 serves, the others follow); --gpus then lists N GPUs a group, --jobs defaults to
  // the groups the list makes.
  if (world > 1 && !inside_job() && (o.pool.jobs != 1 || !o.pool.gpus.empty())) {
    if (!o.pool.gpus.empty() && !r.count("jobs"))
      o.pool.jobs = std::max<int>(1, static_cast<int>(o.pool.gpus.size()) / nproc);
    o.pool.ranks = nproc;
    set_threads(spec.threads);
    return finish(bisect::run_bisect(o), r, began_s);
  }
  if (launches(ls)) return launch_ranks(ls, argc, argv);
  quiet_unless_rank0(env.rank);
  // Replay is bitwise only at the recorded thread count (in-process probes and workers).
  set_threads(spec.threads);
  std::unique_ptr<train::Comm> comm = train::connect_ranks(env, spec.device);
  if (comm && env.rank != 0) return bisect::follow_probes(o.store_path, *comm);
  o.pool.comm = comm.get();

  return finish(bisect::run_bisect(o), r, began_s);
}

}  // namespace rwd::cli
