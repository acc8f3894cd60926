// The search engine: checks, adaptive group testing for culprits acting alone, hierarchical
// ddmin where they interact (keep-low and promote senses), with memoized batched probes.
#include "bisect/search.h"

#include <algorithm>
#include <set>
#include <cstdio>
#include <map>

#include "common/error.h"

namespace rwd::bisect {

const char* status_name(Status s) {
  switch (s) {
    case Status::kLocalized: return "localized";
    case Status::kSeparateFix: return "separate-fix";
    case Status::kNotReproducible: return "not-reproducible";
    case Status::kNotPrecision: return "not-a-precision-failure";
    case Status::kOutsideSpace: return "outside-search-space";
    case Status::kNoFixInSpace: return "no-fix-in-search-space";
  }
  return "unknown";
}

namespace {

class Engine {
 public:
  Engine(const SearchSpace& space, const Oracle& oracle, const SearchOptions& options)
      : space_(space), oracle_(oracle), max_batch_(std::max(1, options.max_batch)),
        group_testing_(options.group_testing), cheap_(options.cheap_direction),
        cost_(options.cost), before_batch_(options.before_batch) {}

  SearchResult run() {
    // 1. The two anchors (one batch when parallel): baseline must fail, all-FP32 must pass.
    phase_ = "check";
    Candidate baseline{Mode::kPromote, {}}, all_fp32{Mode::kKeepLow, {}};
    std::vector<Element> top = space_.top_level();
    // With three probes at once the space check joins them (wasted only when the run passes).
    if (max_batch_ >= 2) evaluate_all({baseline, all_fp32, {Mode::kKeepLow, top}});
    if (!fails(baseline)) return finish(Status::kNotReproducible, "the baseline run passes");
    if (fails(all_fp32)) return finish(Status::kNotPrecision, "the all-FP32 run fails too");
    if (!fails({Mode::kKeepLow, top}))
      return finish(Status::kOutsideSpace, "keeping the whole search space low passes");

    // 2. One culprit acting alone, by the cheaper probes (issue 26); else, culprits acting alone:
    // adaptive group testing finds them all, every one a failing set.
    if (group_testing_ && cheap_ && cheap_search(top)) return res_;
    if (group_testing_ && group_search(top)) return res_;
    if (!res_.failing_set.empty()) return separate_fix(top);

    // 3. Otherwise (interactions group testing could not resolve): failing set by ddmin.
    res_.failing_set = narrow(Mode::kKeepLow, true, top, "failing");

    // 4. Verify the other way round: promoting exactly that set must fix the run.
    phase_ = "verify";
    if (!fails({Mode::kPromote, res_.failing_set})) {
      phase_ = "fixing/minimize";
      res_.fixing_set = ddmin(res_.failing_set, {}, Mode::kPromote, false);
      return finish(Status::kLocalized, "promoting the failing set fixes the run");
    }
    return separate_fix(top);
  }

 private:
  // The fixing set by its own narrowing from the top (promote sense), after the failing set.
  SearchResult separate_fix(const std::vector<Element>& top) {
    phase_ = "check";
    if (fails({Mode::kPromote, top}))
      return finish(Status::kNoFixInSpace, "promoting the whole search space does not fix it");
    res_.fixing_set = narrow(Mode::kPromote, false, top, "fixing");
    return finish(Status::kSeparateFix, "promoting the failing set alone does not fix the run");
  }

