// The user's script over a window of its recording: starts it with REWIND_REPLAY (store, run,
// window, plans, report file) in its environment; its rewind.record restores the checkpoint at
// or before FROM, feeds the recorded batches, writes one JSON line per step to the report file
// and exits after TO. This side reads those lines back.
#include "cli/script_window.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <utility>

#include "common/bf16.h"
#include "common/error.h"
#include "common/switches.h"

extern char** environ;

namespace rwd::cli {

namespace {

using nlohmann::json;

// Layers and heads a plan may name when the run's config does not say (as rewind.attention).
constexpr int kMaxLayers = 1024;
constexpr int kMaxHeads = 1024;

json parse_object(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();
}

// A number of a report line; null (NaN or Inf, which JSON cannot hold) and absent are NaN.
double number(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

ScriptStep parse_step(const json& j, const std::string& what) {
  try {
    ScriptStep s;
    s.step = j.at("step").get<int64_t>();
    s.loss_bits = j.at("loss_bits").get<uint32_t>();
    s.grad_norm_bits = j.at("grad_norm_bits").get<uint32_t>();
    s.lr = number(j, "lr");
    s.digest = j.value("digest", "");
    s.seconds = number(j, "seconds");
    if (j.contains("metrics") && j["metrics"].is_object())
      for (const auto& [k, v] : j["metrics"].items()) s.metrics[k] = v.is_number() ? v.get<double>() : NAN;
    return s;
  } catch (const json::exception& e) {
    throw UsageError(what + ": the script reported a step this rewind cannot read (" + std::string(e.what()) +
                     "): is its rewind package another version?");
  }
}

}  // namespace

float ScriptStep::loss() const { return bits_float(loss_bits); }
float ScriptStep::grad_norm() const { return bits_float(grad_norm_bits); }

namespace {

// This process's environment with `set` replacing or adding variables, as NAME=VALUE strings.
std::vector<std::string> environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [name, value] : set) replaced |= kv.compare(0, name.size() + 1, name + "=") == 0;
    if (!replaced) out.push_back(kv);
  }
  for (const auto& [name, value] : set) out.push_back(name + "=" + value);
  return out;
}

// Moves `fd` to `target` in a forked child, inheritable (dup2 of an fd onto itself would keep
// its close-on-exec flag). Only async-signal-safe calls: other threads may hold locks.
void move_fd(int fd, int target) {
  if (fd == target)
    fcntl(fd, F_SETFD, 0);
  else
    dup2(fd, target);
}

}  // namespace

pid_t spawn_script(const std::string& cmd, const std::vector<std::pair<std::string, std::string>>& set, bool quiet,
                   const std::string& what, std::pair<int, int> fds) {
  // Everything the child needs is made here: after fork it only moves descriptors and execs.
  const std::vector<std::string> env = environment(set);
  std::vector<char*> envp;
  for (const std::string& kv : env) envp.push_back(const_cast<char*>(kv.c_str()));
  envp.push_back(nullptr);
  const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
  const int null = quiet ? open("/dev/null", O_WRONLY | O_CLOEXEC) : -1;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(ExitCode::kInternal, what + ": fork failed: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    if (fds.first >= 0) {
      // The second first: moving the first onto 3 must not close it where it is 3.
      const int second = fds.second == 3 ? dup(fds.second) : fds.second;
      move_fd(fds.first, 3);
      move_fd(second, 4);
    }
    if (null >= 0) dup2(null, STDOUT_FILENO);
    execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    _exit(127);
  }
  if (null >= 0) close(null);
  return pid;
}

int wait_script(pid_t pid, const std::string& what) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(ExitCode::kInternal, what + ": waitpid failed");
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}

int run_script(const std::string& cmd, const std::string& env_name, const std::string& spec,
               const std::string& what, bool quiet) {
  return wait_script(spawn_script(cmd, {{env_name, spec}}, quiet, what), what);
}

ReportFile::ReportFile(const std::string& what) {
  const char* dir = switches::external("TMPDIR");
  std::string tmpl = std::string(dir ? dir : "/tmp") + "/rewind-script-XXXXXX";
  const int fd = mkstemp(tmpl.data());
  if (fd < 0) throw Error(ExitCode::kData, what + ": cannot create a report file in " + tmpl);
  close(fd);
  path = tmpl;
}

ReportFile::~ReportFile() { std::remove(path.c_str()); }

std::string script_window_spec(const ScriptWindowRequest& r, const std::string& report_path) {
  json plans = json::array();
  for (const auto& [step, spec] : r.plans) plans.push_back({step, spec});
  return json{{"store", r.store}, {"run", r.run}, {"from", r.from}, {"to", r.to}, {"plans", plans},
              {"stop_nonfinite", r.stop_nonfinite}, {"report", report_path}}
      .dump();
}

std::optional<ScriptStep> report_step(const std::string& line) {
  const json j = json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("step")) return std::nullopt;
  try {
    return parse_step(j, "");
  } catch (const UsageError&) {
    return std::nullopt;
  }
}

