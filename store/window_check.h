// The window a replay asks for, checked against the steps a run recorded: one wording for
// `replay` (rewind's trainer) and `replay --cmd` (a Python script's run).
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"
#include "store/store.h"

namespace rwd::store {

// Error(kData) when the run recorded no step; UsageError for an empty window or one outside
// the recorded steps.
inline void check_window(Store& s, int64_t run, int64_t from, int64_t to) {
  const auto range = s.step_range(run);
  if (!range) throw Error(ExitCode::kData, "run " + std::to_string(run) + " has no recorded steps");
  if (from > to) throw UsageError("empty window " + std::to_string(from) + ":" + std::to_string(to));
  if (from < range->first || to > range->second)
    throw UsageError("window " + std::to_string(from) + ":" + std::to_string(to) + " is outside the recording (steps " +
                     std::to_string(range->first) + ".." + std::to_string(range->second) + ")");
}

}  // namespace rwd::store
