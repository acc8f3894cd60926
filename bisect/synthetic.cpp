// Synthetic oracles for the search engine (see synthetic.h).
#include "bisect/synthetic.h"

#include <algorithm>

namespace rwd::bisect {

namespace {

SearchSpace full_model(const SearchSpace& s) {
  SearchSpace f;
  f.n_layer = s.n_layer;
  f.n_head = s.n_head;
  return f;
}

}  // namespace

LowSet low_leaves(const Candidate& c, const SearchSpace& space) {
  LowSet chosen, low;
  for (const auto& e : c.elements)
    for (const auto& l : space.leaves(e)) chosen.insert(to_string(l));
  if (c.mode == Mode::kKeepLow) return chosen;
  SearchSpace full = full_model(space);
  for (const auto& e : full.top_level())
    for (const auto& l : full.leaves(e))
      if (!chosen.count(to_string(l))) low.insert(to_string(l));
  return low;
}

SearchSpace paper_space(int n_layer, int n_head) {
  SearchSpace s;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.ops = {"qk", "softmax", "pv", "o", "delta"};
  s.modules = {"mlp"};
  s.model_head = false;
  return s;
}

Oracle SyntheticOracle::oracle() {
  return [this](const std::vector<Candidate>& cands) {
    max_seen_batch = std::max(max_seen_batch, static_cast<int>(cands.size()));
    std::vector<bool> out;
    for (const auto& c : cands) out.push_back(rule(low_leaves(c, space)));
    return out;
  };
}

RaceOracle SyntheticOracle::race() {
  return [this](const std::vector<Candidate>& cands, int stop_after_fails) {
    max_seen_batch = std::max(max_seen_batch, static_cast<int>(cands.size()));
    std::vector<int> out;
    int failed = 0;
    for (const auto& c : cands) {
      out.push_back(rule(low_leaves(c, space)) ? 1 : 0);
      failed += out.back();
    }
    if (failed >= stop_after_fails)
      for (int& v : out)
        if (v == 0) v = -1;
    return out;
  };
}

std::function<bool(const LowSet&)> any_low(std::vector<std::string> culprits) {
  return [culprits = std::move(culprits)](const LowSet& low) {
    for (const auto& c : culprits)
      if (low.count(c)) return true;
    return false;
  };
}

}  // namespace rwd::bisect
