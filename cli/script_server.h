// The probes of `bisect --cmd` run by one process of the user's script instead of one process
// each: the script is started once with REWIND_SERVE (the two pipes' descriptors) beside the
// first probe's REWIND_REPLAY; its rewind.record (python/rewind/_serve.py) then runs the script
// again inside that Python process for every probe written to the probe pipe, and answers
// "exit N" on the reply pipe after each. What a probe costs is then its model, its restore and
// its steps, not a new Python, LibTorch, CUDA context and first-step setup. A script that cannot
// serve (an older rewind package, `python3 -c`) replays the first probe alone and exits: the
// probes after it start the script each, as run_script_window does.
//
// A data-parallel script started by a launcher (torchrun) gets no descriptors: torchrun closes
// them for its ranks. Its rank 0 connects to a Unix socket instead (REWIND_SERVE_SOCKET, made
// here for each start), and the probes and replies run over that connection; rank 0 hands each
// probe to the other ranks (python/rewind/_serve.py).
//
// bisect --cmd --jobs G runs G servers at once, one a thread of the probe pool, each with its
// own environment (CUDA_VISIBLE_DEVICES: a GPU each): a server is used by one thread at a time,
// and starting one is safe beside the other threads (nothing but dup2 and execve after fork).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/script_window.h"

namespace rwd::cli {

class ScriptServer {
 public:
  // `serve` false: every probe starts the script (bisect --script-per-probe). `env`: variables
  // set for the script on top of this process's environment. `stops` false: a serving script is
  // never told to stop, it runs each window whole (REWIND_SCRIPT_STOP=0, an A/B switch).
  explicit ScriptServer(bool serve, std::vector<std::pair<std::string, std::string>> env = {}, bool stops = true)
      : serve_(serve), stops_(stops), env_(std::move(env)) {}
  // Closes the probe pipe, which ends the script; does not wait for it.
  ~ScriptServer();
  ScriptServer(const ScriptServer&) = delete;
  ScriptServer& operator=(const ScriptServer&) = delete;

  // Told each step of the window as the script reports it, in order; true: no more steps are
  // needed (the script is asked to end the window there, and this is not called again).
  using StepSink = std::function<bool(const ScriptStep&)>;

  // The window of `r` as run_script_window computes it (the same errors), run by the serving
  // script; starts it on the first call (and again after a probe that ended it). `on_step`: see
  // StepSink; a serving script hears "stop" on its probe pipe and ends the window at its next
  // rec.batch or rec.step (python/rewind/_serve.py); one started for this probe alone runs it
  // whole, and its steps are told when it has ended.
  ScriptWindow run(const ScriptWindowRequest& r, const StepSink& on_step = {});

  int started() const { return started_; }  // script processes started so far
  bool serving() const { return serve_; }   // false once a script could not serve (or never asked)

 private:
  // Starts the script with REWIND_REPLAY=spec (and, serving, REWIND_SERVE and the pipes).
  void start(const ScriptWindowRequest& r, const std::string& spec, bool serving);
  // The script's reply to the probe it runs: its exit code, or -1 if it ended instead. While it
  // waits, `pump` (when set) is called every few milliseconds.
  int read_reply(const std::function<void()>& pump = {});
  void stop();
  int wait_ended();  // the ended script's exit code (128 + S for a signal S)

  bool serve_;
  bool stops_;
  std::vector<std::pair<std::string, std::string>> env_;
  pid_t pid_ = -1;
  void close_socket();  // the listening socket and its file
  void take_connection();  // rank 0 of a data-parallel script connected: probes and replies go there

  int to_ = -1, from_ = -1;  // our ends: the probe pipe's write end, the reply pipe's read end (or one socket)
  int listen_ = -1;          // the Unix socket a launcher's rank 0 connects to, until it has
  std::string socket_dir_;   // the folder of its file
  std::string replies_;      // bytes read, not yet a whole line
  bool serving_ = false;     // the running script said "serving"
  int started_ = 0;
};

}  // namespace rwd::cli
