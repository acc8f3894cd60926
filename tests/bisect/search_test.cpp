// Search engine against synthetic oracles on a 12-layer x 12-head x 5-op (+ mlp) space: known
// culprits must be found exactly, within probe budgets, with verdicts independent of batching.
#include "bisect/search.h"
#include "bisect/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>

#include "common/error.h"

namespace rwd::bisect {
namespace {

// The leaves of a candidate's elements, whichever the mode; the baseline (nothing promoted)
// stands for the whole space.
LowSet element_leaves(const Candidate& c, const SearchSpace& space) {
  LowSet out;
  const bool baseline = c.mode == Mode::kPromote && c.elements.empty();
  for (const auto& e : baseline ? space.top_level() : c.elements)
    for (const auto& leaf : space.leaves(e)) out.insert(to_string(leaf));
  return out;
}

// race_fraction > 0: the descent may race its probes (SearchOptions::race), a failing probe
// running that share of the window.
SearchResult run(const SearchSpace& space, std::function<bool(const LowSet&)> rule,
                 int max_batch, bool group_testing = true, bool cheap_direction = false,
                 double race_fraction = 0) {
  SyntheticOracle o{space, std::move(rule)};
  SearchOptions so;
  so.max_batch = max_batch;
  so.group_testing = group_testing;
  so.cheap_direction = cheap_direction;
  if (race_fraction > 0) {
    so.race = o.race();
    so.fail_fraction = [race_fraction] { return race_fraction; };
  }
  SearchResult r = search(space, o.oracle(), so);
  EXPECT_LE(o.max_seen_batch, max_batch);
  // Every probe is logged with the verdict the oracle gave, and no run is probed twice (one
  // cut short by a race has no verdict and may be asked again).
  std::set<LowSet> seen;
  int cut = 0;
  for (const auto& p : r.probes) {
    LowSet low = low_leaves(p.candidate, space);
    if (p.cut) {
      EXPECT_FALSE(o.rule(low)) << "the synthetic race cuts passing probes only";
      ++cut;
      continue;
    }
    EXPECT_EQ(p.fails, o.rule(low)) << to_string(p.candidate);
    EXPECT_TRUE(seen.insert(low).second) << "probed twice: " << to_string(p.candidate);
  }
  EXPECT_EQ(cut, r.cut);
  // The narrowing tree: a probe's parent is the latest probe of an earlier oracle call
  // whose leaves hold all of its own (the baseline's: the whole space); none for the anchors.
  for (const auto& p : r.probes) {
    const LowSet mine = element_leaves(p.candidate, space);
    int want = -1;
    const bool baseline = p.candidate.mode == Mode::kPromote && p.candidate.elements.empty();
    for (int j = p.index - 1; j >= 0 && !mine.empty() && !baseline; --j) {
      const LowSet theirs = element_leaves(r.probes[j].candidate, space);
      if (r.probes[j].batch < p.batch && !theirs.empty() &&
          std::includes(theirs.begin(), theirs.end(), mine.begin(), mine.end())) {
        want = j;
        break;
      }
    }
    EXPECT_EQ(p.parent, want) << "probe " << p.index << " " << to_string(p.candidate);
  }
  int sum = 0;
  double cost = 0;
  for (const auto& ph : r.phases) sum += ph.probes;
  for (const auto& p : r.probes) cost += p.cost;
  EXPECT_EQ(sum, static_cast<int>(r.probes.size()));
  EXPECT_NEAR(r.cost, cost, 1e-9);
  return r;
}

std::vector<std::string> names(const std::vector<Element>& set) {
  std::vector<std::string> out;
  for (const auto& e : set) out.push_back(to_string(e));
  return out;
}

using Names = std::vector<std::string>;

TEST(Search, SingleCulpritFoundExactlyWithinThirtyProbes) {
  SearchSpace space = paper_space();
  EXPECT_EQ(space.sweep_size(), 12 * 12 * 5 + 12);
  std::mt19937 rng(2024);
  for (int seed = 0; seed < 12; ++seed) {
    std::string culprit;
    if (seed % 6 == 5) {
      culprit = "L" + std::to_string(rng() % 12) + ".mlp";
    } else {
      culprit = "L" + std::to_string(rng() % 12) + ".H" + std::to_string(rng() % 12) + "." +
                space.ops[rng() % 5];
    }
    for (int batch : {1, 2, 8}) {
      SearchResult r = run(space, [&](const LowSet& low) { return low.count(culprit) > 0; },
                           batch);
      EXPECT_EQ(r.status, Status::kLocalized) << r.summary;
      EXPECT_EQ(names(r.failing_set), Names{culprit});
      EXPECT_EQ(names(r.fixing_set), Names{culprit});
      EXPECT_LE(r.probes.size(), 30u) << culprit << " batch " << batch;
      std::printf("single culprit %-14s batch %d: %2zu probes in %2d oracle calls (naive %d)\n",
                  culprit.c_str(), batch, r.probes.size(), r.batches, space.sweep_size());
    }
  }
}

TEST(Search, TwoIndependentCulpritsNeedBothPromoted) {
  // Each culprit alone makes the run fail: the minimal failing set is either one, and the
  // minimal fixing set is both. "Found" = fixing set == both and failing set is one of them.
  SearchSpace space = paper_space();
  const std::string a = "L3.H5.pv", b = "L9.mlp";
  for (int batch : {1, 4}) {
    SearchResult r = run(space, any_low({a, b}), batch);
    EXPECT_EQ(r.status, Status::kSeparateFix) << r.summary;
    Names f = names(r.failing_set);
    EXPECT_TRUE(f == Names{a} || f == Names{b}) << r.summary;
    EXPECT_EQ(names(r.fixing_set), (Names{a, b}));
    EXPECT_LE(r.probes.size(), 40u) << "batch " << batch;
    std::printf("two independent culprits, batch %d: %zu probes (naive %d)\n", batch,
                r.probes.size(), space.sweep_size());
  }
}

TEST(Search, AndInteractionNeedsBothLow) {
  // Fails only when both are low: minimal failing set = both; promoting either one fixes it.
  SearchSpace space = paper_space();
  const std::string a = "L1.H2.qk", b = "L10.H11.delta";
  SearchResult r = run(space, [&](const LowSet& low) { return low.count(a) && low.count(b); }, 2);
  EXPECT_EQ(r.status, Status::kLocalized) << r.summary;
  EXPECT_EQ(names(r.failing_set), (Names{a, b}));
  ASSERT_EQ(r.fixing_set.size(), 1u);
  EXPECT_TRUE(names(r.fixing_set) == Names{a} || names(r.fixing_set) == Names{b});
  std::printf("AND interaction: %zu probes (naive %d)\n", r.probes.size(), space.sweep_size());
}

TEST(Search, PaperCaseSixHeadsMustAllBePromoted) {
  // Any of six heads of L2 kept low (their P-bar V op) makes the run fail, as in the paper
  // where all six heads had to be fixed together. Group testing: at most 80 probes (ddmin alone
  // took 201-268).
  SearchSpace space = paper_space();
  Names six;
  for (int h : {1, 3, 4, 7, 8, 10}) six.push_back("L2.H" + std::to_string(h) + ".pv");
  for (int batch : {1, 8}) {
    SearchResult r = run(space, any_low(six), batch);
    EXPECT_EQ(r.status, Status::kSeparateFix) << r.summary;
    ASSERT_EQ(r.failing_set.size(), 1u);
    EXPECT_NE(std::find(six.begin(), six.end(), names(r.failing_set)[0]), six.end());
    EXPECT_EQ(names(r.fixing_set), six);
    EXPECT_LE(r.probes.size(), 80u) << "batch " << batch;
    std::printf("paper case (6 heads), batch %d: %zu probes in %d oracle calls (naive %d)\n", batch,
                r.probes.size(), r.batches, space.sweep_size());
    for (const auto& ph : r.phases) std::printf("  %-16s %d\n", ph.phase.c_str(), ph.probes);
  }
}

TEST(Search, SixCulpritsAnywhereWithinEightyProbes) {
  // Six culprits acting alone at random places (layers, heads, ops, MLPs): every one must be
  // in the fixing set, the failing set is one of them.
  SearchSpace space = paper_space();
  std::mt19937 rng(25);
  for (int trial = 0; trial < 8; ++trial) {
    std::set<std::string> pick;
    const int layer = static_cast<int>(rng() % 12);
    while (pick.size() < 6) {
      // Half the trials keep the culprits in one layer (the paper's shape).
      const int l = trial % 2 ? static_cast<int>(rng() % 12) : layer;
      if (rng() % 8 == 0) pick.insert("L" + std::to_string(l) + ".mlp");
      else pick.insert("L" + std::to_string(l) + ".H" + std::to_string(rng() % 12) + "." + space.ops[rng() % 5]);
    }
    SearchResult r = run(space, any_low({pick.begin(), pick.end()}), 1);
    EXPECT_EQ(r.status, Status::kSeparateFix) << r.summary;
    std::set<std::string> fixing;
    for (const auto& n : names(r.fixing_set)) fixing.insert(n);
    EXPECT_EQ(fixing, pick) << r.summary;
    ASSERT_EQ(r.failing_set.size(), 1u);
    EXPECT_TRUE(pick.count(names(r.failing_set)[0]));
    EXPECT_LE(r.probes.size(), 80u) << r.summary;
    std::printf("six culprits (trial %d): %zu probes\n", trial, r.probes.size());
  }
}

TEST(Search, GroupTestingBeatsDdminOnSeveralCulprits) {
  // The same oracle through ddmin alone (--search ddmin) and through group testing:
  // same sets, far fewer probes.
  SearchSpace space = paper_space();
  Names six;
  for (int h : {0, 2, 5, 6, 9, 11}) six.push_back("L7.H" + std::to_string(h) + ".o");
  SearchResult before = run(space, any_low(six), 1, false);
  SearchResult after = run(space, any_low(six), 1, true);
  EXPECT_EQ(names(before.fixing_set), names(after.fixing_set));
  EXPECT_EQ(names(after.fixing_set), six);
  EXPECT_LT(2 * after.probes.size(), before.probes.size());
  std::printf("six culprits: ddmin %zu probes, group testing %zu\n", before.probes.size(), after.probes.size());
}

TEST(Search, InteractingPairBesideALoneCulprit) {
  // An o/delta pair that only fails together (as a fault in O does through delta) and a lone
  // culprit in another layer: the fixing set is the lone culprit plus one member of the pair.
  SearchSpace space = paper_space();
  const std::string a = "L4.H6.o", b = "L4.H6.delta", c = "L9.H0.pv";
  auto rule = [&](const LowSet& low) { return (low.count(a) && low.count(b)) || low.count(c); };
  for (int batch : {1, 4}) {
    SearchResult r = run(space, rule, batch);
    EXPECT_EQ(r.status, Status::kSeparateFix) << r.summary;
    Names f = names(r.failing_set);
    EXPECT_TRUE(f == (Names{a, b}) || f == Names{c}) << r.summary;
    Names fix = names(r.fixing_set);
    ASSERT_EQ(fix.size(), 2u) << r.summary;
    EXPECT_TRUE(fix[0] == a || fix[0] == b) << r.summary;
    EXPECT_EQ(fix[1], c);
    EXPECT_LE(r.probes.size(), 60u) << r.summary;
  }
}

TEST(SearchRace, AllFp32IsAskedOnlyWhenTheLeafFailsVerification) {
  // With races, a verified leaf needs no all-FP32 run. A run that fails whatever is promoted:
  // the descent names no leaf, then all-FP32 fails and the verdict is the anchors' one.
  SearchSpace space = paper_space();
  const std::string all_fp32 = to_string(Candidate{Mode::kKeepLow, {}});
  for (int batch : {2, 4}) {
    SearchResult one = run(space, any_low({"L3.H2.o"}), batch, true, true, 0.25);
    EXPECT_EQ(one.status, Status::kLocalized) << one.summary;
    for (const auto& p : one.probes) EXPECT_NE(to_string(p.candidate), all_fp32) << "batch " << batch;
    SearchResult none = run(space, [](const LowSet&) { return true; }, batch, true, true, 0.25);
    EXPECT_EQ(none.status, Status::kNotPrecision) << none.summary;
    EXPECT_EQ(to_string(none.probes.back().candidate), all_fp32);
    EXPECT_LE(none.probes.size(), 12u) << none.summary;
  }
}

TEST(Search, NotAPrecisionFailureStopsAfterTheAnchors) {
  for (int batch : {1, 2}) {
    SearchResult r = run(paper_space(), [](const LowSet&) { return true; }, batch);
    EXPECT_EQ(r.status, Status::kNotPrecision);
    EXPECT_EQ(r.probes.size(), 2u);  // baseline + all-FP32, no narrowing
    for (const auto& p : r.probes) EXPECT_EQ(p.phase, "check");
    EXPECT_TRUE(r.failing_set.empty());
    EXPECT_TRUE(r.fixing_set.empty());
  }
}

TEST(Search, NotReproducibleWhenTheBaselinePasses) {
  SearchResult r = run(paper_space(), [](const LowSet&) { return false; }, 1);
  EXPECT_EQ(r.status, Status::kNotReproducible);
  EXPECT_EQ(r.probes.size(), 1u);  // sequential: the baseline alone decides
  r = run(paper_space(), [](const LowSet&) { return false; }, 2);
  EXPECT_EQ(r.status, Status::kNotReproducible);
  EXPECT_EQ(r.probes.size(), 2u);  // parallel: both anchors in one call
  EXPECT_EQ(r.batches, 1);
}

TEST(Search, CauseOutsideTheSpaceIsReported) {
  // bwd is not in the searched ops: keep-low runs promote it, so they never fail.
  SearchResult r = run(paper_space(), [](const LowSet& low) { return low.count("L4.H4.bwd") > 0; },
                       1);
  EXPECT_EQ(r.status, Status::kOutsideSpace) << r.summary;
  EXPECT_EQ(r.probes.size(), 3u);
}

TEST(Search, FullSpaceFindsModulesAndTheModelHead) {
  SearchSpace space;
  space.n_layer = 4;
  space.n_head = 4;
  ASSERT_TRUE(space.covers_everything());
  for (const std::string culprit : {"head", "L2.ln", "L0.H3.bwd"}) {
    SearchResult r = run(space, [&](const LowSet& low) { return low.count(culprit) > 0; }, 1);
    EXPECT_EQ(r.status, Status::kLocalized) << r.summary;
    EXPECT_EQ(names(r.failing_set), Names{culprit});
  }
}

TEST(Search, VerdictDoesNotDependOnBatchSize) {
  SearchSpace space = paper_space();
  const std::vector<std::function<bool(const LowSet&)>> rules = {
      [](const LowSet& l) { return l.count("L7.H0.softmax") > 0; },
      [](const LowSet& l) { return l.count("L0.H1.o") || l.count("L11.H11.o"); },
      [](const LowSet& l) { return l.count("L5.H5.pv") && l.count("L5.mlp"); },
      [](const LowSet& l) {  // a threshold rule: at least 3 of the o ops of L6 low
        int n = 0;
        for (int h = 0; h < 12; ++h) n += l.count("L6.H" + std::to_string(h) + ".o") > 0;
        return n >= 3;
      },
  };
  for (size_t k = 0; k < rules.size(); ++k) {
    SearchResult ref = run(space, rules[k], 1);
    for (int batch : {2, 3, 7, 64}) {
      SearchResult r = run(space, rules[k], batch);
      EXPECT_EQ(r.status, ref.status) << "rule " << k << " batch " << batch;
      EXPECT_EQ(names(r.failing_set), names(ref.failing_set)) << "rule " << k;
      EXPECT_EQ(names(r.fixing_set), names(ref.fixing_set)) << "rule " << k;
      EXPECT_LE(r.batches, static_cast<int>(r.probes.size()));
    }
    std::printf("rule %zu: %s\n", k, ref.summary.c_str());
  }
}

TEST(Search, ProbesFormATreeFromTheWholeSpaceDownToTheCulprit) {
  // One culprit, one probe at a time: the two anchors are the only roots; every other probe
  // hangs below the baseline (the whole space low), and the chain above the probe that asks
  // the culprit alone runs through the whole space, a layer set and a head set.
  for (bool cheap : {false, true}) {
    SearchResult r = run(paper_space(), any_low({"L7.H5.pv"}), 1, true, cheap);
    ASSERT_EQ(r.status, Status::kLocalized) << r.summary;
    int roots = 0, top = -1, leaf = -1;
    for (const auto& p : r.probes) {
      if (p.parent < 0) {
        ++roots;
        if (p.candidate.mode == Mode::kPromote) top = p.index;
      }
      if (names(p.candidate.elements) == Names{"L7.H5.pv"}) leaf = p.index;
    }
    ASSERT_GE(top, 0);
    ASSERT_GE(leaf, 0);
    EXPECT_EQ(roots, 2) << "the baseline and all-FP32";
    std::vector<std::string> chain;
    for (int i = r.probes[leaf].parent; i >= 0; i = r.probes[i].parent) chain.push_back(r.probes[i].phase);
    EXPECT_GE(chain.size(), 3u);
    int i = leaf;
    while (r.probes[i].parent >= 0) i = r.probes[i].parent;
    EXPECT_EQ(i, top) << "every chain ends at the baseline";
  }
}

TEST(Search, RunningTwiceGivesTheSameProbeSequence) {
  SearchSpace space = paper_space();
  auto rule = [](const LowSet& l) { return l.count("L2.H9.delta") || l.count("L8.H1.qk"); };
  SearchResult a = run(space, rule, 3), b = run(space, rule, 3);
  ASSERT_EQ(a.probes.size(), b.probes.size());
  for (size_t i = 0; i < a.probes.size(); ++i) {
    EXPECT_EQ(to_string(a.probes[i].candidate), to_string(b.probes[i].candidate));
    EXPECT_EQ(a.probes[i].batch, b.probes[i].batch);
  }
}

TEST(SearchCost, H100ModelReproducesTheMeasuredSteps) {
  // gpt2-small on the H100: L2.H{1,7}.pv=fp32 1.16x, L*.attn=fp32 1.69x, all=fp32 3.65x.
  SearchSpace space;
  space.n_layer = 12;
  space.n_head = 12;
  const CostModel m = CostModel::h100();
  EXPECT_DOUBLE_EQ(m.step_cost({Mode::kPromote, {}}, space), 1.0);  // the recorded run
  EXPECT_NEAR(m.step_cost({Mode::kKeepLow, {}}, space), 3.65, 1e-9);
  std::vector<Element> attn;
  for (int l = 0; l < 12; ++l) attn.push_back({l, -1, "attn"});
  EXPECT_NEAR(m.step_cost({Mode::kPromote, attn}, space), 1.69, 1e-9);
  EXPECT_NEAR(m.step_cost({Mode::kPromote, {{2, 1, "pv"}, {2, 7, "pv"}}}, space), 1.16, 0.02);
  // Keeping one head op low promotes everything else: nearly the all-FP32 step.
  EXPECT_GT(m.step_cost({Mode::kKeepLow, {{2, 1, "pv"}}}, space), 3.6);
  EXPECT_THROW(CostModel::named("tpu"), UsageError);
}

TEST(SearchCost, CheapDirectionLowersTheCostOfOneCulprit) {
  // The same single culprits with and without the cheap-direction descent: the same
  // sets, within the single-culprit bound of 30 probes, and a lower total predicted cost.
  SearchSpace space = paper_space();
  double before = 0, after = 0;
  for (const std::string culprit : {"L0.H0.qk", "L4.H2.pv", "L7.H11.delta", "L11.H6.o", "L8.mlp"}) {
    auto rule = [&](const LowSet& low) { return low.count(culprit) > 0; };
    for (int batch : {1, 4}) {
      SearchResult old = run(space, rule, batch), r = run(space, rule, batch, true, true);
      EXPECT_EQ(r.status, Status::kLocalized) << r.summary;
      EXPECT_EQ(names(r.failing_set), Names{culprit});
      EXPECT_EQ(names(r.fixing_set), Names{culprit});
      EXPECT_LE(r.probes.size(), 30u) << r.summary;
      EXPECT_LT(r.cost, old.cost) << culprit << " batch " << batch;
      before += old.cost;
      after += r.cost;
      std::printf("%-13s batch %d: %2zu probes, cost %.1f (groups: %2zu probes, cost %.1f)\n", culprit.c_str(),
                  batch, r.probes.size(), r.cost, old.probes.size(), old.cost);
    }
  }
  EXPECT_LT(after, 0.75 * before);
}

TEST(SearchCost, MisledDescentFallsBackToGroupTesting) {
  // Culprits that only fail together: promoting either one fixes the run, so the cheap descent
  // ends on a leaf whose keep-low alone passes; group testing then gives the pair.
  SearchSpace space = paper_space();
  const std::string a = "L3.H4.softmax", b = "L3.H9.pv";
  SearchResult r = run(space, [&](const LowSet& low) { return low.count(a) && low.count(b); }, 1, true, true);
  EXPECT_EQ(r.status, Status::kLocalized) << r.summary;
  EXPECT_EQ(names(r.failing_set), (Names{a, b}));
  bool cheap = false;
  for (const auto& ph : r.phases) cheap = cheap || ph.phase.rfind("cheap/", 0) == 0;
  EXPECT_TRUE(cheap);
}

TEST(SearchRace, OneCulpritIsFoundByRacesThatEndAtTheFirstFailures) {
  // Where failing probes stop early (a quarter of the window), the parallel descent
  // races G parts instead of asking bits: the same culprit, fewer window-steps on the critical
  // path, and the probes the race no longer needed cut short.
  SearchSpace space = paper_space();
  for (const std::string culprit : {"L0.H0.qk", "L4.H2.pv", "L7.H11.delta", "L11.H6.o", "L8.mlp"}) {
    auto rule = [&](const LowSet& low) { return low.count(culprit) > 0; };
    for (int batch : {2, 4}) {
      SearchResult bits = run(space, rule, batch, true, true), race = run(space, rule, batch, true, true, 0.25);
      EXPECT_EQ(race.status, Status::kLocalized) << race.summary;
      EXPECT_EQ(names(race.failing_set), Names{culprit});
      EXPECT_EQ(names(race.fixing_set), Names{culprit});
      EXPECT_GT(race.cut, 0) << race.summary;
      // The wall of a round: its slowest probe, a failing one 0.25 of a passing one's.
      auto critical = [](const SearchResult& r) {
        std::map<int, double> round;
        for (const auto& p : r.probes)
          if (!p.cut) round[p.batch] = std::max(round[p.batch], p.fails ? 0.25 : 1.0);
        double sum = 0;
        for (const auto& [b, t] : round) sum += t;
        return sum;
      };
      EXPECT_LT(critical(race), critical(bits)) << culprit << " batch " << batch;
      std::printf("%-13s batch %d: race %2zu probes (%d cut), %.2f windows on the critical path; bits %2zu probes, %.2f\n",
                  culprit.c_str(), batch, race.probes.size(), race.cut, critical(race), bits.probes.size(),
                  critical(bits));
    }
  }
}

TEST(SearchRace, SeveralCulpritsStillGetTheAnswerOfGroupTesting) {
  // With several culprits (or ones that fail only together) the race names no single part or
  // the leaf fails its verification: group testing then decides, as without races.
  SearchSpace space = paper_space();
  const std::vector<std::function<bool(const LowSet&)>> rules = {
      [](const LowSet& l) { return l.count("L0.H1.o") || l.count("L11.H11.o"); },
      [](const LowSet& l) { return l.count("L5.H5.pv") && l.count("L5.mlp"); },
      [](const LowSet& l) {
        int n = 0;
        for (int h : {1, 7, 8, 9, 11}) n += l.count("L2.H" + std::to_string(h) + ".pv") > 0;
        return n > 0;
      },
  };
  for (size_t k = 0; k < rules.size(); ++k) {
    SearchResult ref = run(space, rules[k], 1, true, true);
    for (int batch : {2, 4, 8}) {
      SearchResult r = run(space, rules[k], batch, true, true, 0.2);
      EXPECT_EQ(r.status, ref.status) << "rule " << k << " batch " << batch << ": " << r.summary;
      EXPECT_EQ(names(r.failing_set), names(ref.failing_set)) << "rule " << k << " batch " << batch;
      EXPECT_EQ(names(r.fixing_set), names(ref.fixing_set)) << "rule " << k << " batch " << batch;
    }
  }
}

TEST(SearchRace, NoRaceWhereFailingProbesRunTheWholeWindow) {
  // A failure at the window's end: a round of bits settles more per window than a race.
  SearchResult r = run(paper_space(), any_low({"L4.H2.pv"}), 4, true, true, 1.0);
  EXPECT_EQ(r.cut, 0);
  EXPECT_EQ(names(r.fixing_set), Names{"L4.H2.pv"});
}

TEST(Search, OracleAnsweringTheWrongCountIsAnError) {
  Oracle bad = [](const std::vector<Candidate>&) { return std::vector<bool>{}; };
  EXPECT_THROW(search(paper_space(), bad), Error);
  SearchSpace s = paper_space();
  s.ops.push_back("pvv");
  EXPECT_THROW(search(s, bad), UsageError);
}

}  // namespace
}  // namespace rwd::bisect
