// `rewind replay --cmd "python3 train.py ..."`: starts the user's script with REWIND_REPLAY
// (store, run, window, plan, report file) in its environment; its rewind.record restores the
// checkpoint at or before FROM, feeds the recorded batches, writes one JSON line per step to
// the report file and exits after TO. This side reads those lines and checks them against the
// recording bit for bit (loss, grad norm, lr, parameter digest).
#include "cli/replay_script.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "plan/plan.h"
#include "store/store.h"
#include "store/window_check.h"

namespace rwd::cli {

namespace {

using nlohmann::json;

// Layers and heads a plan may name when the run's config does not say (as rewind.attention).
constexpr int kMaxLayers = 1024;
constexpr int kMaxHeads = 1024;

store::RunInfo find_run(store::Store& s, int64_t run) {
  const std::vector<store::RunInfo> runs = s.runs();
  if (runs.empty()) throw Error(ExitCode::kData, "store '" + s.path() + "' holds no run");
  if (run == 0) return runs.back();
  for (const store::RunInfo& r : runs)
    if (r.id == run) return r;
  throw UsageError("store '" + s.path() + "' has no run " + std::to_string(run));
}

json parse_object(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();
}

// The model's attention layers and heads: from the run's config (nanoGPT's n_layer, n_head),
// else from the per-head monitors rewind.record stored for the first step ("L1.H3.max_logit"),
// else kMaxLayers x kMaxHeads.
std::pair<int, int> attention_shape(store::Store& s, const store::RunInfo& run, int64_t first_step) {
  const json cfg = parse_object(run.config);
  if (cfg.contains("n_layer") && cfg.contains("n_head") && cfg["n_layer"].is_number_integer() &&
      cfg["n_head"].is_number_integer())
    return {cfg["n_layer"].get<int>(), cfg["n_head"].get<int>()};
  int n_layer = 0, n_head = 0;
  for (const store::MetricRow& m : s.metrics(run.id, first_step, first_step, "L")) {
    int l = -1, h = -1;
    if (std::sscanf(m.key.c_str(), "L%d.H%d.", &l, &h) == 2 && l >= 0 && h >= 0) {
      n_layer = std::max(n_layer, l + 1);
      n_head = std::max(n_head, h + 1);
    }
  }
  if (n_layer == 0) return {kMaxLayers, kMaxHeads};
  return {n_layer, n_head};
}

std::string describe(float v, uint32_t bits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(v), bits);
  return buf;
}

// What differs between a reported step and its record ("" when nothing does).
std::string mismatch(const json& got, const store::StepRecord& rec) {
  const uint32_t lb = got.at("loss_bits").get<uint32_t>(), gb = got.at("grad_norm_bits").get<uint32_t>();
  if (lb != rec.loss_bits)
    return "loss recorded " + describe(rec.loss(), rec.loss_bits) + " vs replayed " + describe(bits_float(lb), lb);
  if (gb != rec.grad_norm_bits)
    return "grad norm recorded " + describe(rec.grad_norm(), rec.grad_norm_bits) + " vs replayed " +
           describe(bits_float(gb), gb);
  const double lr = got.at("lr").get<double>();
  if (lr != rec.lr) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "lr recorded %.17g vs replayed %.17g", rec.lr, lr);
    return buf;
  }
  const std::string digest = got.at("digest").get<std::string>();
  if (rec.param_digest && *rec.param_digest != digest)
    return "parameter digest recorded " + *rec.param_digest + " vs replayed " + digest;
  return "";
}

// Runs `cmd` under /bin/sh with REWIND_REPLAY=`spec` added to the environment; returns its
// exit code (128 + S for a signal S).
int run_command(const std::string& cmd, const std::string& spec) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(ExitCode::kInternal, "replay --cmd: fork failed: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    setenv("REWIND_REPLAY", spec.c_str(), 1);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(ExitCode::kInternal, "replay --cmd: waitpid failed");
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}

// A temporary file the script writes its report into; removed when this goes out of scope.
struct ReportFile {
  std::string path;
  ReportFile() {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/rewind-replay-XXXXXX";
    const int fd = mkstemp(tmpl.data());
    if (fd < 0) throw Error(ExitCode::kData, "replay --cmd: cannot create a report file in " + tmpl);
    close(fd);
    path = tmpl;
  }
  ~ReportFile() { std::remove(path.c_str()); }
};

}  // namespace

bool is_script_run(store::Store& s, int64_t run) {
  const std::vector<store::RunInfo> runs = s.runs();
  if (runs.empty()) return false;
  for (const store::RunInfo& r : runs)
    if (r.id == run || (run == 0 && r.id == runs.back().id)) return parse_object(r.meta).value("kind", "") == "python";
  return false;
}

void refuse_script_run(store::Store& s, int64_t run, const std::string& command) {
  if (is_script_run(s, run))
    throw UsageError(command + ": this run was recorded by a Python script (rewind.record); " + command +
                     " runs rewind's own trainer and cannot rebuild its model: replay it with "
                     "rewind replay --cmd \"python3 train.py ...\"");
}

