// The bisect reports and jobs of a run page (cli/run_page_reports.h).
#include "cli/run_page_reports.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"

namespace rwd::cli {

namespace {

namespace fs = std::filesystem;

int64_t step_or(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : -1;
}

// The horizon of a report, read leniently: a field that is missing or of the wrong type is
// left out (the page shows what it can read; `rewind bisect` wrote it).
void read_horizon(const nlohmann::json& j, FoundReport& r) {
  if (!j.contains("horizon") || !j["horizon"].is_object()) return;
  const nlohmann::json& h = j["horizon"];
  r.claim = h.value("claim", "");
  r.from = step_or(h, "from");
  r.to = step_or(h, "to");
  r.fail_step = step_or(h, "fail_step");
  r.no_return = step_or(h, "point_of_no_return");
  const nlohmann::json& probes = j.contains("probes") && j["probes"].is_array() ? j["probes"] : nlohmann::json::array();
  if (!h.contains("branches") || !h["branches"].is_array()) return;
  for (const auto& b : h["branches"]) {
    if (!b.is_object()) continue;
    Branch x;
    x.name = b.value("name", "");
    x.label = b.value("label", "");
    x.held = b.value("held", false);
    x.broke_at = step_or(b, "broke_at");
    const int64_t i = step_or(b, "probe");
    if (i >= 0 && i < static_cast<int64_t>(probes.size()) && probes[i].is_object()) {
      const nlohmann::json& p = probes[i];
      const int64_t first = p.contains("window") && p["window"].is_array() && !p["window"].empty() &&
                                    p["window"][0].is_number_integer() ? p["window"][0].get<int64_t>() : r.from;
      if (p.contains("grad_norm") && p["grad_norm"].is_array())
        for (size_t k = 0; k < p["grad_norm"].size(); ++k) {
          x.grad_norm.steps.push_back(first + static_cast<int64_t>(k));
          x.grad_norm.values.push_back(p["grad_norm"][k].is_number() ? p["grad_norm"][k].get<double>() : NAN);
        }
    }
    r.branches.push_back(x);
  }
}

}  // namespace

std::string horizon_chart(const FoundReport& r, const Curve& recorded) {
  if (r.branches.empty() || r.from < 0 || r.to < r.from) return "";
  LineChart c;
  c.title = "gradient norm of the bisect's branches from step " + std::to_string(r.from) + " to " + std::to_string(r.to);
  c.desc = r.claim;
  c.y_label = "grad norm";
  c.log_y = true;
  c.color = "#000";
  for (size_t i = 0; i < recorded.steps.size(); ++i)
    if (recorded.steps[i] >= r.from && recorded.steps[i] <= r.to) {
      c.curve.steps.push_back(recorded.steps[i]);
      c.curve.values.push_back(recorded.values[i]);
    }
  std::string key = "<span>black: the recording</span>";
  std::vector<Branch> order = r.branches;  // the tried sets first, under the named branches
  std::stable_partition(order.begin(), order.end(), [](const Branch& b) { return b.name == "tried"; });
  for (const auto& b : order) {
    const bool tried = b.name == "tried";
    // Dark enough for text on white (the key names each branch in its colour).
    const char* color = b.name == "recorded plan" ? "#c0392b" : b.name == "reference" ? "#1f5f9e"
                        : b.name == "fixing set" ? "#1e7b1e" : tried ? "#b0b0b0" : "#6f42a6";
    const char* dash = b.name == "recorded plan" ? "7,4" : b.name == "reference" ? "2,2" : tried || b.name == "fixing set" ? "" : "4,2,1,2";
    c.extra.push_back({b.grad_norm, color, dash});
    if (tried) continue;
    key += "; <span style='color:" + std::string(color) + "'>" + html_escape(b.name) + "</span> <code>" +
           html_escape(b.label) + "</code>: " +
           (b.held ? "held through step " + std::to_string(r.to)
                   : b.broke_at >= 0 ? "broke at step " + std::to_string(b.broke_at) : "broke");
  }
  if (std::any_of(r.branches.begin(), r.branches.end(), [](const Branch& b) { return b.name == "tried"; }))
    key += "; grey: other tried sets";
  if (r.no_return >= 0) c.marks.push_back({r.no_return, "no return after " + std::to_string(r.no_return)});
  if (r.fail_step >= 0) c.marks.push_back({r.fail_step, "F"});
  c.marks.push_back({r.to, "horizon"});
  return "<figure><figcaption>Past the window: the bisect's branches</figcaption>" + line_chart_svg(c) +
         "</figure>\n<p class='key'>" + key + ".</p>\n";
}

std::vector<FoundReport> find_reports(const RunPageRequest& req, int64_t run) {
  std::vector<fs::path> candidates;
  for (const auto& r : req.reports) {
    fs::path p(r);
    if (p.filename() == "report.html" || p.filename() == "report.json") p = p.parent_path();
    if (!fs::exists(p / "report.json")) throw UsageError("view: --report " + r + ": no report.json there");
    candidates.push_back(p);
  }
  const size_t named = candidates.size();
  std::error_code ec;
  fs::path dir = fs::path(req.store_arg).parent_path();
  if (dir.empty()) dir = ".";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && fs::exists(it->path() / "report.json", ec)) candidates.push_back(it->path());
  if (fs::exists(dir / "report.json", ec)) candidates.push_back(dir);
  const fs::path out_dir = fs::absolute(fs::path(req.out_path)).parent_path();
  std::vector<FoundReport> out;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::ifstream f(candidates[i] / "report.json");
    nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    const bool ours = j.is_object() && j.value("format", "") == "rewind-bisect-report-v1" &&
                      j.value("run", int64_t(-1)) == run;
    if (i < named && !ours) throw UsageError("view: --report " + req.reports[i] + " is not a bisect report of run " + std::to_string(run));
    if (!ours) continue;
    FoundReport r;
    r.path = fs::weakly_canonical(fs::absolute(candidates[i] / "report.html")).string();
    if (std::any_of(out.begin(), out.end(), [&](const FoundReport& o) { return o.path == r.path; })) continue;
    r.href = fs::relative(r.path, fs::weakly_canonical(out_dir), ec).generic_string();
    if (ec || r.href.empty()) r.href = r.path;
    r.verdict = j.value("verdict_text", "");
    r.matched = i < named;  // named ones are always shown; found ones only when their verdict is stored
    read_horizon(j, r);
    out.push_back(r);
  }
  return out;
}

std::vector<BisectJob> bisect_jobs(store::Store& s, int64_t run, std::vector<FoundReport>& reports) {
  std::vector<BisectJob> jobs;
  for (const auto& key : s.kv_keys(run, "bisect/job/")) {
    BisectJob j;
    j.id = key.substr(std::string("bisect/job/").size());
    j.what = s.get_kv(run, key).value_or("");
    j.verdict = s.get_kv(run, "bisect/verdict/" + j.id).value_or("");
    nlohmann::json log = nlohmann::json::parse(s.get_kv(run, "bisect/log/" + j.id).value_or("[]"), nullptr, false);
    j.probes = log.is_array() ? log.size() : 0;
    for (auto& r : reports)
      if (!j.verdict.empty() && r.verdict == j.verdict) {
        j.report_href = r.href;
        r.matched = true;
      }
    jobs.push_back(j);
  }
  return jobs;
}

}  // namespace rwd::cli
