// The bisect search engine (docs/bisect.md), decoupled from replay: it asks an oracle whether
// candidate precision assignments fail, and narrows layers -> heads -> ops by adaptive group
// testing for several culprits, with ddmin where culprits only fail together; a single culprit
// is first sought with whichever of two equivalent probes is cheaper.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bisect/cost.h"
#include "bisect/space.h"

namespace rwd::bisect {

// Evaluates a batch of candidates (the caller may run them in parallel) and returns, in the
// same order, true where the run FAILS the predicate. Must be deterministic per candidate.
using Oracle = std::function<std::vector<bool>(const std::vector<Candidate>&)>;

// Evaluates a batch at once, like Oracle, but may end it as soon as `stop_after_fails` of its
// candidates have failed: the ones still running are then cut short. Returns per candidate
// 1 (fails), 0 (passes) or -1 (cut short: no verdict).
using RaceOracle = std::function<std::vector<int>(const std::vector<Candidate>&, int stop_after_fails)>;

enum class Status {
  kLocalized,        // failing set found; promoting it to FP32 fixes the run
  kSeparateFix,      // promoting the failing set is not enough; a larger fixing set is reported
  kNotReproducible,  // the baseline (recorded) run passes the predicate
  kNotPrecision,     // the all-FP32 run fails too: not a precision failure
  kOutsideSpace,     // keeping the whole space low passes: the cause lies outside the space
  kNoFixInSpace,     // failing set found, but promoting the whole space does not fix the run
  kFixingSet,        // the fixing set alone was searched (SearchOptions::fixing_only) and found
};
const char* status_name(Status s);
// Whether the search ended with a set whose promotion makes the run pass.
inline bool found_fix(Status s) {
  return s == Status::kLocalized || s == Status::kSeparateFix || s == Status::kFixingSet;
}

struct Probe {
  int index = 0;      // 0-based, in the order the oracle saw them
  int batch = 0;      // which oracle call evaluated it
  std::string phase;  // "check", "cheap/layers|heads|ops", "groups/layers", "groups/heads",
                      // "groups/ops", "verify",
                      // "fixing/minimize", and where group testing cannot settle it
                      // "failing/layers|heads|ops", "fixing/layers|heads|ops"
  Candidate candidate;
  bool fails = false;
  bool cut = false;   // cut short by a race (SearchOptions::race): no verdict, `fails` false
  double cost = 0;    // predicted step time relative to the recorded step (SearchOptions::cost)
  // The probe whose set was split to ask this one (the report's narrowing tree): the
  // latest probe of an earlier oracle call whose leaves (either mode) hold all of this one's,
  // the baseline (fp32{}: nothing promoted) counting as the whole space. -1: none (the
  // anchors: the baseline is the root of every split, all-FP32 has no set).
  int parent = -1;
};

struct PhaseCount {
  std::string phase;
  int probes = 0;
};

struct SearchOptions {
  // Candidates per oracle call. Decisions never depend on it: candidates are examined in a
  // fixed order and the first one with the wanted verdict wins; a larger batch only evaluates
  // (speculatively) candidates a sequential search might not have needed.
  int max_batch = 1;
  // Adaptive group testing first (culprits acting alone, any number of them); false: ddmin
  // alone: delta debugging without group testing (--search ddmin, the baseline of bisect_bench).
  bool group_testing = true;
  // With group_testing: before group testing, look for a single culprit asking each
  // halving in one of two forms that agree while there is one culprit acting alone: "keeping A
  // low (the rest FP32) fails", or "promoting A (the rest as recorded) passes" where `cost`
  // predicts that at least 3x cheaper.
  // The leaf found is accepted only if promoting it passes and keeping it low alone fails;
  // otherwise (several culprits, or culprits that only fail together, where the two forms
  // disagree) group testing runs as without it. false: group testing alone.
  bool cheap_direction = false;
  // Predicts each probe's cost (Probe::cost, SearchResult::cost) and picks the cheap form.
  CostModel cost = CostModel::h100();
  // The parallel descent may race its probes instead of asking bits (descend_bits):
  // the G = max_batch parts of a group each asked at once, the round ended by the first
  // failures (a failing probe stops early, a passing one runs the whole window). Used where
  // fail_fraction() (the share of the window a failing probe runs, as measured so far) makes
  // log2(G) parts' worth per failure cheaper than G bits per whole window. Empty: never.
  RaceOracle race;
  std::function<double()> fail_fraction;
  // Only the fixing set: after the anchors, narrow what must be promoted for the run to pass,
  // never what kept low makes it fail. Over a horizon (bisect --hold) every probe that holds
  // trains the whole horizon, and the failing set's questions ("these layers alone kept low")
  // mostly hold, so asking them costs as much as the answer the verdict is about.
  bool fixing_only = false;
  // Called before every oracle call with the phase its candidates belong to (for logs).
  std::function<void(const std::string& phase)> before_batch;
};

struct SearchResult {
  Status status = Status::kNotReproducible;
  // 1-minimal set that, kept low with everything else FP32, still fails (leaves of the space).
  std::vector<Element> failing_set;
  // 1-minimal set whose promotion to FP32 (everything else as recorded) makes the run pass.
  // Localized: a subset of failing_set (equal when one element; an AND-interaction needs only
  // one of its members promoted). SeparateFix: found by its own narrowing from the top.
  std::vector<Element> fixing_set;
  std::vector<Probe> probes;        // every oracle evaluation, in order
  std::vector<PhaseCount> phases;   // probes per phase, in order of first use
  int batches = 0;                  // oracle calls
  int cut = 0;                      // probes cut short by races (no verdict)
  int implied = 0;                  // verdicts implied by monotone failure, not probed
  double cost = 0;                  // sum of the probes' predicted costs (recorded steps per step)
  std::string summary;              // one line for reports
};

// Throws UsageError for an invalid space; propagates whatever the oracle throws.
SearchResult search(const SearchSpace& space, const Oracle& oracle,
                    const SearchOptions& options = {});

}  // namespace rwd::bisect
