// The state a bisect's phases share (the store, run, predicate, probe pool and report) and the
// phases' entry points: private to bisect/ (driver, narrowing, time search, hold, verdict text);
// callers outside bisect/ go through run_bisect (driver.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bisect/driver.h"

namespace rwd::bisect {

namespace detail {

// Shared by the narrowing and the time search: the store, run, predicate, pool and report.
struct Context {
  store::Store& store;
  train::RunSpec run;
  Predicate pred;
  ProbePool pool;
  BisectReport& report;
  std::string job;
  bool progress = true;
  int estimate = 0;
  double t0 = 0;
  std::string phase;
  std::shared_ptr<Progress> line;  // the progress line (recreated if the estimate grows)
  std::string reference = kFullPrecision;  // BisectOptions::reference, given to every probe
  std::string job_text;
  bool started = false;
  // Writes the job's description and an empty probe log into the store, once: called when
  // the first batch of probes is back, so that a bisect whose first probe fails (a script that
  // cannot replay the window) leaves the store as it was.
  void start();

  // Runs a batch in the current phase; appends to the report and the job's log.
  std::vector<ProbeOutcome> probe(const std::vector<ProbeSpec>& batch, int stop_after_fails = 0);
  ProbeSpec make(int64_t from, int64_t to, const std::string& kind) const;
};

// The near miss of the recorded steps [from, to] (history: every recorded step before them).
NearMiss recorded_near_miss(Context& ctx, int64_t from, int64_t to);

// bisect/narrow.cpp: the steady clock in seconds; what a window's narrowing searches; the report
// so far handed to BisectOptions::on_interim with what is still to run; the narrowing of
// [from, to] (search, fix checks) into ctx.report; a window widened when its recorded-plan
// replay passes (nullopt: nothing left to widen to).
double now_s();
SearchSpace searched_space(const train::RunSpec& run, const BisectOptions& o, int64_t from, int64_t to);
void interim(Context& ctx, const BisectOptions& o, const std::string& pending);
void narrow_window(Context& ctx, const BisectOptions& o, int64_t from, int64_t to);
std::optional<std::pair<int64_t, int64_t>> widen(Context& ctx, std::pair<int64_t, int64_t> w,
                                                 std::pair<int64_t, int64_t> range);

// Fills report.time; returns true when a window [c*, F] was found (with --hold: [the point of
// no return, F + N], the horizon in report.horizon).
bool find_window(Context& ctx, const BisectOptions& o);

// --hold's time search: the point of no return among t.checkpoints (bisect/hold.cpp).
void find_point_of_no_return(Context& ctx, const BisectOptions& o, TimeSearch& t, int64_t horizon);

// The last step a probe from the window may train to: `to`, unless the probes cannot train
// past the recording (`why` then says so).
int64_t horizon_end(Context& ctx, const BisectOptions& o, int64_t to, std::string& why);

// After a window-local narrowing: the fixing set and the reference trained on from the
// window's start through the hold check's horizon (report.horizon).
void hold_check(Context& ctx, const BisectOptions& o);

// With --hold, after the narrowing: the branches and the claim of report.horizon.
void describe_horizon(Context& ctx, const BisectOptions& o);

// --early-band: the reference branch's indicator curve over [from, to] ("" when not probed yet),
// given to a probe of that window; and the indicator's calls counted (report.early).
void attach_band(Context& ctx, const BisectOptions& o, ProbeSpec& p);
void account_early(Context& ctx, const BisectOptions& o);
std::string early_text(const BisectReport& rep);

// The verdict's human text, and the separator join it uses (bisect/verdict.cpp).
std::string verdict_text(const BisectReport& rep);
std::string join(const std::vector<std::string>& v, const std::string& sep);

}  // namespace detail

}  // namespace rwd::bisect
