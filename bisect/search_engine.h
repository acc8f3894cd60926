// The search engine's class (search.h's search()), shared by search.cpp (checks, group testing,
// ddmin, memoized probes) and search_descent.cpp (the single-culprit descents: one probe at a
// time, bits, races). Internal to bisect/.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bisect/search.h"
#include "common/error.h"

namespace rwd::bisect::detail {

class Engine {
 public:
  Engine(const SearchSpace& space, const Oracle& oracle, const SearchOptions& options)
      : space_(space), oracle_(oracle), max_batch_(std::max(1, options.max_batch)),
        group_testing_(options.group_testing), cheap_(options.cheap_direction), fixing_only_(options.fixing_only),
        cost_(options.cost), race_(options.race), fail_fraction_(options.fail_fraction),
        before_batch_(options.before_batch) {}

  SearchResult run();

 private:
  // The fixing set by its own narrowing from the top (promote sense), after the failing set.
  SearchResult separate_fix(const std::vector<Element>& top);

  // The descent of group testing's pass 0 (one culprit), each split asked in the
  // cheaper form. With one culprit acting alone (failure monotone in the low leaves), keeping A
  // low with everything else FP32 fails exactly when promoting A with the rest as recorded
  // passes: both say the culprit lies in A. Deep in the descent A is a few heads or ops, so
  // promoting it costs little and keeping only it low pays for the FP32 of the whole model.
  // The two forms differ when that hypothesis is wrong: with several culprits promoting A
  // passes only when A holds them all, and with culprits that only fail together it passes
  // when A holds any one of them. Hence the leaf found is accepted only when promoting it
  // passes (it fixes the run: nothing else is needed) and keeping it alone low fails (it is a
  // failing set on its own): then it is the unique 1-minimal failing and fixing set, the
  // answer group testing gives. Otherwise returns false with nothing decided; group testing
  // reuses the keep-low probes asked here.
  bool cheap_search(const std::vector<Element>& top);

  // One round of the parallel descent (B = max_batch_ probes at once): probe j asks whether the
  // culprit's index in g has bit j set (its part: the items whose index does), each in its
  // cheaper form. B probes split g 2^B-fold where B + 1 parts (split) would cut it only
  // (B + 1)-fold, and every probe of the round is needed: 4 GPUs take 12 layers to one in a
  // round, one GPU in four. The check of cheap_search (promoting g fixes the run) takes one
  // slot of the level's first promote round. Returns false when the answers name no item of g
  // or the check fails (several culprits); the leaf found is verified both ways as in the
  // sequential descent, which catches any other inconsistency.
  bool descend_bits(std::vector<Element>& g, bool& checked);

  // Whether racing G parts (race_round) settles a group of n in less time than asking bits
  // (descend_bits): a race costs the share of the window a failing probe runs and cuts the
  // group G-fold; a round of bits costs a whole window (some probe nearly always passes) and
  // cuts it 2^B-fold.
  bool race_pays(size_t n) const;

  // One round of the raced descent: g in G = max_batch_ parts, all asked at once in
  // one form. With one culprit acting alone, keeping part j low (the rest FP32) fails exactly
  // for its part, and promoting part j (the rest as recorded) passes exactly for its part. A
  // failing probe stops at its early verdict while a passing one runs the whole window, so the
  // race ends at the first failure (keep-low) or the G-1 failures (promote) and cuts the rest
  // short. Returns false when the answers do not name exactly one part (several culprits); the
  // leaf is verified both ways as in the other descents. The part found in keep-low form is the
  // first failing one to finish: which part that is may depend on timing only when several
  // parts fail, and then the leaf's verification fails and group testing, whose decisions do
  // not depend on timing, takes over.
  bool race_round(std::vector<Element>& g);

  // Whether to ask "promoting A passes" rather than "keeping A low fails". A keep-low probe is
  // never wasted: group testing asks it too if there turn out to be several culprits, while a
  // promote probe then is. With odds of 2:1 for several culprits (the paper needed six heads),
  // the promote form saves only when it costs less than a third as much; bisect_bench and the
  // paper case of search_test (batches of 8) favour 3 over 2 (fewer probes wasted, <= 80).
  bool prefer_promote(const std::vector<Element>& a) const;

  // Which part holds the single culprit, asked in the given form (see split; one probe at a
  // time, descend_bits when parallel): the first of the first k - 1 parts whose keep-low probe
  // fails or whose promotion passes, else the last part. The leaf a descent ends at is checked
  // both ways (cheap_search), so several culprits, where the two forms disagree, are caught there.
  size_t which_part(const std::vector<std::vector<Element>>& parts, bool promote);

  // Adaptive group testing for d culprits (Hwang's binary splitting, level by level). A group
  // test keeps a set low with everything else FP32; it fails when the set holds a culprit.
  // Pass 0 estimates d = 1 in every group: one binary search per level, no test of the rest.
  // While promoting what was found does not fix the run, d was underestimated: the next pass
  // repeats the descent (every earlier probe is a cache hit) and, at one more level (layers,
  // then heads, then ops), tests the rest of each group after each culprit and searches
  // again while the rest fails. A culprit is a 1-minimal failing set: one leaf when it acts
  // alone, several (found by ddmin inside the group) when they only fail together.
  // Returns false when promoting every culprit found does not fix the run: the failing set is
  // then the first culprit and the caller narrows a fixing set from the top.
  bool group_search(const std::vector<Element>& top);

