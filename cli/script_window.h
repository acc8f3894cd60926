// A window of a run recorded by a Python script (rewind.record) computed again by running that
// script: the REWIND_REPLAY protocol of python/rewind/_recording.py, shared by `replay --cmd`
// (which checks the steps against the recording) and `bisect --cmd` (whose probes it runs).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/store.h"
#include "train/config.h"

namespace rwd::cli {

// What the script asked to replay runs: the window, and the plan of its steps.
struct ScriptWindowRequest {
  std::string what = "replay --cmd";  // the command, for messages
  std::string cmd;                    // run by /bin/sh -c
  std::string store;
  int64_t run = 0;                    // the run's id (not 0)
  int64_t from = 0, to = 0;
  // The plan of each step from the first entry's step on, replacing the recorded one there:
  // (step, spec), the last whose step <= s applies to step s. Empty: the recorded plans.
  std::vector<std::pair<int64_t, std::string>> plans;
  bool stop_nonfinite = false;        // end the window at the first NaN/Inf loss (a bisect probe)
  bool quiet = false;                 // the script's standard output to /dev/null (its errors stay)
};

// One step as the script reported it.
struct ScriptStep {
  int64_t step = 0;
  uint32_t loss_bits = 0, grad_norm_bits = 0;  // the loop's FP32 loss and grad norm, exactly
  double lr = 0;
  std::string digest;                          // the parameter digest after the step
  double seconds = 0;                          // from rec.batch to rec.step
  std::map<std::string, double> metrics;       // rec.step's keywords, per-head monitors
  float loss() const;
  float grad_norm() const;
};

struct ScriptWindow {
  int64_t start = 0;                // the checkpoint step the script restored
  std::vector<ScriptStep> steps;    // start, start+1, ..., to (or the first non-finite step)
  bool stopped = false;             // ended early at a non-finite loss (stop_nonfinite)
};

// Runs the script with REWIND_REPLAY in its environment and reads back what it reported. A
// script that does not replay the window (never calls rewind.record, exits early, fails to
// restore, reports steps out of order) is a one-line UsageError naming `what`.
ScriptWindow run_script_window(const ScriptWindowRequest& r);

// The step of one line of a script's report; nullopt for its other lines (start, done, errors)
// and for a line this rewind cannot read (read_script_window says why).
std::optional<ScriptStep> report_step(const std::string& line);

// The REWIND_REPLAY value of a request whose script writes its report to `report_path`.
std::string script_window_spec(const ScriptWindowRequest& r, const std::string& report_path);
// The window the script reported into `report_path` and ended with exit code `rc`; the errors of
// run_script_window.
ScriptWindow read_script_window(const ScriptWindowRequest& r, const std::string& report_path, int rc);

// Starts `cmd` under /bin/sh with the variables of `set` on top of this process's environment;
// `quiet`: its standard output goes to /dev/null; `fds` (>= 0): moved to descriptors 3 and 4 of
// the child, inheritable (the script server's pipes). Safe beside other threads: after fork the
// child only moves descriptors and execs.
pid_t spawn_script(const std::string& cmd, const std::vector<std::pair<std::string, std::string>>& set, bool quiet,
                   const std::string& what, std::pair<int, int> fds = {-1, -1});
// Waits for a spawned script; its exit code (128 + S for a signal S).
int wait_script(pid_t pid, const std::string& what);
// Runs `cmd` under /bin/sh with `env_name`=`spec` added to its environment and returns its
// exit code (128 + S for a signal S). `quiet`: its standard output goes to /dev/null.
int run_script(const std::string& cmd, const std::string& env_name, const std::string& spec,
               const std::string& what, bool quiet);

// A temporary file a script writes its report into; removed when this goes out of scope.
struct ReportFile {
  std::string path;
  explicit ReportFile(const std::string& what);
  ~ReportFile();
  ReportFile(const ReportFile&) = delete;
  ReportFile& operator=(const ReportFile&) = delete;
};

// Run `run` of the store (0: the last); UsageError when there is no such run.
store::RunInfo find_run(store::Store& s, int64_t run);
// Whether run `run` (0: the last) of `s` was recorded by rewind.record (runs.meta "kind":
// "python"), which only `--cmd` can replay.
bool is_script_run(store::Store& s, int64_t run);
// A UsageError naming `command` when that run was recorded by rewind.record: commands that
// run rewind's own trainer (step, export) cannot continue a Python script's model.
void refuse_script_run(store::Store& s, int64_t run, const std::string& command);

// The model's attention layers and heads: from the run's config (nanoGPT's n_layer, n_head),
// else from the per-head monitors rewind.record stored for the first step ("L1.H3.max_logit"),
// else 1024 x 1024 (as many as rewind.attention accepts).
std::pair<int, int> attention_shape(store::Store& s, const store::RunInfo& run);

// What rewind's Config can say of a script's run: its attention_shape, and the sizes a script's
// config names with nanoGPT's keys (n_embd, block_size, vocab_size, batch_size,
// gradient_accumulation_steps) where they are whole numbers; the rest of a script's config
// (any keys) is not rewind's and is left out (Config::from_json refuses unknown keys).
train::Config script_config(store::Store& s, const store::RunInfo& run);

// The plan's module kinds a script's run can promote: those of the rewind.op names it ran
// (the run's kv "ops", a JSON list: "L3.mlp" -> "mlp", "L3.attn" -> "qkv" and "proj", "head"),
// sorted; empty for a script that never called rewind.op (only its attention is under the plan).
std::vector<std::string> script_modules(store::Store& s, int64_t run);

}  // namespace rwd::cli
