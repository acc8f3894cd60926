// The bisect reports and jobs a run page shows: report folders found beside the store (their
// verdict, claim and horizon read leniently from report.json) and the bisect jobs the store
// holds, each linked to the report that carries its verdict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/run_page.h"

namespace rwd::cli {

struct BisectJob {
  std::string id, what, verdict;
  size_t probes = 0;
  std::string report_href;  // relative to the page; "" when no report was found
};

// A bisect report's horizon (report.json "horizon"): the claim and the branches it rests on.
struct Branch {
  std::string name, label;
  bool held = false;
  int64_t broke_at = -1;
  Curve grad_norm;
};
struct FoundReport {
  std::string href, verdict, path;
  bool matched = false;
  std::string claim;
  int64_t from = -1, to = -1, fail_step = -1, no_return = -1;
  std::vector<Branch> branches;
};

// Bisect report folders: those named with --report, and any report.json in the store's folder
// or one level below it that belongs to this run.
std::vector<FoundReport> find_reports(const RunPageRequest& req, int64_t run);
// The bisect jobs of `run`, each matched with the report whose verdict it wrote (marking it).
std::vector<BisectJob> bisect_jobs(store::Store& s, int64_t run, std::vector<FoundReport>& reports);
// The branches of a report's horizon on one chart, over the recorded gradient norm.
std::string horizon_chart(const FoundReport& r, const Curve& recorded);

}  // namespace rwd::cli
