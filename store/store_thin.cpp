// Checkpoint retention applied to a store: which checkpoints a rule keeps, what
// stored bisect probes pin, the deletion of the others with the blobs nothing else refers to
// (one transaction), and giving the freed pages back to the file system. Checkpoints a running
// reader has pinned (reader_pins.h) are kept, force or not.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "store/reader_pins.h"
#include "store/store.h"

namespace rwd::store {
namespace {

// floor(a / b) for b > 0, also for negative a.
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && (a < 0)); }

// The step FROM of a window "FROM:TO"; false for anything else.
bool window_from(const std::string& window, int64_t& from) {
  const size_t colon = window.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  char* end = nullptr;
  const std::string head = window.substr(0, colon);
  from = std::strtoll(head.c_str(), &end, 10);
  return end && *end == '\0';
}

// The largest of `steps` (ascending) at or before `step`, or -1 when none is.
int64_t at_or_before(const std::vector<int64_t>& steps, int64_t step) {
  auto it = std::upper_bound(steps.begin(), steps.end(), step);
  return it == steps.begin() ? -1 : *(it - 1);
}

// The checkpoint steps of `plan.remove` as a JSON array, bound for json_each.
std::string json_steps(const std::vector<int64_t>& steps) {
  std::string s = "[";
  for (size_t i = 0; i < steps.size(); ++i) s += (i ? "," : "") + std::to_string(steps[i]);
  return s + "]";
}

// Blobs referred to by the removed checkpoints and by no other row (?1 run, ?2 the steps).
constexpr const char* kOrphans =
    "SELECT hash, raw_size, stored_size FROM blobs WHERE hash IN "
    "(SELECT blob FROM checkpoints WHERE run=?1 AND step IN (SELECT value FROM json_each(?2))) "
    "AND hash NOT IN (SELECT blob FROM checkpoints WHERE "
    "  NOT (run=?1 AND step IN (SELECT value FROM json_each(?2)))) "
    "AND hash NOT IN (SELECT blob FROM tensors) "
    "AND hash NOT IN (SELECT batch_ref FROM steps WHERE batch_ref IS NOT NULL) "
    "AND hash NOT IN (SELECT rng_ref FROM steps WHERE rng_ref IS NOT NULL) ORDER BY hash";

}  // namespace

std::string Retention::text() const {
  std::string s;
  if (keep_last > 0) s += "--keep-last " + std::to_string(keep_last);
  if (keep_every > 0) s += std::string(s.empty() ? "" : " ") + "--keep-every " + std::to_string(keep_every);
  return s;
}

std::vector<int64_t> retained_steps(const std::vector<int64_t>& steps, const Retention& rule) {
  if (!rule.active() || steps.size() <= 2) return steps;
  const size_t n = steps.size();
  const size_t last = static_cast<size_t>(std::clamp<int64_t>(rule.keep_last, 1, static_cast<int64_t>(n)));
  std::vector<int64_t> keep;
  bool have_span = false;
  int64_t span = 0;  // the keep_every span of the last checkpoint looked at
  for (size_t i = 0; i < n; ++i) {
    bool k = i == 0 || i >= n - last;
    if (rule.keep_every > 0) {
      const int64_t sp = floor_div(steps[i], rule.keep_every);
      if (!have_span || sp != span) k = true;  // the first checkpoint of its span
      have_span = true;
      span = sp;
    }
    if (k) keep.push_back(steps[i]);
  }
  return keep;
}

std::vector<std::pair<int64_t, std::string>> Store::checkpoint_pins(int64_t run,
                                                                    const std::vector<int64_t>& steps) {
  // Windows of the probe cache (a probe's job names its run through kv 'bisect/job/JOB'; one
  // whose job is not there may be any run's, so it pins in every run) and of the bisect logs.
  std::vector<std::pair<std::string, std::string>> windows;  // (window, job)
  {
    Statement st(db_,
                 "SELECT p.window, p.job FROM probes p WHERE "
                 "?1 IN (SELECT run FROM kv WHERE key = 'bisect/job/' || p.job) OR "
                 "NOT EXISTS (SELECT 1 FROM kv WHERE key = 'bisect/job/' || p.job) ORDER BY p.window");
    st.bind(1, run);
    while (st.step()) windows.emplace_back(st.col_text(0), st.col_text(1));
  }
  {
    Statement st(db_,
                 "SELECT json_extract(e.value, '$.window'), substr(k.key, 12) FROM kv k, json_each(k.value) e "
                 "WHERE k.run=?1 AND substr(k.key, 1, 11) = 'bisect/log/' AND json_valid(k.value) "
                 "AND json_type(k.value) = 'array' AND e.type = 'object' "
                 "AND json_type(e.value, '$.window') = 'text'");
    st.bind(1, run);
    while (st.step()) windows.emplace_back(st.col_text(0), st.col_text(1));
  }
  std::map<int64_t, std::string> pins;  // checkpoint step -> the first reason found
  for (const auto& [window, job] : windows) {
    int64_t from = 0;
    if (!window_from(window, from)) continue;
    const int64_t c = at_or_before(steps, from);
    if (c >= 0) pins.emplace(c, "bisect probe window " + window + " (job " + job + ")");
  }
  return {pins.begin(), pins.end()};
}

