// The narrowing of one window: the search engine over layers, heads and ops with replay
// probes as its oracle, deepened a level at a time under a budget, then the fix checks (the
// fixing set, the stabilized softmax, stochastic rounding of P̄); and the widening of a window
// whose recorded-plan replay passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "bisect/driver.h"
#include "bisect/driver_context.h"

namespace rwd::bisect::detail {

namespace {

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Rough probe count of a narrowing, for the progress estimate: checks, one ddmin descent per
// level (two probes per halving), verification and the fix checks.
int narrowing_estimate(const SearchSpace& sp) {
  return 3 + 2 * (ceil_log2(static_cast<int>(sp.top_level().size())) + ceil_log2(sp.n_head) +
                  ceil_log2(static_cast<int>(sp.ops.size()))) + 5;
}

// "L1: H{0,2}" and "softmax=stable(beta=2)" -> the plan spec that sets this op to this mode in
// exactly these heads.
std::string heads_spec(const std::map<int, std::set<int>>& heads, const std::string& assignment) {
  std::vector<std::string> parts;
  for (const auto& [layer, hs] : heads) {
    std::vector<std::string> h;
    for (int x : hs) h.push_back(std::to_string(x));
    parts.push_back("L" + std::to_string(layer) + ".H{" + join(h, ",") + "}." + assignment);
  }
  return join(parts, ";");
}

// The candidate fixes besides the promotion, each in the guilty heads and in every head: the
// stabilized softmax (paper Alg. 3) and stochastic rounding of P̄ before P̄V, which removes the
// bias of rounding P̄ to nearest (kernels/stochastic_round.h).
struct CandidateFix {
  const char* name;
  const char* assignment;
};
constexpr CandidateFix kCandidateFixes[] = {{"stabilized softmax (beta=2)", "softmax=stable(beta=2)"},
                                            {"stochastic rounding (pv=sr)", "pv=sr"}};

}  // namespace

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the narrowing of [from, to] searches: the window's space, less what no plan reaches.
SearchSpace searched_space(const train::RunSpec& run, const BisectOptions& o, int64_t from, int64_t to) {
  SearchSpace space = window_space(run, from, to, o.reference);
  space.depth = o.depth;
  if (o.attention_only) {
    space.modules.clear();
    space.model_head = false;
  }
  return space;
}

// The report so far, handed to BisectOptions::on_interim with what is still to run.
void interim(Context& ctx, const BisectOptions& o, const std::string& pending) {
  if (!o.on_interim) return;
  BisectReport& rep = ctx.report;
  rep.pending = pending;
  rep.executed = ctx.pool.executed();
  rep.cached = ctx.pool.cached();
  rep.wall_s = now_s() - ctx.t0;
  rep.verdict = detail::verdict_text(rep);
  o.on_interim(rep);
  rep.pending.clear();
}

void narrow_window(Context& ctx, const BisectOptions& o, int64_t from, int64_t to) {
  BisectReport& rep = ctx.report;
  const train::Config& c = ctx.run.config;
  rep.narrowed = true;
  rep.from = from;
  rep.to = to;
  rep.recorded_plan = ctx.run.plan.at(from, c.n_layer, c.n_head).canonical();
  SearchSpace space = searched_space(ctx.run, o, from, to);
  rep.space = space.ops;
  for (const auto& m : space.modules) rep.space.push_back(m);
  if (space.model_head) rep.space.push_back("head");
  ctx.estimate += narrowing_estimate(space);
  const size_t first_probe = rep.probes.size();

  SearchOptions so;
  so.max_batch = o.pool.jobs;
  so.group_testing = o.group_testing;
  so.cheap_direction = o.cheap_direction;
  so.fixing_only = o.hold.has_value();
  so.cost = CostModel::named(rep.cost_model);
  so.before_batch = [&](const std::string& phase) { ctx.phase = phase; };
  // Races where probes run on several workers at once: a failing probe's early
  // verdict ends the round, the recorded plan's included (the first round waits for it).
  const bool races = o.pool.jobs >= 2 && !o.pool.comm && (!o.pool.runner || o.pool.runner_stops) && o.pool.ranks == 1;
  // The engine's candidates as window probes; verdicts 1 fails, 0 passes, -1 cut short.
  auto run_candidates = [&](const std::vector<Candidate>& cands, int stop_after_fails) {
    std::vector<ProbeSpec> batch;
    for (const auto& cand : cands) {
      ProbeSpec p = ctx.make(from, to, "window");
      p.candidate = cand;
      if (o.hold) detail::attach_band(ctx, o, p);
      // Over a long horizon the recorded plan's probe stops at its break like the others.
      p.baseline_whole = !races && !o.hold;
      batch.push_back(p);
    }
    std::vector<int> verdicts;
    for (const auto& out : ctx.probe(batch, stop_after_fails)) verdicts.push_back(out.cut ? -1 : out.fails);
    return verdicts;
  };
  Oracle oracle = [&](const std::vector<Candidate>& cands) {
    std::vector<bool> verdicts;
    for (int v : run_candidates(cands, 0)) verdicts.push_back(v == 1);
    return verdicts;
  };
  // The share of the window a failing probe runs: where the predicate came to hold in this
  // window's failing probes so far (the recorded plan's one included).
  if (races) {
    so.race = run_candidates;
    so.fail_fraction = [&, from, to] {
      double sum = 0;
      int n = 0;
      for (const auto& p : rep.probes)
        if (p.spec.kind == "window" && p.spec.from == from && p.spec.to == to && p.outcome.fails) {
          const int64_t ran = p.outcome.held_at >= from ? p.outcome.held_at - from + 1 : to - from + 1;
          sum += static_cast<double>(ran) / static_cast<double>(to - from + 1);
          ++n;
        }
      return n ? sum / n : 1.0;
    };
  }
  // With a budget the search deepens a level at a time (layers, heads, ops), each pass asking
  // the levels above it again from the probe cache, while the last level's time fits in what
  // the budget has left: the next level asks about as many questions of as long probes.
  space.depth = o.budget_min > 0 ? 0 : o.depth;
  for (;;) {
    const double level_t0 = now_s();
    const size_t level_first = rep.probes.size();
    rep.search = search(space, oracle, so);
    // Every engine probe reached the oracle once, in order: engine index i is report probe first + i.
    if (rep.probes.size() == level_first + rep.search.probes.size())
      for (const Probe& p : rep.search.probes)
        if (p.parent >= 0) rep.probes[level_first + static_cast<size_t>(p.index)].parent = static_cast<int>(level_first) + p.parent;
    const Status s = rep.search.status;
    if (space.depth >= o.depth || !found_fix(s)) break;
    const double level_min = (now_s() - level_t0) / 60, left_min = o.budget_min - (now_s() - ctx.t0) / 60;
    if (level_min > left_min) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "the %s level took %.1f min, about what the next takes, and the budget of %g min leaves %.1f",
                    space.depth == 0 ? "layer" : "head", level_min, o.budget_min, std::max(0.0, left_min));
      rep.depth_note = buf;
      break;
    }
    ++space.depth;
  }
  rep.depth = space.depth;
  const Status st = rep.search.status;
  rep.near_miss.reset();
  if (st == Status::kNotReproducible) rep.near_miss = detail::recorded_near_miss(ctx, from, to);
  if (!found_fix(st) && st != Status::kNoFixInSpace) return;

  // Fix checks: the fixing set promoted (already probed by the engine: a cache hit), and each
  // candidate fix in the guilty heads and everywhere (one batch).
  ctx.phase = "fix";
  std::vector<FixCheck> checks;
  if (!rep.search.fixing_set.empty())
    checks.push_back({"promote the fixing set " + to_string(rep.search.fixing_set) +
                          (o.reference == kFullPrecision ? " to FP32" : " to the reference"), "", false, -1});
  std::map<int, std::set<int>> guilty;
  for (const auto* set : {&rep.search.failing_set, &rep.search.fixing_set})
    for (const auto& e : *set)
      if (e.head >= 0) guilty[e.layer].insert(e.head);
  for (const CandidateFix& fix : kCandidateFixes) {
    if (!guilty.empty())
      checks.push_back({std::string(fix.name) + " in the guilty heads", heads_spec(guilty, fix.assignment), false, -1});
    checks.push_back({std::string(fix.name) + " in every head", std::string("L*.H*.") + fix.assignment, false, -1});
  }
  // Under a budget the checks beside the promotion (a cache hit) run only if they fit: each
  // trains about as long as this window's longest passing probe (a fix that holds runs it all).
  const size_t promoted = rep.search.fixing_set.empty() ? 0 : 1;
  if (o.budget_min > 0 && checks.size() > promoted) {
    double longest_s = 0;
    for (size_t i = first_probe; i < rep.probes.size(); ++i)
      if (!rep.probes[i].outcome.fails) longest_s = std::max(longest_s, rep.probes[i].outcome.wall_s);
    const size_t n = checks.size() - promoted;
    const double need_min = longest_s / 60 * static_cast<double>((n + o.pool.jobs - 1) / o.pool.jobs);
    const double left_min = o.budget_min - (now_s() - ctx.t0) / 60;
    if (need_min > left_min) {
      char buf[240];
      std::snprintf(buf, sizeof buf, "%zu stabilized-softmax and stochastic-rounding check(s) not run: about %.1f min, "
                    "and the budget of %g min leaves %.1f",
                    n, need_min, o.budget_min, std::max(0.0, left_min));
      rep.checks_note = buf;
      checks.resize(promoted);
    }
  }
  if (!checks.empty()) interim(ctx, o, "the fix checks");
  std::vector<ProbeSpec> batch;
  for (const auto& ch : checks) {
    ProbeSpec p = ctx.make(from, to, "fix");
    if (ch.spec.empty()) p.candidate = Candidate{Mode::kPromote, rep.search.fixing_set};
    else p.spec = ch.spec;
    // Under --hold the band is part of a probe's key: the promotion is then the narrowing's own
    // probe of the fixing set (a cache hit), not a second run of the whole horizon.
    if (o.hold) detail::attach_band(ctx, o, p);
    batch.push_back(p);
  }
  const int first = static_cast<int>(rep.probes.size());
  std::vector<ProbeOutcome> outs = ctx.probe(batch);
  for (size_t i = 0; i < checks.size(); ++i) {
    checks[i].fixes = !outs[i].fails;
    checks[i].probe = first + static_cast<int>(i);
  }
  rep.fixes = checks;
}

