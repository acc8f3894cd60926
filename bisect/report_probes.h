// What the reports say about the probes as a whole and one by one: one probe count
// with its breakdown (how many ran, came from the cache, belong to which phase) and each
// probe's divergence from the recorded run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bisect/driver.h"

namespace rwd::bisect {

struct ProbeTally {
  int total = 0;
  int run = 0;       // replayed by this bisect
  int cached = 0;    // read from the store's probe cache (this bisect's or an earlier one's)
  int repeated = 0;  // asked twice in one batch: answered by the other one (neither of the above)
  int cut = 0;       // of `run`, cut short by a race: no verdict
  int skipped = 0;   // not started: a race was decided first (no verdict, not in `run`)
  int time = 0, narrowing = 0, fix = 0;  // by part of the bisect
  std::vector<PhaseCount> phases;        // the narrowing's, in order of first use
  int windows = 0;                       // windows narrowed (> 1 when widened)
  int engine = 0;                        // the search engine's count, of the last window
  std::string text;                      // one paragraph saying all of it
};
ProbeTally tally(const BisectReport& r);

// A probe's loss against the recorded loss of the same steps.
struct Divergence {
  int steps = 0;              // steps compared (both values finite)
  double last = NAN;          // probe - recorded at the probe's last step (NaN if not finite)
  double max_abs = NAN;       // max |probe - recorded| over the compared steps
  int64_t max_step = -1;
  int64_t nonfinite_step = -1;  // the probe's first NaN/Inf loss, -1: none
};
Divergence divergence(const BisectReport& r, const ProbeEntry& p);
// "+0.0123 (max 0.0456 at 27)", "NaN/Inf at 27 (max 0.01 before)", "0", or "-".
std::string divergence_text(const Divergence& d);
// The recorded loss of `step` (the window's or the time search's), NaN where not in the report.
double recorded_loss_at(const BisectReport& r, int64_t step);

}  // namespace rwd::bisect
