// Synthetic oracles for the search engine: a rule over the leaves a candidate's run keeps in
// low precision, over the whole model. Used by tests/bisect/search_test and bisect_bench.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "bisect/search.h"

namespace rwd::bisect {

using LowSet = std::set<std::string>;  // printed leaves ("L2.H3.pv", "L4.mlp") that run low

// The leaves that are low in the run a candidate stands for, over the FULL model: what lies
// outside the searched space is low in kPromote runs and FP32 in kKeepLow runs.
LowSet low_leaves(const Candidate& c, const SearchSpace& space);

// The space of the tests and the bench: 5 attention ops per head (qk, softmax, pv, o, delta)
// plus one MLP per layer, no model head; 12 x 12 is the paper's model (732 leaves).
SearchSpace paper_space(int n_layer = 12, int n_head = 12);

// A rule as a batch oracle that counts the largest batch it was asked.
struct SyntheticOracle {
  SearchSpace space;
  std::function<bool(const LowSet&)> rule;
  int max_seen_batch = 0;
  Oracle oracle();
  // As if failing probes end (at their early verdict) before any passing one: once
  // stop_after_fails have failed, every passing probe of the batch is cut short (-1).
  RaceOracle race();
};

// The rule "fails while any of these leaves is low" (culprits acting alone).
std::function<bool(const LowSet&)> any_low(std::vector<std::string> culprits);

}  // namespace rwd::bisect
