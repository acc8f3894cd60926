// Probes the bisect search engine spends on 1, 2 and 6 planted culprits acting alone in the
// synthetic 12 x 12 x 5 (+ MLP) space: ddmin alone (delta debugging without group testing),
// adaptive group testing and group testing after the cheap-direction descent, same placements,
// same run; with each engine's predicted cost (h100 model, recorded steps per window step,
// summed over the probes).
#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bisect/synthetic.h"

namespace {

using rwd::bisect::SearchSpace;

// `d` culprits: in one layer (the paper's shape, as in the first placement) or anywhere.
std::vector<std::string> place(const SearchSpace& s, int d, bool one_layer, std::mt19937& rng) {
  std::set<std::string> pick;
  const int layer = static_cast<int>(rng() % s.n_layer);
  while (static_cast<int>(pick.size()) < d) {
    const int l = one_layer ? layer : static_cast<int>(rng() % s.n_layer);
    if (rng() % 8 == 0) pick.insert("L" + std::to_string(l) + ".mlp");
    else pick.insert("L" + std::to_string(l) + ".H" + std::to_string(rng() % s.n_head) + "." + s.ops[rng() % s.ops.size()]);
  }
  return {pick.begin(), pick.end()};
}

struct Stats {
  int min = 1 << 30, max = 0;
  double sum = 0;
  int n = 0;
  void add(int x) {
    min = std::min(min, x);
    max = std::max(max, x);
    sum += x;
    ++n;
  }
  double mean() const { return n ? sum / n : 0; }
};

enum class Engine { kDdmin, kGroups, kCheap };

struct Run {
  int probes = 0;
  double cost = 0;
  int rounds = 0;       // oracle calls
  double critical = 0;  // sum over rounds of the round's dearest probe: the wall on B GPUs
  double windows = 0;   // the same in windows run, a failing probe counting `fail_share` of one
  int cut = 0;          // probes cut short by races
};

// One search, checking that the fixing set is exactly the planted culprits; `batch` probes at
// once. A failing probe stops after `fail_share` of the window (early verdicts); with `races`
// the engine may race its probes.
Run search(const SearchSpace& space, const std::vector<std::string>& culprits, Engine engine,
           int batch = 1, double fail_share = 1, bool races = false) {
  rwd::bisect::SyntheticOracle o{space, rwd::bisect::any_low(culprits)};
  rwd::bisect::SearchOptions so;
  so.group_testing = engine != Engine::kDdmin;
  so.cheap_direction = engine == Engine::kCheap;
  so.max_batch = batch;
  if (races) {
    so.race = o.race();
    so.fail_fraction = [fail_share] { return fail_share; };
  }
  rwd::bisect::SearchResult r = rwd::bisect::search(space, o.oracle(), so);
  std::set<std::string> found, want(culprits.begin(), culprits.end());
  for (const auto& e : r.fixing_set) found.insert(rwd::bisect::to_string(e));
  if (found != want) {
    std::fprintf(stderr, "bisect_synthetic_bench: wrong fixing set: %s\n", r.summary.c_str());
    std::exit(1);
  }
  std::vector<double> dearest(static_cast<size_t>(r.batches), 0.0), longest = dearest;
  for (const auto& p : r.probes) {
    const size_t b = static_cast<size_t>(p.batch);
    dearest[b] = std::max(dearest[b], p.cost);
    if (!p.cut) longest[b] = std::max(longest[b], p.fails ? fail_share : 1.0);
  }
  double critical = 0, windows = 0;
  for (double c : dearest) critical += c;
  for (double w : longest) windows += w;
  return {static_cast<int>(r.probes.size()), r.cost, r.batches, critical, windows, r.cut};
}

std::string range(const Stats& s) {
  char b[64];
  std::snprintf(b, sizeof b, "%d / %.1f / %d", s.min, s.mean(), s.max);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const int placements = argc > 1 ? std::atoi(argv[1]) : 40;
  const SearchSpace space = rwd::bisect::paper_space();
  std::printf("synthetic oracle, %d x %d heads x %zu ops + MLP per layer (naive sweep %d), "
              "%d placements per row, sequential probes\n",
              space.n_layer, space.n_head, space.ops.size(), space.sweep_size(), placements);
  std::printf("%-34s %-7s %-18s %-18s %-11s %-11s %s\n", "culprits (acting alone)", "ddmin",
              "groups", "cheap", "cost groups", "cost cheap", "cost ratio");
  std::printf("%-34s %-7s %-18s %-18s %-11s %-11s\n", "", "mean", "min/mean/max", "min/mean/max", "mean", "mean");
  struct Row {
    const char* name;
    int d;
    bool one_layer;
  };
  for (const Row& row : {Row{"1", 1, false}, Row{"2, anywhere", 2, false}, Row{"2, one layer", 2, true},
                         Row{"6, anywhere", 6, false}, Row{"6, one layer", 6, true},
                         Row{"6 heads' pv in one layer (paper)", 6, true}}) {
    std::mt19937 rng(1000 + row.d * 10 + row.one_layer);
    Stats ddmin, groups, cheap;
    double cost_groups = 0, cost_cheap = 0;
    for (int i = 0; i < placements; ++i) {
      std::vector<std::string> c;
      if (std::string(row.name).find("paper") != std::string::npos) {
        std::set<int> heads;
        while (heads.size() < 6) heads.insert(static_cast<int>(rng() % space.n_head));
        const int l = static_cast<int>(rng() % space.n_layer);
        for (int h : heads) c.push_back("L" + std::to_string(l) + ".H" + std::to_string(h) + ".pv");
      } else {
        c = place(space, row.d, row.one_layer, rng);
      }
      ddmin.add(search(space, c, Engine::kDdmin).probes);
      const Run g = search(space, c, Engine::kGroups), h = search(space, c, Engine::kCheap);
      groups.add(g.probes);
      cheap.add(h.probes);
      cost_groups += g.cost / placements;
      cost_cheap += h.cost / placements;
    }
    std::printf("%-34s %-7.1f %-18s %-18s %-11.1f %-11.1f %.2f\n", row.name, ddmin.mean(), range(groups).c_str(),
                range(cheap).c_str(), cost_groups, cost_cheap, cost_cheap / cost_groups);
  }
  // Probes at once (--jobs / --gpus G): rounds and the critical path, the cheap engine.
  std::printf("\nparallel probes, cheap engine, %d placements per row: rounds, probes, critical path "
              "(sum of each round's dearest probe, recorded steps per window step) and its ratio to B = 1\n",
              placements);
  std::printf("%-16s %-3s %-8s %-8s %-10s %s\n", "culprits", "B", "rounds", "probes", "critical", "ratio");
  for (const Row& row : {Row{"1", 1, false}, Row{"2, anywhere", 2, false}, Row{"6, one layer", 6, true}}) {
    double base = 0;
    for (int b : {1, 2, 4, 8}) {
      std::mt19937 rng(1000 + row.d * 10 + row.one_layer);
      Stats rounds, probes;
      double critical = 0;
      for (int i = 0; i < placements; ++i) {
        const Run r = search(space, place(space, row.d, row.one_layer, rng), Engine::kCheap, b);
        rounds.add(r.rounds);
        probes.add(r.probes);
        critical += r.critical / placements;
      }
      if (b == 1) base = critical;
      std::printf("%-16s %-3d %-8.1f %-8.1f %-10.1f %.2f\n", row.name, b, rounds.mean(), probes.mean(),
                  critical, critical / base);
    }
  }
  // Races: failing probes stop after a quarter of the window, as the gpt2-small
  // bisect's do; rounds and windows on the critical path (each round as long as its longest
  // probe that was not cut short), bits (no races) against races.
  const double share = 0.25;
  std::printf("\nraces, cheap engine, a failing probe runs %.2f of the window, %d placements per row: rounds, "
              "probes (cut short), windows on the critical path and their ratio to B = 1\n", share, placements);
  std::printf("%-16s %-3s %-24s %-24s\n", "culprits", "B", "bits: rnd/probes/windows", "races: rnd/probes(cut)/windows");
  for (const Row& row : {Row{"1", 1, false}, Row{"2, anywhere", 2, false}, Row{"6, one layer", 6, true}}) {
    double base = 0;
    for (int b : {1, 2, 4, 8}) {
      std::mt19937 rng(1000 + row.d * 10 + row.one_layer);
      Stats r0, p0, r1, p1;
      double w0 = 0, w1 = 0, cut = 0;
      for (int i = 0; i < placements; ++i) {
        const std::vector<std::string> c = place(space, row.d, row.one_layer, rng);
        const Run bits = search(space, c, Engine::kCheap, b, share),
                  race = search(space, c, Engine::kCheap, b, share, true);
        r0.add(bits.rounds);
        p0.add(bits.probes);
        r1.add(race.rounds);
        p1.add(race.probes);
        w0 += bits.windows / placements;
        w1 += race.windows / placements;
        cut += static_cast<double>(race.cut) / placements;
      }
      if (b == 1) base = w0;
      char a[64], z[64];
      std::snprintf(a, sizeof a, "%.1f/%.1f/%.2f (%.2f)", r0.mean(), p0.mean(), w0, w0 / base);
      std::snprintf(z, sizeof z, "%.1f/%.1f(%.1f)/%.2f (%.2f)", r1.mean(), p1.mean(), cut, w1, w1 / base);
      std::printf("%-16s %-3d %-24s %s\n", row.name, b, a, z);
    }
  }
  return 0;
}
