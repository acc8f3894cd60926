// report.html's narrowing tree: nested lists, every probe under the probe whose set it was split
// from (ProbeEntry::parent), so that it wraps to any width; verdicts by symbol and word as well
// as colour. Time probes and fix checks, which split no set, are lists of their own.
#include <map>
#include <set>

#include "bisect/report_html.h"

namespace rwd::bisect::html {

namespace {

std::string node(const ProbeEntry& p, bool show_window) {
  const bool fails = p.outcome.fails;
  std::string meta = p.phase;
  if (show_window) meta += ", window " + std::to_string(p.spec.from) + ":" + std::to_string(p.spec.to);
  if (p.outcome.cached) meta += ", cached";
  if (p.outcome.stopped_at >= 0) meta += ", stopped at " + std::to_string(p.outcome.stopped_at);
  const char* verdict = p.outcome.cut ? "cut'>\u2013 cut short" : fails ? "fail'>\u2717 fails" : "pass'>\u2713 passes";
  return std::string("<span class='v ") + verdict + "</span> <b>#" +
         std::to_string(p.index) + "</b> <code>" + esc(p.spec.label()) + "</code> <span class='meta'>" + esc(meta) +
         "</span>";
}

struct Tree {
  const BisectReport& r;
  std::map<int, std::vector<int>> children;
  bool show_window = false;

  std::string list(const std::vector<int>& items) const {
    if (items.empty()) return "";
    std::string s = "<ul>";
    for (int i : items) {
      s += "<li>" + node(r.probes[i], show_window);
      auto it = children.find(i);
      if (it != children.end()) s += list(it->second);
      s += "</li>";
    }
    return s + "</ul>\n";
  }
};

}  // namespace

std::string tree(const BisectReport& r) {
  Tree t{r, {}, false};
  std::vector<int> time_roots, narrowing_roots, fix_roots;
  std::set<std::pair<int64_t, int64_t>> windows;
  for (const auto& p : r.probes) {
    if (p.phase == "time") time_roots.push_back(p.index);
    else if (p.phase == "fix") fix_roots.push_back(p.index);
    else if (p.parent >= 0 && p.parent < p.index) t.children[p.parent].push_back(p.index);
    else narrowing_roots.push_back(p.index);
    if (p.phase != "time") windows.insert({p.spec.from, p.spec.to});
  }
  t.show_window = windows.size() > 1;
  std::string s;
  if (!time_roots.empty()) {
    Tree linear{r, {}, true};
    s += "<h3>Time search</h3>\n<p class='note'>Each probe replays from a checkpoint to the failure step under the fix "
         "plan; the next one halves the checkpoints left.</p>\n<div class='tree'>" + linear.list(time_roots) + "</div>\n";
  }
  if (!narrowing_roots.empty()) {
    s += "<h3>Layer/head/op search</h3>\n<p class='note'>A probe's set S (<code>low{S}</code>: S kept low, the rest "
         "at the reference; <code>fp32{S}</code>: S promoted, the rest as recorded) is split into the probes listed "
         "under it; a part not probed (its verdict followed from its sibling's) is split under the nearest probe "
         "that holds it. The root is the recorded plan's run <code>fp32{}</code>, where the whole space is low."
         "</p>\n<div class='tree'>" +
         t.list(narrowing_roots) + "</div>\n";
  }
  if (!fix_roots.empty()) {
    Tree flat{r, {}, t.show_window};
    s += "<h3>Fix checks</h3>\n<div class='tree'>" + flat.list(fix_roots) + "</div>\n";
  }
  return s;
}

}  // namespace rwd::bisect::html