  // Issue 26: the descent of group testing's pass 0 (one culprit), each split asked in the
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
  bool cheap_search(const std::vector<Element>& top) {
    static const char* kLevel[] = {"cheap/layers", "cheap/heads", "cheap/ops"};
    std::vector<Element> items = top;
    Element found;
    for (int level = 0;; ++level) {
      phase_ = kLevel[std::min(level, 2)];
      std::vector<Element> g = items;
      bool checked = false;
      while (g.size() > 1) {
        if (max_batch_ >= 2) {
          if (!descend_bits(g, checked)) return false;
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

  // One round of the parallel descent (B = max_batch_ probes at once): probe j asks whether the
  // culprit's index in g has bit j set (its part: the items whose index does), each in its
  // cheaper form. B probes split g 2^B-fold where B + 1 parts (split) would cut it only
  // (B + 1)-fold, and every probe of the round is needed: 4 GPUs take 12 layers to one in a
  // round, one GPU in four. The check of cheap_search (promoting g fixes the run) takes one
  // slot of the level's first promote round. Returns false when the answers name no item of g
  // or the check fails (several culprits); the leaf found is verified both ways as in the
  // sequential descent, which catches any other inconsistency.
  bool descend_bits(std::vector<Element>& g, bool& checked) {
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

  // Whether to ask "promoting A passes" rather than "keeping A low fails". A keep-low probe is
  // never wasted: group testing asks it too if there turn out to be several culprits, while a
  // promote probe then is. With odds of 2:1 for several culprits (the paper needed six heads),
  // the promote form saves only when it costs less than a third as much; bisect_bench and the
  // paper case of search_test (batches of 8) favour 3 over 2 (fewer probes wasted, <= 80).
  bool prefer_promote(const std::vector<Element>& a) const {
    return 3 * cost_.step_cost({Mode::kPromote, a}, space_) < cost_.step_cost({Mode::kKeepLow, a}, space_);
  }

  // Which part holds the single culprit, asked in the given form (see split; one probe at a
  // time, descend_bits when parallel): the first of the first k - 1 parts whose keep-low probe
  // fails or whose promotion passes, else the last part. The leaf a descent ends at is checked
  // both ways (cheap_search), so several culprits, where the two forms disagree, are caught there.
  size_t which_part(const std::vector<std::vector<Element>>& parts, bool promote) {
    const Mode mode = promote ? Mode::kPromote : Mode::kKeepLow;
    for (size_t j = 0; j + 1 < parts.size(); ++j)
      if (fails({mode, parts[j]}) != promote) return j;
    return parts.size() - 1;
  }

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
  bool group_search(const std::vector<Element>& top) {
    for (int complete = -1; complete < 3; ++complete) {
      std::vector<std::vector<Element>> culprits;
      refine({}, top, complete, culprits);
      // A leaf that fails kept low alone is in every fixing set (monotone failure: promoting
      // anything else leaves it low). Of interacting culprits one member each must be promoted.
      std::vector<Element> required, members;
      for (const auto& c : culprits)
        for (const auto& e : c) {
          auto& into = c.size() == 1 ? required : members;
          if (!contains(into, e)) into.push_back(e);
        }
      std::vector<Element> optional;
      for (const auto& e : members)
        if (!contains(required, e)) optional.push_back(e);
      res_.failing_set = culprits.front();
      phase_ = "verify";
      if (fails({Mode::kPromote, join(required, optional)})) continue;
      res_.fixing_set = required;
      if (!optional.empty()) {
        phase_ = "fixing/minimize";
        res_.fixing_set = join(required, ddmin(optional, required, Mode::kPromote, false));
      }
      bool inside = true;
      for (const auto& e : res_.fixing_set) inside = inside && contains(res_.failing_set, e);
      if (inside) finish(Status::kLocalized, "promoting the failing set fixes the run");
      else finish(Status::kSeparateFix, std::to_string(culprits.size()) +
                                            " culprits, the fixing set must cover them all");
      return true;
    }
    return false;
  }

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
  std::vector<std::vector<Element>> split(const std::vector<Element>& g) const {
    const size_t k = std::min(g.size(), static_cast<size_t>(max_batch_ >= 2 ? max_batch_ + 1 : 2));
    std::vector<std::vector<Element>> parts;
    for (size_t j = 0, at = 0; j < k; ++j) {
      const size_t size = (g.size() - at) / (k - j);
      parts.emplace_back(g.begin() + static_cast<long>(at), g.begin() + static_cast<long>(at + size));
      at += size;
    }
    return parts;
  }

  static bool contains(const std::vector<Element>& set, const Element& e) {
    return std::find(set.begin(), set.end(), e) != set.end();
  }

  // Key of the run a candidate stands for: its low leaves plus whether what lies outside the
  // space is low (kPromote) or FP32 (kKeepLow). Equal keys = the same plan, so one probe.
  std::string key(const Candidate& c) const {
    std::vector<std::string> low;
    if (c.mode == Mode::kKeepLow) {
      for (const auto& e : c.elements)
        for (const auto& leaf : space_.leaves(e)) low.push_back(to_string(leaf));
    } else {
      std::vector<std::string> promoted;
      for (const auto& e : c.elements)
        for (const auto& leaf : space_.leaves(e)) promoted.push_back(to_string(leaf));
      std::sort(promoted.begin(), promoted.end());
      for (const auto& e : space_.top_level())
        for (const auto& leaf : space_.leaves(e)) {
          std::string s = to_string(leaf);
          if (!std::binary_search(promoted.begin(), promoted.end(), s)) low.push_back(s);
        }
    }
    std::sort(low.begin(), low.end());
    low.erase(std::unique(low.begin(), low.end()), low.end());
    std::string k = (c.mode == Mode::kPromote && !space_.covers_everything()) ? "rest-low:" : "";
    for (const auto& s : low) k += s + ",";
    return k;
  }

  bool fails(const Candidate& c) { return first_with({c}, true) == 0; }

  // A run's low set as its key names it (see key): the leaves, and whether the rest is low.
  struct LowRun {
    std::set<std::string> leaves;
    bool rest_low = false;
    bool fails = false;
  };
  static LowRun parse_key(const std::string& k, bool fails) {
    LowRun r;
    r.fails = fails;
    size_t at = 0;
    if (k.rfind("rest-low:", 0) == 0) {
      r.rest_low = true;
      at = 9;
    }
    while (at < k.size()) {
      const size_t comma = k.find(',', at);
      r.leaves.insert(k.substr(at, comma - at));
      at = comma + 1;
    }
    return r;
  }
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
  bool known(const std::string& k) {
    if (memo_.count(k)) return true;
    if (!group_testing_) return false;  // ddmin alone: the engine before issue 25, kept as it was
    const LowRun run = parse_key(k, false);
    for (const LowRun& r : runs_) {
      if ((!r.fails && within(run, r)) || (r.fails && within(r, run))) {
        memo_[k] = r.fails;
        ++res_.implied;
        return true;
      }
    }
    return false;
  }

  // Fetches the verdicts of all candidates (in batches), e.g. independent anchors.
  void evaluate_all(const std::vector<Candidate>& cands) {
    std::vector<std::string> keys;
    for (const auto& c : cands) keys.push_back(key(c));
    for (size_t i = 0; i < cands.size(); ++i)
      if (!known(keys[i])) fetch(cands, keys, i);
  }

  // Index of the first candidate (in order) whose verdict equals `want_fail`, or -1.
  // Unknown verdicts are fetched in oracle batches always starting at the first unknown
  // candidate, so the answer is the same for any batch size.
  int first_with(const std::vector<Candidate>& cands, bool want_fail) {
    std::vector<std::string> keys;
    for (const auto& c : cands) keys.push_back(key(c));
    for (size_t i = 0; i < cands.size();) {
      if (!known(keys[i])) {
        fetch(cands, keys, i);
        continue;
      }
      if (memo_.at(keys[i]) == want_fail) return static_cast<int>(i);
      ++i;
    }
    return -1;
  }

  // One oracle call: up to max_batch_ distinct unknown candidates from index i on.
  void fetch(const std::vector<Candidate>& cands, const std::vector<std::string>& keys, size_t i) {
    std::vector<size_t> batch;
    for (size_t j = i; j < cands.size() && batch.size() < static_cast<size_t>(max_batch_); ++j) {
      bool have = known(keys[j]);
      for (size_t b : batch) have = have || keys[b] == keys[j];
      if (!have) batch.push_back(j);
    }
    std::vector<Candidate> ask;
    for (size_t b : batch) ask.push_back(cands[b]);
    if (before_batch_) before_batch_(phase_);
    std::vector<bool> verdicts = oracle_(ask);
    if (verdicts.size() != ask.size())
      throw Error(ExitCode::kInternal, "bisect: oracle answered " +
                                           std::to_string(verdicts.size()) + " verdicts for " +
                                           std::to_string(ask.size()) + " candidates");
    const size_t earlier = res_.probes.size();  // probes of earlier oracle calls
    for (size_t b = 0; b < batch.size(); ++b) {
      memo_[keys[batch[b]]] = verdicts[b];
      runs_.push_back(parse_key(keys[batch[b]], verdicts[b]));
      const double cost = cost_.step_cost(ask[b], space_);
      res_.probes.push_back({static_cast<int>(res_.probes.size()), res_.batches, phase_, ask[b],
                             verdicts[b], cost, parent_of(ask[b], earlier)});
      res_.cost += cost;
      count_phase();
    }
    ++res_.batches;
  }

  // Probe::parent: the latest of the first `earlier` probes whose leaves hold all of c's (the
  // set that was split, or a set around it where the part split came by elimination). Leaf
  // sets are kept sorted per probe. The baseline (nothing promoted) stands for the whole space,
  // all of it low: the root of every split. All-FP32 (nothing kept low) has no set.
  int parent_of(const Candidate& c, size_t earlier) {
    std::vector<std::string> mine;
    const bool baseline = c.mode == Mode::kPromote && c.elements.empty();
    for (const auto& e : baseline ? space_.top_level() : c.elements)
      for (const auto& leaf : space_.leaves(e)) mine.push_back(to_string(leaf));
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    int parent = -1;
    if (!mine.empty() && !baseline)
      for (size_t j = earlier; j-- > 0;)
        if (!leaves_[j].empty() &&
            std::includes(leaves_[j].begin(), leaves_[j].end(), mine.begin(), mine.end())) {
          parent = static_cast<int>(j);
          break;
        }
    leaves_.push_back(std::move(mine));
    return parent;
  }

  void count_phase() {
    for (auto& p : res_.phases)
      if (p.phase == phase_) {
        ++p.probes;
        return;
      }
    res_.phases.push_back({phase_, 1});
  }

  std::vector<Element> join(const std::vector<Element>& a, const std::vector<Element>& b) const {
    std::vector<Element> out = a;
    out.insert(out.end(), b.begin(), b.end());
    return out;
  }

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

  static std::string fmt_cost(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", x);
    return buf;
  }

  SearchResult finish(Status status, const std::string& why) {
    auto order = [&](const Element& a, const Element& b) { return space_.before(a, b); };
    std::sort(res_.failing_set.begin(), res_.failing_set.end(), order);
    std::sort(res_.fixing_set.begin(), res_.fixing_set.end(), order);
    res_.status = status;
    res_.summary = std::string(status_name(status)) + ": " + why;
    if (!res_.failing_set.empty()) res_.summary += "; failing set " + to_string(res_.failing_set);
    if (!res_.fixing_set.empty()) res_.summary += "; fixing set " + to_string(res_.fixing_set);
    res_.summary += "; " + std::to_string(res_.probes.size()) + " probes (naive sweep " +
                    std::to_string(space_.sweep_size()) + "), predicted cost " + fmt_cost(res_.cost) +
                    " recorded steps per window step (" + cost_.name + " model)";
    return res_;
  }

  const SearchSpace& space_;
  const Oracle& oracle_;
  int max_batch_;
  bool group_testing_;
  bool cheap_;
  CostModel cost_;
  std::function<void(const std::string&)> before_batch_;
  std::string phase_;
  std::map<std::string, bool> memo_;  // run key -> fails
  std::vector<LowRun> runs_;          // the runs asked, for implied verdicts
  std::vector<std::vector<std::string>> leaves_;  // per probe: its elements' leaves, sorted
  SearchResult res_;
};

}  // namespace

SearchResult search(const SearchSpace& space, const Oracle& oracle, const SearchOptions& options) {
  space.validate();
  if (!oracle) throw Error(ExitCode::kInternal, "bisect: search without an oracle");
  return Engine(space, oracle, options).run();
}

}  // namespace rwd::bisect
