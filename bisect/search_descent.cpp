// The single-culprit descents of the search engine: halvings asked one
// probe at a time in the cheaper form, bits of the culprit's index asked in parallel, and races
// of parallel parts that end at the first failures.
#include "bisect/search_engine.h"

namespace rwd::bisect::detail {

bool Engine::cheap_search(const std::vector<Element>& top) {
  static const char* kLevel[] = {"cheap/layers", "cheap/heads", "cheap/ops"};
  std::vector<Element> items = top;
  Element found;
  for (int level = 0;; ++level) {
    phase_ = kLevel[std::min(level, 2)];
    std::vector<Element> g = items;
    bool checked = false;
    while (g.size() > 1) {
      if (max_batch_ >= 2) {
        if (!(race_pays(g.size()) ? race_round(g) : descend_bits(g, checked))) return false;
        continue;
      }
      const std::vector<std::vector<Element>> parts = split(g);
      const bool promote = prefer_promote(parts.front());
      // One culprit means promoting the group it lies in fixes the run: checked (cheaply)
      // before the first split of a level that relies on it, so that several culprits
      // stop the descent there rather than at the leaf.
      if (promote && !checked && fails({Mode::kPromote, g})) return false;
      checked = checked || promote;
      g = parts[which_part(parts, promote)];
    }
    found = g.front();
    items = space_.children(found);
    if (items.empty()) break;
  }
  phase_ = "verify";
  if (max_batch_ >= 2) evaluate_all({{Mode::kPromote, {found}}, {Mode::kKeepLow, {found}}});
  if (fails({Mode::kPromote, {found}}) || !fails({Mode::kKeepLow, {found}})) return false;
  res_.failing_set = res_.fixing_set = {found};
  finish(Status::kLocalized, "promoting the failing set fixes the run");
  return true;
}

bool Engine::descend_bits(std::vector<Element>& g, bool& checked) {
  int bits = 0;
  while ((size_t{1} << bits) < g.size()) ++bits;
  auto ask_bits = [&](int b) {
    std::vector<Candidate> ask;
    for (int j = 0; j < b; ++j) {
      std::vector<Element> part;
      for (size_t i = 0; i < g.size(); ++i)
        if ((i >> j) & 1) part.push_back(g[i]);
      ask.push_back({prefer_promote(part) ? Mode::kPromote : Mode::kKeepLow, part});
    }
    return ask;
  };
  std::vector<Candidate> ask = ask_bits(std::min(bits, max_batch_));
  const auto promotes = [](const std::vector<Candidate>& a) {
    return std::any_of(a.begin(), a.end(), [](const Candidate& c) { return c.mode == Mode::kPromote; });
  };
  bool check = !checked && promotes(ask);
  if (check && static_cast<int>(ask.size()) == max_batch_) ask = ask_bits(max_batch_ - 1);
  check = check && promotes(ask);
  std::vector<Candidate> round = ask;
  if (check) round.insert(round.begin(), {Mode::kPromote, g});
  evaluate_all(round);
  if (check) {
    checked = true;
    if (fails({Mode::kPromote, g})) return false;
  }
  size_t code = 0;
  for (size_t j = 0; j < ask.size(); ++j)
    if (fails(ask[j]) != (ask[j].mode == Mode::kPromote)) code |= size_t{1} << j;
  const size_t mask = (size_t{1} << ask.size()) - 1;
  std::vector<Element> next;
  for (size_t i = 0; i < g.size(); ++i)
    if ((i & mask) == code) next.push_back(g[i]);
  if (next.empty()) return false;
  g = next;
  return true;
}

bool Engine::race_pays(size_t n) const {
  if (!race_ || !fail_fraction_ || n < 2) return false;
  const size_t G = std::min(n, static_cast<size_t>(max_batch_));
  auto rounds = [n](size_t fold) {
    int r = 0;
    for (size_t left = n; left > 1; left = (left + fold - 1) / fold) ++r;
    return r;
  };
  return rounds(G) * fail_fraction_() < rounds(size_t{1} << std::min(max_batch_, 20));
}

bool Engine::race_round(std::vector<Element>& g) {
  const size_t G = std::min(g.size(), static_cast<size_t>(max_batch_));
  std::vector<std::vector<Element>> parts;
  for (size_t j = 0, at = 0; j < G; ++j) {
    const size_t size = (g.size() - at) / (G - j);
    parts.emplace_back(g.begin() + static_cast<long>(at), g.begin() + static_cast<long>(at + size));
    at += size;
  }
  const Mode mode = prefer_promote(parts.front()) ? Mode::kPromote : Mode::kKeepLow;
  const int need = mode == Mode::kKeepLow ? 1 : static_cast<int>(G) - 1;
  std::vector<Candidate> cands;
  std::vector<std::string> keys;
  std::vector<int> verdict(G, -1);
  std::vector<size_t> ask;
  int failed = 0;
  for (size_t j = 0; j < G; ++j) {
    cands.push_back({mode, parts[j]});
    keys.push_back(key(cands.back()));
    if (known(keys[j])) {
      verdict[j] = memo_.at(keys[j]) ? 1 : 0;
      failed += verdict[j];
    } else {
      ask.push_back(j);
    }
  }
  if (failed < need && !ask.empty()) {
    std::vector<Candidate> batch;
    for (size_t j : ask) batch.push_back(cands[j]);
    if (before_batch_) before_batch_(phase_);
    const std::vector<int> got = race_(batch, need - failed);
    if (got.size() != batch.size())
      throw Error(ExitCode::kInternal, "bisect: race answered " + std::to_string(got.size()) +
                                           " verdicts for " + std::to_string(batch.size()) + " candidates");
    const size_t earlier = res_.probes.size();
    for (size_t b = 0; b < ask.size(); ++b) {
      verdict[ask[b]] = got[b];
      record(batch[b], keys[ask[b]], got[b], earlier);
    }
    ++res_.batches;
  }
  size_t pick = G;
  if (mode == Mode::kKeepLow) {
    for (size_t j = 0; j < G && pick == G; ++j)
      if (verdict[j] == 1) pick = j;
  } else if (std::count(verdict.begin(), verdict.end(), 1) == static_cast<long>(G) - 1) {
    for (size_t j = 0; j < G && pick == G; ++j)
      if (verdict[j] != 1) pick = j;
  }
  if (pick == G) return false;
  g = parts[pick];
  return true;
}

bool Engine::prefer_promote(const std::vector<Element>& a) const {
  return 3 * cost_.step_cost({Mode::kPromote, a}, space_) < cost_.step_cost({Mode::kKeepLow, a}, space_);
}

size_t Engine::which_part(const std::vector<std::vector<Element>>& parts, bool promote) {
  const Mode mode = promote ? Mode::kPromote : Mode::kKeepLow;
  for (size_t j = 0; j + 1 < parts.size(); ++j)
    if (fails({mode, parts[j]}) != promote) return j;
  return parts.size() - 1;
}

}  // namespace rwd::bisect::detail