// The time search said the window fails, yet its recorded-plan replay passes
// the predicate (an aggregate such as mean or growth can read a longer window differently from
// one step). Widen it to the recorded failure step when that lies beyond, else to the next
// checkpoint after its end (or the last recorded step); nullopt when there is nothing left.
std::optional<std::pair<int64_t, int64_t>> widen(Context& ctx, std::pair<int64_t, int64_t> w,
                                                 std::pair<int64_t, int64_t> range) {
  BisectReport& rep = ctx.report;
  std::optional<int64_t> recorded_failure;
  if (rep.time && !rep.time->fail_step_given) recorded_failure = rep.time->fail_step;
  std::string why;
  int64_t to = w.second;
  if (recorded_failure && *recorded_failure > w.second) {
    to = *recorded_failure;
    why = "the recorded failure step";
  } else {
    for (int64_t c : ctx.store.checkpoint_steps(ctx.run.run_id))
      if (c > w.second) {
        to = c;
        why = "the next checkpoint";
        break;
      }
    if (to == w.second && range.second > w.second) {
      to = range.second;
      why = "the last recorded step";
    }
  }
  const std::string was = std::to_string(w.first) + ":" + std::to_string(w.second);
  if (to == w.second) {
    rep.widenings.push_back("window " + was + " passes under the recorded plan and cannot be widened further");
    return std::nullopt;
  }
  rep.widenings.push_back("window " + was + " passes under the recorded plan, although the time search says it fails; widened to " +
                          std::to_string(w.first) + ":" + std::to_string(to) + " (" + why + ")");
  return std::make_pair(w.first, to);
}

}  // namespace rwd::bisect::detail