  // Refines the failing set `fixed` + one element of `items` (whose keep-low fails) down to
  // leaves: appends every culprit found to `out`. At levels <= `complete` (0 layers, 1 heads,
  // 2 ops) every culprit of a group is searched, elsewhere only the first.
  void refine(const std::vector<Element>& fixed, const std::vector<Element>& items, int complete,
              std::vector<std::vector<Element>>& out) {
    static const char* kLevel[] = {"groups/layers", "groups/heads", "groups/ops"};
    const Element& first = items.front();
    const int level = first.op == "attn" ? (first.head < 0 ? 0 : 1) : (first.head < 0 ? 0 : 2);
    phase_ = kLevel[level];
    for (const auto& group : find_culprits(items, fixed, level <= complete)) {
      std::vector<Element> conj = join(fixed, group);
      auto coarse = std::find_if(conj.begin(), conj.end(),
                                 [&](const Element& e) { return !space_.children(e).empty(); });
      if (coarse == conj.end()) {
        auto order = [&](const Element& a, const Element& b) { return space_.before(a, b); };
        std::sort(conj.begin(), conj.end(), order);
        if (std::find(out.begin(), out.end(), conj) == out.end()) out.push_back(conj);
        continue;
      }
      const Element e = *coarse;
      conj.erase(coarse);
      refine(conj, space_.children(e), complete, out);
    }
  }

  // Culprit groups among `items`, given that keeping fixed + items low fails: binary search
  // for one element that fails (with `fixed`) kept low; where the halving finds none, the
  // culprits interact and ddmin finds a 1-minimal group. With `all`, the rest of the items
  // (less the halves that passed) is tested and searched again while it fails.
  std::vector<std::vector<Element>> find_culprits(const std::vector<Element>& items,
                                                  const std::vector<Element>& fixed, bool all) {
    std::vector<std::vector<Element>> groups;
    std::vector<Element> remaining = items;
    for (bool known = true; !remaining.empty(); known = false) {
      if (!known && !fails({Mode::kKeepLow, join(fixed, remaining)})) break;
      const std::vector<Element> pool = remaining;
      std::vector<Element> g = remaining;
      while (g.size() > 1) {
        const std::vector<std::vector<Element>> parts = split(g);
        const size_t k = parts.size();
        if (max_batch_ >= 2) {
          std::vector<Candidate> ask;
          for (size_t j = 0; j + 1 < k; ++j) ask.push_back({Mode::kKeepLow, join(fixed, parts[j])});
          evaluate_all(ask);
        }
        size_t j = 0;
        for (; j + 1 < k && !fails({Mode::kKeepLow, join(fixed, parts[j])}); ++j)
          for (const auto& e : parts[j]) remaining.erase(std::find(remaining.begin(), remaining.end(), e));
        g = parts[j];
      }
      std::vector<Element> group = g;
      if (!fails({Mode::kKeepLow, join(fixed, g)})) group = ddmin(pool, fixed, Mode::kKeepLow, true);
      groups.push_back(group);
      for (const auto& e : group) {
        auto it = std::find(remaining.begin(), remaining.end(), e);
        if (it != remaining.end()) remaining.erase(it);
      }
      if (!all) break;
    }
    return groups;
  }

  // g in k nearly equal parts, in order, of which a search asks the first k - 1 (at once when
  // parallel): the culprit lies in the first part that says so, or in the last one when none
  // does. One probe at a time k = 2 (halving); with B at once k = B + 1, so each round of B
  // parallel probes cuts the group (B + 1)-fold: G GPUs shorten the search, not only widen it.
  std::vector<std::vector<Element>> split(const std::vector<Element>& g) const;

  static bool contains(const std::vector<Element>& set, const Element& e) {
    return std::find(set.begin(), set.end(), e) != set.end();
  }

  // Key of the run a candidate stands for: its low leaves plus whether what lies outside the
  // space is low (kPromote) or FP32 (kKeepLow). Equal keys = the same plan, so one probe.
  std::string key(const Candidate& c) const;

  bool fails(const Candidate& c) { return first_with({c}, true) == 0; }

  // A run's low set as its key names it (see key): the leaves, and whether the rest is low.
  struct LowRun {
    std::set<std::string> leaves;
    bool rest_low = false;
    bool fails = false;
  };
  static LowRun parse_key(const std::string& k, bool fails);
  static bool within(const LowRun& a, const LowRun& b) {  // a's low set inside b's
    if (a.rest_low && !b.rest_low) return false;
    return std::includes(b.leaves.begin(), b.leaves.end(), a.leaves.begin(), a.leaves.end());
  }