ScriptWindow run_script_window(const ScriptWindowRequest& r) {
  ReportFile report(r.what);
  const int rc = run_script(r.cmd, "REWIND_REPLAY", script_window_spec(r, report.path), r.what, r.quiet);
  return read_script_window(r, report.path, rc);
}

ScriptWindow read_script_window(const ScriptWindowRequest& r, const std::string& report_path, int rc) {
  std::ifstream in(report_path);
  std::string line;
  ScriptWindow w;
  std::optional<int64_t> start, done;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;  // a line cut short by a killed script
    if (j.contains("error")) throw UsageError(r.what + ": " + j["error"].get<std::string>());
    if (j.contains("start")) start = j["start"].get<int64_t>();
    if (j.contains("done")) done = j["done"].get<int64_t>();
    if (j.contains("stopped")) w.stopped = true;
    if (j.contains("step")) w.steps.push_back(parse_step(j, r.what));
  }
  const std::string status = "exited with status " + std::to_string(rc);
  if (!start)
    throw UsageError(r.what + ": the script " + status + " without calling rewind.record (nothing to replay)");
  if (!done) {
    const std::string last =
        w.steps.empty() ? "before its first step" : "after step " + std::to_string(w.steps.back().step);
    throw UsageError(r.what + ": the script " + status + " " + last + ", before step " + std::to_string(r.to) +
                     " (does its loop run that far from rec.start?)");
  }
  w.start = *start;
  for (size_t i = 0; i < w.steps.size(); ++i)
    if (w.steps[i].step != w.start + static_cast<int64_t>(i))
      throw UsageError(r.what + ": the script reported step " + std::to_string(w.steps[i].step) + " where step " +
                       std::to_string(w.start + static_cast<int64_t>(i)) + " was due");
  return w;
}

store::RunInfo find_run(store::Store& s, int64_t run) {
  const std::vector<store::RunInfo> runs = s.runs();
  if (runs.empty()) throw Error(ExitCode::kData, "store '" + s.path() + "' holds no run");
  if (run == 0) return runs.back();
  for (const store::RunInfo& r : runs)
    if (r.id == run) return r;
  throw UsageError("store '" + s.path() + "' has no run " + std::to_string(run));
}

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

std::pair<int, int> attention_shape(store::Store& s, const store::RunInfo& run) {
  const json cfg = parse_object(run.config);
  if (cfg.contains("n_layer") && cfg.contains("n_head") && cfg["n_layer"].is_number_integer() &&
      cfg["n_head"].is_number_integer())
    return {cfg["n_layer"].get<int>(), cfg["n_head"].get<int>()};
  const auto range = s.step_range(run.id);
  int n_layer = 0, n_head = 0;
  if (range)
    for (const store::MetricRow& m : s.metrics(run.id, range->first, range->first, "L")) {
      int l = -1, h = -1;
      if (std::sscanf(m.key.c_str(), "L%d.H%d.", &l, &h) == 2 && l >= 0 && h >= 0) {
        n_layer = std::max(n_layer, l + 1);
        n_head = std::max(n_head, h + 1);
      }
    }
  if (n_layer == 0) return {kMaxLayers, kMaxHeads};
  return {n_layer, n_head};
}

train::Config script_config(store::Store& s, const store::RunInfo& run) {
  train::Config c;
  std::tie(c.n_layer, c.n_head) = attention_shape(s, run);
  const json cfg = parse_object(run.config);
  for (auto [key, field] : {std::pair<const char*, int*>{"n_embd", &c.n_embd}, {"block_size", &c.block_size},
                            {"vocab_size", &c.vocab_size}, {"batch_size", &c.batch_size},
                            {"gradient_accumulation_steps", &c.gradient_accumulation_steps}}) {
    const auto it = cfg.find(key);
    if (it != cfg.end() && it->is_number_integer() && it->get<int64_t>() > 0 && it->get<int64_t>() < (1 << 30))
      *field = it->get<int>();
  }
  return c;
}

std::vector<std::string> script_modules(store::Store& s, int64_t run) {
  std::vector<std::string> out;
  const std::optional<std::string> ops = s.get_kv(run, "ops");
  if (!ops) return out;
  const json names = json::parse(*ops, nullptr, /*allow_exceptions=*/false);
  if (!names.is_array()) throw UsageError("run " + std::to_string(run) + ": kv 'ops' is not a JSON list of names");
  for (const json& n : names) {
    const std::string name = n.is_string() ? n.get<std::string>() : "";
    const size_t dot = name.find('.');
    const std::string kind = name == "head" ? name : dot == std::string::npos ? "" : name.substr(dot + 1);
    if (kind == "attn") {
      out.push_back("qkv");
      out.push_back("proj");
    } else if (kind == "head" || kind == "qkv" || kind == "proj" || kind == "mlp" || kind == "ln") {
      out.push_back(kind);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace rwd::cli