int replay_script(const ScriptReplayOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  store::Store st = store::Store::open(o.store, store::Mode::kReadOnly);
  const store::RunInfo run = find_run(st, o.run);
  if (parse_object(run.meta).value("kind", "") != "python")
    throw UsageError("replay: run " + std::to_string(run.id) + " was recorded by rewind train; replay it without --cmd");
  store::check_window(st, run.id, o.from, o.to);
  const auto range = st.step_range(run.id);  // present: checked above
  const auto ckpt = st.nearest_checkpoint(run.id, o.from);
  if (!ckpt)
    throw Error(ExitCode::kData, "missing checkpoint: no checkpoint at or before step " + std::to_string(o.from) +
                                     " in run " + std::to_string(run.id));
  bool plan_differs = false;
  if (o.plan) {
    // Checked here, before the script starts: against the model's layers and heads where the
    // recording says them, else only its syntax.
    const auto [n_layer, n_head] = attention_shape(st, run, range->first);
    const plan::Plan recorded = plan::parse(run.plan, n_layer, n_head);
    plan_differs = plan::apply(recorded, *o.plan) != recorded;
  }

  ReportFile report;
  json spec = {{"store", o.store}, {"run", run.id}, {"from", o.from}, {"to", o.to},
               {"plan", o.plan.value_or("")}, {"report", report.path}};
  const int rc = run_command(o.cmd, spec.dump());

  std::ifstream in(report.path);
  std::string line;
  std::vector<json> steps;
  std::optional<int64_t> start, done;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;  // a line cut short by a killed script
    if (j.contains("error")) throw UsageError("replay --cmd: " + j["error"].get<std::string>());
    if (j.contains("start")) start = j["start"].get<int64_t>();
    if (j.contains("done")) done = j["done"].get<int64_t>();
    if (j.contains("step")) steps.push_back(j);
  }
  const std::string status = "exited with status " + std::to_string(rc);
  if (!start)
    throw UsageError("replay --cmd: the script " + status + " without calling rewind.record (nothing to replay)");
  if (!done) {
    const std::string last = steps.empty() ? "before its first step" : "after step " + std::to_string(steps.back()["step"].get<int64_t>());
    throw UsageError("replay --cmd: the script " + status + " " + last + ", before step " + std::to_string(o.to) +
                     " (does its loop run that far from rec.start?)");
  }

  // The curve is printed (after the checks) where bits are not what is asked: under another
  // plan, or without --verify.
  std::string table = "    step           loss       recorded      grad norm       recorded\n";
  json curve = json::array();
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& got = steps[i];
    const int64_t s = got["step"].get<int64_t>();
    if (s != *start + static_cast<int64_t>(i))
      throw UsageError("replay --cmd: the script reported step " + std::to_string(s) + " where step " +
                       std::to_string(*start + static_cast<int64_t>(i)) + " was due");
    const std::optional<store::StepRecord> rec = st.get_step(run.id, s);
    const double loss = got.value("loss", NAN), norm = got.value("grad_norm", NAN);
    char row[96];
    std::snprintf(row, sizeof row, "%8lld %14.6f %14.6f %14.6f %14.6f\n", static_cast<long long>(s), loss,
                  rec ? static_cast<double>(rec->loss()) : NAN, norm, rec ? static_cast<double>(rec->grad_norm()) : NAN);
    table += row;
    curve.push_back({{"step", s}, {"loss", loss}, {"grad_norm", norm},
                     {"recorded_loss", rec ? json(rec->loss()) : json(nullptr)},
                     {"recorded_grad_norm", rec ? json(rec->grad_norm()) : json(nullptr)}});
    // Steps before FROM ran under the recorded plan: they must match even with --plan.
    if (o.verify && rec && (!plan_differs || s < o.from)) {
      const std::string why = mismatch(got, *rec);
      if (!why.empty()) throw Error(ExitCode::kFinding, "replay diverged at step " + std::to_string(s) + ": " + why);
    }
  }
  if (plan_differs || !o.verify) std::fputs(table.c_str(), stdout);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("replayed steps %lld..%lld of run %lld (a Python script) from checkpoint %lld in %.2f s\n",
              static_cast<long long>(o.from), static_cast<long long>(o.to), static_cast<long long>(run.id),
              static_cast<long long>(*start), seconds);
  if (plan_differs) std::printf("plan from step %lld: %s (differs from the recording)\n",
                                static_cast<long long>(o.from), o.plan->c_str());
  else if (o.verify)
    std::printf("verified: every step from %lld to %lld is bitwise identical to the recording "
                "(loss, grad norm, lr, parameter digest)\n", static_cast<long long>(*start), static_cast<long long>(o.to));
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) throw Error(ExitCode::kData, "cannot write '" + o.json + "'");
    out << json{{"run", run.id}, {"from", o.from}, {"to", o.to}, {"plan", o.plan.value_or("")}, {"steps", curve}}.dump(1) << "\n";
  }
  return 0;
}

}  // namespace rwd::cli