  // Whether the verdict of the run named `k` is known: asked, or implied by monotone failure
  // (keeping more low never makes a failing run pass): inside a passing run's low set it
  // passes, around a failing one's it fails. Implied verdicts are kept, never probed. What it
  // saves: the probes of a cheap descent that met several culprits, which group testing would
  // otherwise ask again in the other form (bisect_synthetic_bench: its cost over group testing's
  // went from 1.02-1.10x to 1.00-1.01x with two or six culprits).
  bool known(const std::string& k);

  // Fetches the verdicts of all candidates (in batches), e.g. independent anchors.
  void evaluate_all(const std::vector<Candidate>& cands);

  // Index of the first candidate (in order) whose verdict equals `want_fail`, or -1.
  // Unknown verdicts are fetched in oracle batches always starting at the first unknown
  // candidate, so the answer is the same for any batch size.
  int first_with(const std::vector<Candidate>& cands, bool want_fail);

  // One oracle call: up to max_batch_ distinct unknown candidates from index i on.
  void fetch(const std::vector<Candidate>& cands, const std::vector<std::string>& keys, size_t i);

  // Books one probe of the current oracle call: verdict 1 fails, 0 passes, -1 cut short (kept
  // as a probe, never as a verdict). `earlier`: the probes of earlier oracle calls.
  void record(const Candidate& c, const std::string& k, int verdict, size_t earlier);

  // Probe::parent: the latest of the first `earlier` probes whose leaves hold all of c's (the
  // set that was split, or a set around it where the part split came by elimination). Leaf
  // sets are kept sorted per probe. The baseline (nothing promoted) stands for the whole space,
  // all of it low: the root of every split. All-FP32 (nothing kept low) has no set.
  int parent_of(const Candidate& c, size_t earlier);

  void count_phase();

  std::vector<Element> join(const std::vector<Element>& a, const std::vector<Element>& b) const;

  // Zeller's ddmin: a 1-minimal subset C of `c` with verdict(fixed + C) == want_fail, given
  // verdict(fixed + c) == want_fail and verdict(fixed) != want_fail. Granularity n starts at 2,
  // so a culprit acting alone is found by binary splitting in about log2 |c| rounds.
  std::vector<Element> ddmin(std::vector<Element> c, const std::vector<Element>& fixed, Mode mode,
                             bool want_fail) {
    size_t n = 2;
    while (c.size() >= 2) {
      n = std::min(n, c.size());
      std::vector<std::vector<Element>> parts(n);
      for (size_t i = 0; i < c.size(); ++i) parts[i * n / c.size()].push_back(c[i]);
      std::vector<Candidate> cands;
      for (const auto& part : parts) cands.push_back({mode, join(fixed, part)});
      std::vector<std::vector<Element>> complements;
      if (n > 2) {
        for (size_t k = 0; k < n; ++k) {
          std::vector<Element> rest;
          for (size_t j = 0; j < n; ++j)
            if (j != k) rest.insert(rest.end(), parts[j].begin(), parts[j].end());
          complements.push_back(rest);
          cands.push_back({mode, join(fixed, rest)});
        }
      }
      int hit = first_with(cands, want_fail);
      if (hit >= 0 && static_cast<size_t>(hit) < n) {
        c = parts[hit];
        n = 2;
      } else if (hit >= 0) {
        c = complements[hit - n];
        n = std::max<size_t>(n - 1, 2);
      } else if (n >= c.size()) {
        break;
      } else {
        n = std::min(2 * n, c.size());
      }
    }
    return c;
  }

  // Layers -> heads -> ops: ddmin at each level, expanding the elements found into children
  // while the elements that cannot be refined further stay fixed.
  std::vector<Element> narrow(Mode mode, bool want_fail, const std::vector<Element>& top,
                              const std::string& prefix) {
    const char* levels[] = {"layers", "heads", "ops"};
    phase_ = prefix + "/" + levels[0];
    std::vector<Element> c = ddmin(top, {}, mode, want_fail);
    for (int level = 1; level < 3; ++level) {
      std::vector<Element> fixed, kids;
      for (const auto& e : c) {
        std::vector<Element> ch = space_.children(e);
        if (ch.empty()) fixed.push_back(e);
        kids.insert(kids.end(), ch.begin(), ch.end());
      }
      if (kids.empty()) break;
      phase_ = prefix + "/" + levels[level];
      c = join(fixed, ddmin(kids, fixed, mode, want_fail));
    }
    return c;
  }

  static std::string fmt_cost(double x);

  SearchResult finish(Status status, const std::string& why);

  const SearchSpace& space_;
  const Oracle& oracle_;
  int max_batch_;
  bool group_testing_;
  bool cheap_;
  bool fixing_only_;
  CostModel cost_;
  RaceOracle race_;
  std::function<double()> fail_fraction_;
  std::function<void(const std::string&)> before_batch_;
  std::string phase_;
  std::map<std::string, bool> memo_;  // run key -> fails
  std::vector<LowRun> runs_;          // the runs asked, for implied verdicts
  std::vector<std::vector<std::string>> leaves_;  // per probe: its elements' leaves, sorted
  SearchResult res_;
};

}  // namespace rwd::bisect::detail
