// Checkpoint retention: which of a run's checkpoints a rule keeps, and the records
// of a thinning (what it removes, what it keeps because something refers to it, the bytes).
// Pure functions and plain records; Store::plan_thin / Store::thin apply them to a store.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rwd::store {

// Keep the last `keep_last` checkpoints, and beyond them the first checkpoint of every
// `keep_every`-step span [k*M, (k+1)*M) (the one at k*M when checkpoints fall on multiples of
// M; the first one after it when the writer took it late). The first checkpoint (step 0, or
// an import's) and the last are always kept. The rule only ever drops a checkpoint once: a
// newer checkpoint moves the last-K window forward but never makes an older span's first
// checkpoint another one, so a recording can apply it after every checkpoint it commits.
struct Retention {
  int64_t keep_last = 0;   // 0: the last one only (always kept)
  int64_t keep_every = 0;  // 0: no spaced checkpoints beyond the last K
  bool active() const { return keep_last > 0 || keep_every > 0; }  // inactive: keep everything
  std::string text() const;  // "--keep-last 20 --keep-every 1000", "" when inactive
};

// The steps of `steps` (ascending, distinct checkpoint steps) that `rule` keeps.
std::vector<int64_t> retained_steps(const std::vector<int64_t>& steps, const Retention& rule);

// What a thinning of one run keeps beyond the rule: `keep_steps` (a user's pins: the
// checkpoint at or before each, what replaying from that step needs), and, unless `force`,
// every checkpoint a stored bisect probe or bisect log needs (the one at or before its
// window's first step). A running replay's or bisect's pinned checkpoints are kept regardless.
struct ThinRules {
  Retention rule;
  std::vector<int64_t> keep_steps;
  bool force = false;
};

struct ThinPlan {
  int64_t run = 0;
  std::vector<int64_t> checkpoints;  // the run's checkpoint steps before thinning
  std::vector<int64_t> remove;       // the steps whose checkpoints go
  // Steps the rule drops but a pin keeps, each with why ("probe window 20:39 (job 1a2b)").
  std::vector<std::pair<int64_t, std::string>> pinned;
  // Steps the rule drops but a running reader needs (reader_pins.h), kept even with `force`:
  // "in use by bisect (process 4242)".
  std::vector<std::pair<int64_t, std::string>> in_use;
  int64_t n_blobs = 0;        // blobs only the removed checkpoints refer to (deleted with them)
  int64_t stored_bytes = 0;   // their zstd bytes
  int64_t raw_bytes = 0;      // their raw bytes
};


}  // namespace rwd::store
