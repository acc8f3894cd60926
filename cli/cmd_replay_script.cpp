// `rewind replay --cmd "python3 train.py ..."`: runs the user's script over the window
// (cli/script_window.h) and checks the steps it reports against the recording bit for bit
// (loss, grad norm, lr, parameter digest), or prints the curve under another plan.
#include "cli/replay_script.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/script_window.h"
#include "common/error.h"
#include "plan/plan.h"
#include "store/reader_pins.h"
#include "store/store.h"
#include "store/window_check.h"
#include "train/plan_schedule.h"

namespace rwd::cli {

namespace {

using nlohmann::json;

std::string describe(float v, uint32_t bits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(v), bits);
  return buf;
}

// What differs between a reported step and its record ("" when nothing does).
std::string mismatch(const ScriptStep& got, const store::StepRecord& rec) {
  if (got.loss_bits != rec.loss_bits)
    return "loss recorded " + describe(rec.loss(), rec.loss_bits) + " vs replayed " + describe(got.loss(), got.loss_bits);
  if (got.grad_norm_bits != rec.grad_norm_bits)
    return "grad norm recorded " + describe(rec.grad_norm(), rec.grad_norm_bits) + " vs replayed " +
           describe(got.grad_norm(), got.grad_norm_bits);
  if (got.lr != rec.lr) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "lr recorded %.17g vs replayed %.17g", rec.lr, got.lr);
    return buf;
  }
  if (rec.param_digest && *rec.param_digest != got.digest)
    return "parameter digest recorded " + *rec.param_digest + " vs replayed " + got.digest;
  return "";
}

}  // namespace

int replay_script(const ScriptReplayOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  store::Store st = store::Store::open(o.store, store::Mode::kReadOnly);
  const store::RunInfo run = find_run(st, o.run);
  if (!is_script_run(st, run.id))
    throw UsageError("replay: run " + std::to_string(run.id) + " was recorded by rewind train; replay it without --cmd");
  store::check_window(st, run.id, o.from, o.to);
  // `store thin` keeps the checkpoint the script reads while this replay runs.
  const store::ReaderPin pin(st.path(), run.id, {o.from}, "replay");
  if (!st.nearest_checkpoint(run.id, o.from))
    throw Error(ExitCode::kData, "missing checkpoint: no checkpoint at or before step " + std::to_string(o.from) +
                                     " in run " + std::to_string(run.id));
  ScriptWindowRequest req;
  req.cmd = o.cmd;
  req.store = o.store;
  req.run = run.id;
  req.from = o.from;
  req.to = o.to;
  bool plan_differs = false;
  if (o.plan) {
    // Checked here, before the script starts: against the model's layers and heads where the
    // recording says them, else only its syntax. The script is handed the plan of the window's
    // first step and of each recorded change inside it, with --plan on top.
    const auto [n_layer, n_head] = attention_shape(st, run);
    const train::PlanSchedule schedule = train::PlanSchedule::from_json(run.plan);
    std::vector<int64_t> points = {o.from};
    for (const auto& change : schedule.changes)
      if (change.first > o.from && change.first <= o.to) points.push_back(change.first);
    for (int64_t p : points) {
      const plan::Plan recorded = schedule.at(p, n_layer, n_head);
      const plan::Plan asked = plan::apply(recorded, *o.plan);
      plan_differs = plan_differs || asked != recorded;
      req.plans.emplace_back(p, asked.canonical());
    }
  }
  const ScriptWindow w = run_script_window(req);

  // The curve is printed (after the checks) where bits are not what is asked: under another
  // plan, or without --verify.
  std::string table = "    step           loss       recorded      grad norm       recorded\n";
  json curve = json::array();
  for (const ScriptStep& got : w.steps) {
    const int64_t s = got.step;
    const std::optional<store::StepRecord> rec = st.get_step(run.id, s);
    const double loss = got.loss(), norm = got.grad_norm();
    char row[96];
    std::snprintf(row, sizeof row, "%8lld %14.6f %14.6f %14.6f %14.6f\n", static_cast<long long>(s), loss,
                  rec ? static_cast<double>(rec->loss()) : NAN, norm, rec ? static_cast<double>(rec->grad_norm()) : NAN);
    table += row;
    auto number = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    curve.push_back({{"step", s}, {"loss", number(loss)}, {"grad_norm", number(norm)},
                     {"recorded_loss", rec ? number(rec->loss()) : json(nullptr)},
                     {"recorded_grad_norm", rec ? number(rec->grad_norm()) : json(nullptr)}});
    // Steps before FROM ran under the recorded plan: they must match even with --plan.
    if (o.verify && rec && (!plan_differs || s < o.from)) {
      const std::string why = mismatch(got, *rec);
      if (!why.empty()) throw Error(ExitCode::kFinding, "replay diverged at step " + std::to_string(s) + ": " + why);
    }
  }
  if (plan_differs || !o.verify) std::fputs(table.c_str(), stdout);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("replayed steps %lld..%lld of run %lld (a Python script) from checkpoint %lld in %.2f s\n",
              static_cast<long long>(o.from), static_cast<long long>(o.to), static_cast<long long>(run.id),
              static_cast<long long>(w.start), seconds);
  if (plan_differs) std::printf("plan from step %lld: %s (differs from the recording)\n",
                                static_cast<long long>(o.from), o.plan->c_str());
  else if (o.verify)
    std::printf("verified: every step from %lld to %lld is bitwise identical to the recording "
                "(loss, grad norm, lr, parameter digest)\n", static_cast<long long>(w.start), static_cast<long long>(o.to));
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) throw Error(ExitCode::kData, "cannot write '" + o.json + "'");
    out << json{{"run", run.id}, {"from", o.from}, {"to", o.to}, {"plan", o.plan.value_or("")}, {"steps", curve}}.dump(1) << "\n";
  }
  return 0;
}

}  // namespace rwd::cli