ThinPlan Store::plan_thin(int64_t run, const ThinRules& rules) {
  ThinPlan plan;
  plan.run = run;
  plan.checkpoints = checkpoint_steps(run);
  const std::vector<int64_t> kept = retained_steps(plan.checkpoints, rules.rule);
  const std::set<int64_t> keep(kept.begin(), kept.end());
  std::map<int64_t, std::string> pinned;
  for (int64_t s : rules.keep_steps) {
    const int64_t c = at_or_before(plan.checkpoints, s);
    if (c >= 0) pinned.emplace(c, "--keep-steps " + std::to_string(s));
  }
  if (!rules.force) {
    for (auto& [step, why] : checkpoint_pins(run, plan.checkpoints)) pinned.emplace(step, std::move(why));
  }
  const std::map<int64_t, std::string> in_use = reader_pins(path(), run, plan.checkpoints);
  for (int64_t s : plan.checkpoints) {
    if (keep.count(s)) continue;
    if (auto use = in_use.find(s); use != in_use.end()) {
      plan.in_use.push_back(*use);
      continue;
    }
    auto pin = pinned.find(s);
    if (pin != pinned.end()) {
      plan.pinned.push_back(*pin);
    } else {
      plan.remove.push_back(s);
    }
  }
  if (plan.remove.empty()) return plan;
  Statement st(db_, kOrphans);
  st.bind(1, run).bind(2, json_steps(plan.remove));
  while (st.step()) {
    ++plan.n_blobs;
    plan.raw_bytes += st.col_int(1);
    plan.stored_bytes += st.col_int(2);
  }
  return plan;
}

ThinPlan Store::thin(int64_t run, const ThinRules& rules) {
  require_writable("thinning checkpoints");
  // Planned and deleted in one write transaction: nothing can refer to a blob in between, and
  // a kill leaves the store as it was or thinned, never half. A reader writes its pin under a
  // shared lock on the pins: held here until the commit, a pin is seen or comes after it.
  const ReadersLock readers(path());
  ThinPlan plan;
  in_transaction(db_, [&] {
    plan = plan_thin(run, rules);
    if (plan.remove.empty()) return;
    const std::string steps = json_steps(plan.remove);
    std::vector<std::string> orphans;
    {
      Statement st(db_, kOrphans);
      st.bind(1, run).bind(2, steps);
      while (st.step()) orphans.push_back(st.col_text(0));
    }
    Statement rows(db_, "DELETE FROM checkpoints WHERE run=?1 AND step IN (SELECT value FROM json_each(?2))");
    rows.bind(1, run).bind(2, steps);
    rows.run();
    Statement chunks(db_, "DELETE FROM blob_chunks WHERE hash=?");
    Statement blobs(db_, "DELETE FROM blobs WHERE hash=?");
    for (const std::string& h : orphans) {
      chunks.reset();
      chunks.bind(1, h).run();
      blobs.reset();
      blobs.bind(1, h).run();
    }
  });
  return plan;
}

int64_t Store::free_bytes() {
  return db_.query_int("PRAGMA freelist_count", "reading the free page count") *
         db_.query_int("PRAGMA page_size", "reading the page size");
}

bool Store::incremental_vacuum() {
  return db_.query_int("PRAGMA auto_vacuum", "reading the auto-vacuum mode") == 2;
}

bool Store::reclaim_space() {
  require_writable("giving free pages back");
  const bool vacuum = !incremental_vacuum();
  if (!vacuum) {
    db_.exec("PRAGMA incremental_vacuum", "giving free pages back (incremental vacuum)");
  } else {
    // A store made before rewind created them with incremental auto-vacuum: one VACUUM
    // rewrites it without the free pages and switches it over, so later thins are incremental.
    db_.exec("PRAGMA auto_vacuum=INCREMENTAL", "switching to incremental auto-vacuum");
    db_.exec("VACUUM", "rewriting the store without its free pages (VACUUM)");
  }
  // Everything into the main file (truncated to its pages) and the WAL emptied, so the file
  // sizes say what was given back. BUSY (a reader still needs frames) leaves the WAL for later.
  sqlite3_exec(db_.get(), "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  return vacuum;
}

}  // namespace rwd::store
