// Verdicts about a horizon: the point of no return (--hold), the hold check after a
// window-local narrowing, the branches and the one-sentence claim a verdict makes, and the
// `rewind train --fork` command that confirms it independently.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "bisect/driver.h"
#include "bisect/driver_context.h"

namespace rwd::bisect::detail {

namespace {

std::string step_text(int64_t s) { return std::to_string(s); }

// The first step where the predicate held on a probe that broke (-1: unknown, e.g. a
// predicate that is not monotone, or a probe that held).
int64_t broke_at(const ProbeOutcome& o) {
  if (!o.fails) return -1;
  if (o.held_at >= 0) return o.held_at;
  return o.stopped_at;
}

std::string outcome_text(const ProbeOutcome& o, int64_t to) {
  if (!o.fails) return "held through step " + step_text(to);
  const int64_t at = broke_at(o);
  return at >= 0 ? "broke at step " + step_text(at) : "broke by step " + step_text(to);
}

Horizon::Branch branch(const BisectReport& rep, const std::string& name, int probe) {
  const ProbeEntry& e = rep.probes.at(static_cast<size_t>(probe));
  Horizon::Branch b;
  b.name = name;
  b.label = e.spec.label();
  b.probe = probe;
  b.held = !e.outcome.fails;
  b.broke_at = broke_at(e.outcome);
  return b;
}

double median_of_last(const std::vector<double>& v, size_t n) {
  std::vector<double> tail(v.end() - static_cast<std::ptrdiff_t>(std::min(n, v.size())), v.end());
  if (tail.empty()) return NAN;
  std::nth_element(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(tail.size() / 2), tail.end());
  return tail[tail.size() / 2];
}

// A predicate judged against the run's own trailing history (a lasting-break test) can stay
// false on a branch that drifted up slowly and stayed there: the end of every branch that held
// is compared with the reference's, as the user would compare it with their healthy run.
void compare_ends(const BisectReport& rep, Horizon& h) {
  const Horizon::Branch* ref = nullptr;
  for (const auto& b : h.branches)
    if (b.name == "reference" && b.held) ref = &b;
  if (!ref) return;
  const int64_t steps = h.to - h.from + 1;
  const size_t n = static_cast<size_t>(std::min<int64_t>(500, std::max<int64_t>(1, steps / 4)));
  const std::vector<double>& rg = rep.probes.at(static_cast<size_t>(ref->probe)).outcome.grad_norm;
  if (static_cast<int64_t>(rg.size()) != steps) return;
  const double base = median_of_last(rg, n);
  if (!(base > 0)) return;
  for (auto& b : h.branches) {
    const std::vector<double>& g = rep.probes.at(static_cast<size_t>(b.probe)).outcome.grad_norm;
    if (!b.held || static_cast<int64_t>(g.size()) != steps) continue;
    b.end_ratio = median_of_last(g, n) / base;
    b.end_steps = static_cast<int64_t>(n);
  }
}

std::string ratio_text(const Horizon::Branch& b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fx", b.end_ratio);
  return buf;
}

// The end-of-horizon sentence a claim about a held set carries ("" when not compared).
std::string end_clause(const Horizon::Branch* b) {
  if (!b || std::isnan(b->end_ratio)) return "";
  const std::string r = ratio_text(*b), n = step_text(b->end_steps);
  if (b->end_ratio > kHealthyEndRatio)
    return " But its median gradient norm over the last " + n + " steps is " + r +
           " the reference's: the predicate does not see this break, and the set is not as healthy as the reference.";
  return " Its median gradient norm over the last " + n + " steps is " + r + " the reference's.";
}

const Horizon::Branch* named_branch(const Horizon& h, const std::string& name) {
  for (const auto& b : h.branches)
    if (b.name == name) return &b;
  return nullptr;
}

// The heads and layers a set of elements touches, for the granularity sentence.
std::pair<std::set<std::pair<int, int>>, std::set<int>> heads_of(const std::vector<Element>& set,
                                                                 const SearchSpace& space) {
  std::set<std::pair<int, int>> heads;
  std::set<int> layers;
  for (const auto& e : set)
    for (const auto& leaf : space.op_leaves(e))
      if (leaf.head >= 0) {
        heads.insert({leaf.layer, leaf.head});
        layers.insert(leaf.layer);
      }
  return {heads, layers};
}

const char* granularity_name(int depth) { return depth <= 0 ? "layers" : depth == 1 ? "heads" : "ops"; }

// The --plan that gives a run recorded under `run`'s schedule the plan `p` runs at every step
// where its plan may change inside [p.from, p.to]; "" where no single spec does.
std::string fork_spec(const ProbeSpec& p, const train::RunSpec& run, const SearchSpace& space) {
  if (!p.candidate || p.candidate->mode != Mode::kPromote) return "";
  const train::Config& c = run.config;
  std::vector<int64_t> points = {p.from};
  for (const auto& ch : run.plan.changes)
    if (ch.first > p.from && ch.first <= p.to) points.push_back(ch.first);
  auto reproduces = [&](const std::string& spec) {
    try {
      for (int64_t s : points)
        if (plan::apply(run.plan.at(s, c.n_layer, c.n_head), spec) != probe_plan(p, run, s)) return false;
      return true;
    } catch (const UsageError&) {
      return false;
    }
  };
  // The short form first: the reference's settings of every leaf, as one canonical plan.
  const plan::Plan recorded = run.plan.at(p.from, c.n_layer, c.n_head);
  const std::string all = candidate_plan(*p.candidate, space, plan::Plan::defaults(c.n_layer, c.n_head),
                                         plan::apply(recorded, p.reference)).canonical();
  if (!all.empty() && reproduces(all)) return all;
  // Else each leaf reset to its default first, then given the reference's settings.
  std::vector<std::string> parts;
  for (const auto& e : p.candidate->elements)
    for (const auto& leaf : space.op_leaves(e)) {
      // The leaf as the reference has it, on a default plan: its canonical text is the setting.
      const plan::Plan only = candidate_plan({Mode::kPromote, {leaf}}, space_for(c),
                                             plan::Plan::defaults(c.n_layer, c.n_head),
                                             plan::apply(recorded, p.reference));
      const std::string target = to_string(leaf);
      parts.push_back(target + "=low");
      if (!only.canonical().empty()) parts.push_back(only.canonical());
    }
  std::string spec;
  for (const auto& s : parts) spec += (spec.empty() ? "" : ";") + s;
  return reproduces(spec) ? spec : "";
}

}  // namespace

int64_t horizon_end(Context& ctx, const BisectOptions& o, int64_t to, std::string& why) {
  const int64_t last = ctx.store.step_range(ctx.run.run_id)->second;
  if (to <= last) return to;
  if (!o.beyond_recording) {
    why = "a script's run is checked up to its recording's last step, " + step_text(last);
    return last;
  }
  const std::vector<std::string> used = ctx.pred.series_used();
  if (std::find(used.begin(), used.end(), "recorded_loss") != used.end()) {
    why = "the predicate reads recorded_loss, which ends at the recording's last step, " + step_text(last);
    return last;
  }
  return to;
}

void find_point_of_no_return(Context& ctx, const BisectOptions& o, TimeSearch& t, int64_t horizon) {
  BisectReport& rep = ctx.report;
  const int n = static_cast<int>(t.checkpoints.size());
  const int k = std::max(1, o.pool.jobs);
  std::map<int, ProbeOutcome> known;
  auto ask = [&](std::vector<int> idx) {
    idx.erase(std::remove_if(idx.begin(), idx.end(), [&](int i) { return known.count(i) > 0; }), idx.end());
    if (idx.empty()) return;
    std::vector<ProbeSpec> batch;
    for (int i : idx) {
      ProbeSpec s = ctx.make(t.checkpoints[static_cast<size_t>(i)], horizon, "time");
      s.spec = o.fix;
      batch.push_back(s);
    }
    const int first = static_cast<int>(rep.probes.size());
    std::vector<ProbeOutcome> outs = ctx.probe(batch);
    for (size_t j = 0; j < idx.size(); ++j) {
      known[idx[j]] = outs[j];
      t.probes.push_back(first + static_cast<int>(j));
    }
  };
  auto holds = [&](int i) { return !known.at(i).fails; };
  ctx.phase = "time";
  ctx.estimate += 4;
  // The latest checkpoints first (galloping back 1, 2, 4, ... checkpoints): the damage is
  // usually recent, and a probe that breaks stops at its break, so the probes that cost a whole
  // horizon are those that hold. Holding is not monotone in the start step in practice: a
  // checkpoint that holds counts only when the one before it holds too.
  std::vector<std::string> lucky;
  int lo = -1, hi = n, top = n - 1;
  while (top >= 0) {
    std::vector<int> seq;
    for (int d = 0; top - d >= 0; d = 2 * d + 1) seq.push_back(top - d);
    if (seq.back() != 0) seq.push_back(0);
    lo = -1;
    hi = top + 1;
    for (size_t j = 0; j < seq.size() && lo < 0; j += static_cast<size_t>(k)) {
      std::vector<int> batch(seq.begin() + static_cast<long>(j),
                             seq.begin() + static_cast<long>(std::min(seq.size(), j + static_cast<size_t>(k))));
      if (batch.size() == 1 && batch[0] > 0 && k >= 2) batch.push_back(batch[0] - 1);
      ask(batch);
      for (int i : batch) {  // latest first
        if (holds(i)) {
          lo = i;
          break;
        }
        hi = std::min(hi, i);
      }
    }
    if (lo < 0) break;
    while (hi - lo > 1) {  // lo holds, hi breaks (or is past the last candidate)
      std::vector<int> points;
      for (int i = 1; i <= k; ++i) {
        int p = lo + static_cast<int>((static_cast<int64_t>(hi - lo) * i) / (k + 1));
        if (p > lo && p < hi && (points.empty() || p != points.back())) points.push_back(p);
      }
      ask(points);
      for (int p : points) {
        if (!holds(p)) {
          hi = p;
          break;
        }
        lo = p;
      }
    }
    if (lo == 0) break;
    ask({lo - 1});
    if (holds(lo - 1)) break;
    lucky.push_back("checkpoint " + step_text(t.checkpoints[static_cast<size_t>(lo)]) + " holds but " +
                    step_text(t.checkpoints[static_cast<size_t>(lo - 1)]) + " before it breaks (" +
                    outcome_text(known.at(lo - 1), horizon) + "): taken for luck, searched earlier");
    top = lo - 2;
    lo = -1;
  }
  const std::string fix = o.fix == kFullPrecision ? std::string("all-FP32") : "'" + o.fix + "'";
  if (lo < 0) {
    t.c_star = t.checkpoints.front();
    t.status = TimeSearch::Status::kBakedIn;
    t.message = "no point of no return found: from no checkpoint before step " + step_text(t.fail_step) +
                " does " + fix + " hold through step " + step_text(horizon) +
                " (the earliest, " + step_text(t.c_star) + ", " +
                (known.count(0) ? outcome_text(known.at(0), horizon) : std::string("was not reached")) + ")";
  } else {
    const int64_t c = t.checkpoints[static_cast<size_t>(lo)];
    t.c_star = c;
    t.status = TimeSearch::Status::kWindow;
    t.message = "point of no return after checkpoint " + step_text(c) + ": from it " + fix + " holds through step " +
                step_text(horizon);
    if (lo + 1 < n && known.count(lo + 1))
      t.message += "; from checkpoint " + step_text(t.checkpoints[static_cast<size_t>(lo + 1)]) + " it " +
                   outcome_text(known.at(lo + 1), horizon);
    else if (lo + 1 == n)
      t.message += " (it is the last checkpoint before the failure)";
    t.message += lo > 0 ? "; checkpoint " + step_text(t.checkpoints[static_cast<size_t>(lo - 1)]) + " before it holds too"
                        : "; it is the earliest checkpoint, with none before it to confirm it";
  }
  for (const auto& l : lucky) t.message += "; " + l;
  rep.horizon = Horizon{};
  rep.horizon->searched = true;
  rep.horizon->fail_step = t.fail_step;
  rep.horizon->from = t.c_star;
  rep.horizon->to = horizon;
  if (lo >= 0) rep.horizon->point_of_no_return = t.c_star;
}

void hold_check(Context& ctx, const BisectOptions& o) {
  BisectReport& rep = ctx.report;
  const Status st = rep.search.status;
  if (!rep.narrowed || !found_fix(st) || rep.search.fixing_set.empty()) return;
  Horizon h;
  h.from = rep.from;
  h.hold = o.hold_check ? *o.hold_check : std::min<int64_t>(1000, 10 * (rep.to - rep.from + 1));
  h.granularity = granularity_name(rep.depth);
  const std::string set = to_string(rep.search.fixing_set);
  const std::string window = "steps " + step_text(rep.from) + "-" + step_text(rep.to);
  h.to = h.hold > 0 ? horizon_end(ctx, o, rep.to + h.hold, h.capped) : rep.to;
  // A budget already spent leaves the hold check out, and the claim says so.
  const double spent_min = (now_s() - ctx.t0) / 60;
  if (h.to > rep.to && o.budget_min > 0 && spent_min >= o.budget_min) {
    char buf[120];
    std::snprintf(buf, sizeof buf, "the budget of %g min was spent", o.budget_min);
    h.capped = buf;
    h.to = rep.to;
  }
  if (h.to <= rep.to) {
    h.to = rep.to;
    h.claim = "Promoting " + set + " fixes " + window + "; not checked beyond step " + step_text(rep.to) +
              (h.hold <= 0 ? " (--hold-check 0)" : " (" + h.capped + ")") + ".";
    rep.horizon = h;
    return;
  }
  ctx.phase = "hold";
  ProbeSpec fix = ctx.make(rep.from, h.to, "hold");
  fix.candidate = Candidate{Mode::kPromote, rep.search.fixing_set};
  ProbeSpec ref = ctx.make(rep.from, h.to, "hold");
  ref.candidate = Candidate{Mode::kKeepLow, {}};
  const int first = static_cast<int>(rep.probes.size());
  const std::vector<ProbeOutcome> outs = ctx.probe({fix, ref});
  h.branches.push_back(branch(rep, "fixing set", first));
  h.branches.push_back(branch(rep, "reference", first + 1));
  compare_ends(rep, h);
  const std::string until = "through step " + step_text(h.to) + " (" + step_text(h.to - rep.to) + " steps past the window)";
  if (!outs[1].fails && !outs[0].fails) {
    h.claim = "Promoting " + set + " from step " + step_text(rep.from) + " keeps '" + rep.predicate + "' false " + until +
              ", as the reference does; not checked beyond step " + step_text(h.to) + "." +
              end_clause(named_branch(h, "fixing set"));
  } else if (!outs[1].fails) {
    h.claim = "Promoting " + set + " fixes " + window + " but does not hold: trained on from step " + step_text(rep.from) +
              " it " + outcome_text(outs[0], h.to) + ", while the reference holds " + until +
              "; bisect --hold N looks for a set that holds.";
  } else {
    h.claim = "The reference itself " + outcome_text(outs[1], h.to) + " trained on from step " + step_text(rep.from) +
              " (the fixing set " + set + " " + outcome_text(outs[0], h.to) +
              "): the window lies past the point of no return, or the predicate trips on healthy training; "
              "bisect --hold N searches earlier checkpoints.";
  }
  if (h.capped.size()) h.claim += " (The horizon stops at step " + step_text(h.to) + ": " + h.capped + ".)";
  SearchSpace space = window_space(ctx.run, rep.from, rep.to, o.reference);
  space.depth = rep.depth;
  // Confirm only what held, and only a run of rewind's trainer (`train --fork` cannot run a script).
  const std::string spec = outs[0].fails || o.run_spec ? "" : fork_spec(fix, ctx.run, space);
  if (!spec.empty())
    h.fork_command = "rewind train --fork " + rep.store_path + " --at " + step_text(rep.from) + " --plan '" + spec +
                     "' --record fix.db --steps " + step_text(h.to + 1);
  rep.horizon = h;
}

void describe_horizon(Context& ctx, const BisectOptions& o) {
  BisectReport& rep = ctx.report;
  if (!rep.horizon) return;
  Horizon& h = *rep.horizon;
  h.hold = *o.hold;
  h.granularity = granularity_name(rep.depth);
  h.depth_note = rep.depth_note;
  if (!rep.narrowed) {
    if (rep.time && h.point_of_no_return >= 0)
      h.claim = "From checkpoint " + step_text(h.point_of_no_return) + " " +
                (o.fix == o.reference ? std::string("the reference") : "'" + o.fix + "'") + " keeps '" + rep.predicate +
                "' false through step " + step_text(h.to) + " (the failure step " + step_text(h.fail_step) + " + " +
                step_text(h.to - h.fail_step) + "); no set searched (--window-only).";
    else if (rep.time)
      h.claim = "No verdict about the horizon: " + rep.time->message + ".";
    return;
  }
  const SearchSpace space = [&] {
    SearchSpace s = window_space(ctx.run, rep.from, rep.to, o.reference);
    s.depth = rep.depth;
    return s;
  }();
  // The branches: every probe of the narrowing window, the anchors and the fixing set first.
  int fixing = -1;
  for (const auto& p : rep.probes) {
    if (p.spec.from != rep.from || p.spec.to != rep.to || !p.spec.candidate || p.outcome.cut) continue;
    const Candidate& c = *p.spec.candidate;
    std::string name;
    if (c.mode == Mode::kPromote && c.elements.empty()) name = "recorded plan";
    else if (c.mode == Mode::kKeepLow && c.elements.empty()) name = "reference";
    else if (c.mode == Mode::kPromote && c.elements == rep.search.fixing_set) name = "fixing set";
    else name = "tried";
    bool seen = false;
    for (const auto& b : h.branches) seen = seen || b.label == p.spec.label();
    if (seen) continue;
    h.branches.push_back(branch(rep, name, p.index));
    if (name == "fixing set") fixing = p.index;
  }
  for (const auto& f : rep.fixes)
    if (!f.spec.empty() && f.probe >= 0) h.branches.push_back(branch(rep, f.name, f.probe));
  std::stable_sort(h.branches.begin(), h.branches.end(), [](const Horizon::Branch& a, const Horizon::Branch& b) {
    auto rank = [](const std::string& n) { return n == "recorded plan" ? 0 : n == "reference" ? 1 : n == "fixing set" ? 2 : 3; };
    return rank(a.name) < rank(b.name);
  });
  compare_ends(rep, h);
  const Status st = rep.search.status;
  // --window A:B --hold N has no time search: B stands for the failure step, A for the start.
  const std::string until = "through step " + step_text(h.to) + " (" + (rep.time ? "the failure step " : "the window's end ") +
                            step_text(h.fail_step) + " + " + step_text(h.to - h.fail_step) + ")";
  const std::string start = h.point_of_no_return >= 0 ? "from the point of no return, step " + step_text(rep.from)
                                                      : "from step " + step_text(rep.from);
  if (!found_fix(st) || rep.search.fixing_set.empty()) {
    h.claim = std::string("No set found that holds ") + until + ": " + status_name(st) + ".";
    return;
  }
  const auto [heads, layers] = heads_of(rep.search.fixing_set, space);
  std::string grain = "at " + std::string(granularity_name(space.depth)).substr(0, std::string(granularity_name(space.depth)).size() - 1) +
                      " granularity";
  if (space.depth == 0) grain += " only (heads not searched" + (h.depth_note.empty() ? std::string("") : ": " + h.depth_note) + ")";
  else if (heads.size() >= 2 && heads.size() == layers.size() * static_cast<size_t>(rep.n_head))
    grain += "; not localizable below " + std::to_string(heads.size()) + " heads (every head of its layers)";
  else if (!h.depth_note.empty()) grain += " (" + h.depth_note + ")";
  h.claim = "Promoting " + to_string(rep.search.fixing_set) + " " + start + ", keeps '" + rep.predicate + "' false " + until + ", as the reference does: the smallest set found " + grain +
            "; not checked beyond step " + step_text(h.to) + "." + end_clause(named_branch(h, "fixing set"));
  if (fixing >= 0 && !o.run_spec) {
    const std::string spec = fork_spec(rep.probes[static_cast<size_t>(fixing)].spec, ctx.run, space);
    if (!spec.empty())
      h.fork_command = "rewind train --fork " + rep.store_path + " --at " + step_text(rep.from) + " --plan '" + spec +
                       "' --record fix.db --steps " + step_text(h.to + 1);
  }
}

void attach_band(Context& ctx, const BisectOptions& o, ProbeSpec& p) {
  if (o.early_band <= 0) return;
  const Candidate reference{Mode::kKeepLow, {}};
  if (p.candidate && p.candidate->mode == reference.mode && p.candidate->elements.empty()) return;
  // The reference branch over the same steps: its window probe, or the time probe from the same
  // checkpoint under the fix plan (the reference by default), whichever holds and ran whole.
  for (const auto& e : ctx.report.probes) {
    const bool ref = (e.spec.candidate && e.spec.candidate->mode == Mode::kKeepLow && e.spec.candidate->elements.empty()) ||
                     (e.spec.kind == "time" && e.spec.spec == ctx.reference);
    if (!ref || e.spec.from != p.from || e.spec.to != p.to || e.outcome.fails || e.outcome.cut ||
        e.outcome.max_logit.size() != static_cast<size_t>(p.to - p.from + 1))
      continue;
    // A candidate that trains the reference's own plans (promoting the whole space) is that
    // branch: without a band its key is the reference probe's, a cache hit.
    if (probe_key(p, ctx.run, ctx.pred) == probe_key(e.spec, ctx.run, ctx.pred)) return;
    p.band = e.outcome.max_logit;
    p.band_k = o.early_band;
    p.band_steps = o.early_steps;
    p.band_stop = o.early_stop;
    return;
  }
}

void account_early(Context& ctx, const BisectOptions& o) {
  if (o.early_band <= 0) return;
  BisectReport::EarlyCalls c;
  c.k = o.early_band;
  c.steps = o.early_steps;
  c.stop = o.early_stop;
  std::set<std::string> seen;
  for (const auto& e : ctx.report.probes) {
    if (e.spec.band.empty() || e.outcome.cut || !seen.insert(e.outcome.key).second) continue;
    const ProbeOutcome& out = e.outcome;
    c.steps_run += out.steps;
    if (out.judged_early) {
      ++c.judged;
      continue;
    }
    const bool called = out.indicator_at >= 0;
    if (called && out.fails) {
      ++c.called_failed;
      const int64_t brk = broke_at(out);
      if (brk >= 0) c.lead_steps += brk - out.indicator_at;
      c.after_call += e.spec.from + out.steps - 1 - out.indicator_at;
    } else if (called) {
      ++c.called_held;
    } else if (out.fails) {
      ++c.missed;
    } else {
      ++c.quiet_held;
    }
  }
  ctx.report.early = c;
}

std::string early_text(const BisectReport& rep) {
  if (!rep.early) return "";
  const BisectReport::EarlyCalls& c = *rep.early;
  char buf[512];
  const int measured = c.called_failed + c.called_held + c.missed + c.quiet_held;
  std::string v;
  std::snprintf(buf, sizeof buf,
                "leading indicator: the largest max logit over the heads above %.3g x the reference branch's for %d "
                "steps in a row; the probes it watched ran %lld steps\n",
                c.k, c.steps, static_cast<long long>(c.steps_run));
  v += buf;
  if (measured > 0) {
    std::snprintf(buf, sizeof buf,
                  "  agreement with the outcome over %d probe(s) run to their verdict: %d/%d (called and broke %d, "
                  "called but held %d, broke uncalled %d, held uncalled %d); called %.1f steps before the break on "
                  "average; trusted, the calls would have saved %lld of those steps\n",
                  measured, c.called_failed + c.quiet_held, measured, c.called_failed, c.called_held, c.missed,
                  c.quiet_held, c.called_failed ? static_cast<double>(c.lead_steps) / c.called_failed : 0.0,
                  static_cast<long long>(c.after_call));
    v += buf;
  }
  if (c.judged > 0)
    v += "  " + std::to_string(c.judged) + " probe(s) judged failing by the indicator (--early-stop), not trained to " +
         "their verdict: the answer relies on the agreement measured without --early-stop\n";
  return v;
}

}  // namespace rwd::bisect::detail
