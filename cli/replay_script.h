// `rewind replay --cmd`: a window of a run recorded by a Python script (rewind.record) replayed
// by running that script again, with the window and plan in its environment.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/script_window.h"

namespace rwd::cli {

struct ScriptReplayOptions {
  std::string store;
  int64_t run = 0;  // 0: the last run
  int64_t from = 0, to = 0;
  std::optional<std::string> plan;  // on top of the recorded plan from `from` on
  bool verify = false;
  std::string cmd;   // run by /bin/sh -c
  std::string json;  // where to write the per-step curve ("": nowhere)
};

// Runs the command with REWIND_REPLAY set, reads the steps its rewind.record reported and
// compares them with the recording. Returns the exit code; a divergence under --verify is
// Error(kFinding) "replay diverged at step N: ...", a script that does not replay the window
// (never calls rewind.record, exits early, fails to restore) a one-line UsageError.
int replay_script(const ScriptReplayOptions& o);

}  // namespace rwd::cli
