// The verdict's text: the time search, the narrowing's sets and fix checks, the horizon's
// branches and claim, the leading indicator's calls, the probe count and costs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "bisect/driver.h"
#include "bisect/driver_context.h"

namespace rwd::bisect {

namespace detail {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

}  // namespace detail

namespace {

using detail::join;

// Names of the layers, heads and ops of a set of leaves, for the verdict.
struct Located {
  std::vector<std::string> layers, heads, ops;
};
Located locate(const std::vector<Element>& set) {
  std::set<int> layers;
  std::set<std::pair<int, int>> heads;
  std::set<std::string> ops;
  for (const auto& e : set) {
    if (e.layer >= 0) layers.insert(e.layer);
    if (e.head >= 0) heads.insert({e.layer, e.head});
    ops.insert(e.op);
  }
  Located l;
  for (int x : layers) l.layers.push_back("L" + std::to_string(x));
  for (const auto& [a, b] : heads) l.heads.push_back("L" + std::to_string(a) + ".H" + std::to_string(b));
  l.ops.assign(ops.begin(), ops.end());
  return l;
}

std::string horizon_text(const BisectReport& rep, const Horizon& h) {
  std::string v;
  if (h.searched)
    v += "horizon: every probe judged over steps " + std::to_string(h.from) + "-" + std::to_string(h.to) +
         " (--hold " + std::to_string(h.hold) + " past the failure step " + std::to_string(h.fail_step) + ")" +
         (h.capped.empty() ? "" : "; capped: " + h.capped) + "\n";
  else if (!h.branches.empty())
    v += "hold check: trained on from step " + std::to_string(h.from) + " through step " + std::to_string(h.to) + " (" +
         std::to_string(h.to - rep.to) + " steps past the window)\n";
  for (const auto& b : h.branches) {
    if (b.name == "tried") continue;
    std::string end;
    if (!std::isnan(b.end_ratio)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "; median gradient norm of its last %lld steps %.2fx the reference's%s",
                    static_cast<long long>(b.end_steps), b.end_ratio,
                    b.end_ratio > kHealthyEndRatio ? ": NOT healthy, the predicate misses this break" : "");
      end = buf;
    }
    v += "  " + b.name + " " + b.label + ": " +
         (b.held ? "held through step " + std::to_string(h.to)
                 : b.broke_at >= 0 ? "broke at step " + std::to_string(b.broke_at) : "broke by step " + std::to_string(h.to)) +
         end + "\n";
  }
  if (!h.claim.empty()) v += "claim: " + h.claim + "\n";
  if (!h.fork_command.empty()) v += "confirm: " + h.fork_command + "\n";
  return v;
}

}  // namespace

namespace detail {

std::string verdict_text(const BisectReport& rep) {
  std::string v;
  char buf[256];
  if (!rep.pending.empty())
    v += "INTERIM: this bisect had not finished when this was written; still to run: " + rep.pending +
         ". The finished bisect replaces it; the same command resumes from the probe cache.\n";
  if (rep.time) {
    const TimeSearch& t = *rep.time;
    if (t.status != TimeSearch::Status::kNoFailure) {
      std::snprintf(buf, sizeof buf, "time: failure at step %lld: %s\ntime: %zu checkpoint(s) before it; %zu time probe(s)\n",
                    static_cast<long long>(t.fail_step), t.fail_reason.c_str(), t.checkpoints.size(), t.probes.size());
      v += buf;
    }
    v += "time: " + t.message + "\n";
  }
  for (const auto& w : rep.widenings) v += "widened: " + w + "\n";
  if (rep.narrowed) {
    const SearchResult& r = rep.search;
    std::snprintf(buf, sizeof buf, "window %lld:%lld, predicate '%s'\n", static_cast<long long>(rep.from),
                  static_cast<long long>(rep.to), rep.predicate.c_str());
    v += buf;
    const bool fp32 = rep.reference.empty();
    const std::string rest = fp32 ? "FP32" : "as the reference '" + rep.reference + "'";
    if (!fp32 || rep.space.size() < 12)
      v += "searched: " + join(rep.space, " ") + " (where the recorded plan and " +
           (fp32 ? std::string("all-FP32") : "the reference") + " differ)\n";
    v += std::string("verdict: ") + status_name(r.status) + " — " + r.summary.substr(r.summary.find(':') + 2) + "\n";
    if (!r.failing_set.empty()) {
      // Every culprit: the failing set's and the fixing set's (a second culprit may show only there).
      std::vector<Element> culprits = r.failing_set;
      for (const auto& e : r.fixing_set)
        if (std::find(culprits.begin(), culprits.end(), e) == culprits.end()) culprits.push_back(e);
      Located l = locate(culprits);
      v += "  failing set (kept low, everything else " + rest + ", still fails): " + to_string(r.failing_set) + "\n";
      v += "  layers: " + join(l.layers, " ") + "   heads: " + (l.heads.empty() ? "-" : join(l.heads, " ")) +
           "   ops: " + join(l.ops, " ") + "\n";
    }
    if (!r.fixing_set.empty())
      v += std::string("  fixing set (promoted to ") + (fp32 ? "FP32" : "the reference") + ", the rest as recorded, passes): " + to_string(r.fixing_set) + "\n";
    const std::string steps = std::to_string(rep.from) + "-" + std::to_string(rep.to);
    for (const auto& f : rep.fixes)
      v += "  fix check: " + f.name + ": " + (f.fixes ? "fixes steps " + steps : "does not fix steps " + steps) + "\n";
    if (!rep.checks_note.empty()) v += "  fix checks: " + rep.checks_note + "\n";
  }
  if (rep.horizon) v += horizon_text(rep, *rep.horizon);
  v += detail::early_text(rep);
  const std::string ranks = rep.ranks > 1 ? ", " + std::to_string(rep.ranks) + " ranks per probe" : "";
  const std::string cut = rep.cut || rep.skipped ? ", " + std::to_string(rep.cut) + " cut short and " +
                                                       std::to_string(rep.skipped) + " not started by races"
                                                 : "";
  std::snprintf(buf, sizeof buf, "probes: %zu (%d run, %d cached%s; jobs %d%s), wall %.1f s\n", rep.probes.size(),
                rep.executed, rep.cached, cut.c_str(), rep.jobs, ranks.c_str(), rep.wall_s);
  v += buf;
  if (rep.predicted_probes > 0 || rep.measured_probes > 0) {
    std::snprintf(buf, sizeof buf, "cost: predicted %.1f recorded steps (%s model, %d probes)", rep.predicted_cost,
                  rep.cost_model.c_str(), rep.predicted_probes);
    v += buf;
    if (rep.measured_probes > 0) {
      std::snprintf(buf, sizeof buf, ", measured %.1f recorded steps (%d probes; recorded step %.3f s here)",
                    rep.measured_cost, rep.measured_probes, rep.recorded_step_s);
      v += buf;
    }
    if (rep.calibrated_cost > 0) {
      std::snprintf(buf, sizeof buf, "; calibrated here (the reference run's step %.2fx the recorded one), on the steps run %.1f",
                    rep.reference_step_ratio, rep.calibrated_cost);
      v += buf;
    }
    v += "\n";
  }
  return v;
}

}  // namespace detail

}  // namespace rwd::bisect
