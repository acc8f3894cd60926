// The run page of `rewind view`: what the store holds about one run (steps, checkpoints, plan
// schedule, per-head monitors, bisect jobs) gathered without LibTorch and laid out as one
// self-contained HTML file: the headline facts and the curves first, commands to copy, heatmaps.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/run_page.h"
#include "cli/run_page_reports.h"
#include "common/error.h"
#include "cli/script_window.h"
#include "train/config.h"
#include "train/plan_schedule.h"
#include "train/run_meta.h"

namespace rwd::cli {

namespace {

namespace fs = std::filesystem;

// The per-head monitors the trainer records (train/recorder.cpp), in the order they are shown,
// with what each one measures.
const std::pair<const char*, const char*> kMonitors[] = {
    {"max_logit", "the largest attention logit S of the head"},
    {"repmax_rate", "the fraction of query rows whose row maximum repeats (ties)"},
    {"pbar_one", "entries with BF16(exp(S - m)) == 1 beyond the first of their row, per step"},
    {"wq_sn", "the spectral norm of the head's W_Q slice"},
};

// A store path as a shell word: bare when it is only safe characters, else single-quoted.
std::string shell_word(const std::string& s) {
  bool safe = !s.empty();
  for (char c : s) safe = safe && (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./-+:=,@%", c));
  if (safe) return s;
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

// "L<l>.H<h>.<name>" -> (l, h, name); false for every other key.
bool parse_head_key(const std::string& key, int& l, int& h, std::string& name) {
  int used = 0;
  if (std::sscanf(key.c_str(), "L%d.H%d.%n", &l, &h, &used) != 2 || used == 0) return false;
  name = key.substr(used);
  return l >= 0 && h >= 0 && !name.empty();
}

// The line of a bisect verdict a reader wants first: "verdict: ..." (where), else the causal
// window of a time search, else its first line.
std::string verdict_line(const std::string& v) {
  std::istringstream in(v);
  std::string line, first, window;
  while (std::getline(in, line)) {
    if (first.empty()) first = line;
    if (line.rfind("verdict:", 0) == 0) return line;
    if (line.find("causal window") != std::string::npos) window = line;
  }
  return window.empty() ? first : window;
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Layer x head grids of every monitor at `step`.
std::map<std::string, HeadGrid> grids_at(store::Store& s, int64_t run, int64_t step, int n_layer, int n_head) {
  std::map<std::string, HeadGrid> out;
  for (const auto& m : s.metrics(run, step, step, "L")) {
    int l = 0, h = 0;
    std::string name;
    if (!parse_head_key(m.key, l, h, name) || l >= n_layer || h >= n_head) continue;
    HeadGrid& g = out[name];
    if (g.values.empty()) g.values.assign(n_layer, std::vector<double>(n_head, NAN));
    g.step = step;
    g.values[l][h] = m.value;
  }
  return out;
}

// "L1.H2 is highest at step K: 12.3, 3.1x the mean of the other 7 heads".
std::string hot_head(const std::string& monitor, const HeadGrid& g) {
  int bl = -1, bh = -1;
  double sum = 0;
  int n = 0;
  for (size_t l = 0; l < g.values.size(); ++l)
    for (size_t h = 0; h < g.values[l].size(); ++h) {
      const double v = g.values[l][h];
      if (!std::isfinite(v)) continue;
      sum += v, ++n;
      if (bl < 0 || v > g.values[bl][bh]) bl = static_cast<int>(l), bh = static_cast<int>(h);
    }
  if (bl < 0) return "no finite " + monitor + " at step " + std::to_string(g.step) + ".";
  const double top = g.values[bl][bh];
  std::string s = "At step " + std::to_string(g.step) + " L" + std::to_string(bl) + ".H" + std::to_string(bh) +
                  " is highest: " + short_num(top);
  if (n > 1) {
    const double rest = (sum - top) / (n - 1);
    if (rest > 0) s += ", " + short_num(top / rest) + "x the mean of the other " + std::to_string(n - 1) + " heads";
  }
  return s + ".";
}

const char* kStyle =
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1a1a1a;background:#fff;line-height:1.45}"
    "main{max-width:1160px;margin:0 auto;padding:12px 14px}h1{font-size:1.45em;margin:.3em 0}h2{font-size:1.2em;margin-top:1.4em}"
    "h3{font-size:1.05em;margin:1em 0 .3em}.facts{padding-left:1.2em}figure{margin:0;min-width:0}figcaption{font-weight:600;margin:.2em 0}"
    ".charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,500px),1fr));gap:10px 18px}"
    "svg{max-width:100%;height:auto;display:block}svg.chart{width:100%}"
    ".heats{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}"
    "pre{background:#f3f3f3;padding:8px 10px;white-space:pre-wrap;overflow-wrap:anywhere;font-size:.9em}"
    "code{overflow-wrap:anywhere}.scroll{overflow-x:auto;max-width:100%}"
    "table{border-collapse:collapse}td,th{border:1px solid #b5b5b5;padding:3px 8px;text-align:left;vertical-align:top}"
    ".key{font-size:.92em}.ck{color:#6a3d9a;font-weight:bold}.pc{color:#9c4d00;font-weight:bold}.nf{color:#b03a2e;font-weight:bold}"
    ".claim{border-left:4px solid #2d6a2d;padding:6px 10px;background:#f2f8f2}a{color:#0b57b5}";

}  // namespace

std::string run_page_html(store::Store& s, const RunPageRequest& req) {
  std::optional<store::RunInfo> info;
  if (req.run == 0) {
    auto runs = s.runs();
    if (runs.empty()) throw Error(ExitCode::kData, "store '" + req.store_arg + "' holds no recorded run");
    info = runs.back();
  } else {
    info = s.run(req.run);
    if (!info) throw UsageError("store '" + req.store_arg + "' has no run " + std::to_string(req.run));
  }
  const int64_t run = info->id;
  // A script's run (rewind.record) keeps the script's own config: what rewind's Config can
  // say of it, not from_json, which refuses keys that are not rewind train's.
  const train::Config cfg = is_script_run(s, info->id) ? script_config(s, *info) : train::Config::from_json(info->config);
  const train::PlanSchedule plan = train::PlanSchedule::from_json(info->plan);
  const train::RunMeta meta = train::RunMeta::parse(info->meta);
  const std::string S = shell_word(req.store_arg);
  // A script's run replays and bisects through its command (`--cmd`): the command line the
  // recording kept (rewind.record's meta "script", sys.argv), under torchrun for several ranks.
  std::string cmd_opt;
  if (is_script_run(s, info->id)) {
    const nlohmann::json m = nlohmann::json::parse(info->meta, nullptr, false);
    std::string line;
    if (m.is_object() && m.contains("script") && m["script"].is_array())
      for (const auto& w : m["script"])
        if (w.is_string()) line += " " + shell_word(w.get<std::string>());
    if (line.empty()) line = " train.py";
    const std::string python = m.is_object() && m.value("executable", "") != "" ? m.value("executable", "") : "python3";
    const std::string launcher =
        meta.world_size > 1 ? "torchrun --nproc_per_node " + std::to_string(meta.world_size) : shell_word(python);
    cmd_opt = " --cmd " + shell_word(launcher + line);
  }

  Curve loss, gnorm, lr;
  if (auto range = s.step_range(run))
    for (const auto& st : s.steps(run, range->first, range->second)) {
      for (Curve* c : {&loss, &gnorm, &lr}) c->steps.push_back(st.step);
      loss.values.push_back(st.loss());
      gnorm.values.push_back(st.grad_norm());
      lr.values.push_back(st.lr);
    }
  const std::vector<int64_t> ckpts = s.checkpoint_steps(run);
  const size_t n = loss.steps.size();
  const int64_t first = n ? loss.steps.front() : 0, last = n ? loss.steps.back() : 0;

  // Headline facts.
  int64_t peak = -1, first_bad = -1, first_jump = -1;
  double peak_v = -1, min_loss = INFINITY;
  int64_t min_loss_step = -1;
  const double gmed = median(gnorm.values);
  for (size_t i = 0; i < n; ++i) {
    const double g = gnorm.values[i], l = loss.values[i];
    if (std::isfinite(g) && g > peak_v) peak_v = g, peak = gnorm.steps[i];
    if (first_bad < 0 && (!std::isfinite(l) || !std::isfinite(g))) first_bad = loss.steps[i];
    if (first_jump < 0 && std::isfinite(g) && g > 10 * gmed) first_jump = gnorm.steps[i];
    if (std::isfinite(l) && l < min_loss) min_loss = l, min_loss_step = loss.steps[i];
  }
  std::vector<FoundReport> reports = find_reports(req, run);
  const std::vector<BisectJob> jobs = bisect_jobs(s, run, reports);

  std::string h = "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
                  "<meta name='viewport' content='width=device-width, initial-scale=1'>"
                  "<title>rewind run " + std::to_string(run) + " · " + html_escape(req.store_arg) + "</title>\n<style>" +
                  kStyle + "</style></head><body><main>\n";
  h += "<h1>rewind run " + std::to_string(run) + "</h1>\n<p>store <code>" + html_escape(req.store_arg) + "</code>, " +
       std::to_string(cfg.n_layer) + " layers x " + std::to_string(cfg.n_head) + " heads, width " +
       std::to_string(cfg.n_embd) + ", sequence " + std::to_string(cfg.block_size) + ", batch " +
       std::to_string(cfg.batch_size) + "x" + std::to_string(cfg.gradient_accumulation_steps) + ", on " +
       html_escape(meta.device) + (meta.world_size > 1 ? " x " + std::to_string(meta.world_size) + " ranks" : "") +
       (is_script_run(s, info->id) ? ", recorded by a Python script (rewind.record)"
                              : ", recorded by rewind " + html_escape(meta.recorded_rewind)) +
       " (" + html_escape(info->created) + ")</p>\n";
  for (const auto& r : reports)
    if (r.matched && !r.claim.empty())
      h += "<p class='claim'><strong>Bisect claim.</strong> " + html_escape(r.claim) + " <a href='" + html_escape(r.href) +
           "'>report</a></p>\n";
  h += "<ul class='facts'>\n";
  if (!n) {
    h += "<li>No step recorded yet.</li>\n";
  } else {
    h += "<li>" + std::to_string(n) + " steps recorded (" + std::to_string(first) + ".." + std::to_string(last) +
         "); loss " + short_num(loss.values.front()) + " at step " + std::to_string(first) + ", " +
         short_num(loss.values.back()) + " at step " + std::to_string(last) +
         (min_loss_step >= 0 ? ", lowest " + short_num(min_loss) + " at step " + std::to_string(min_loss_step) : "") +
         ".</li>\n";
    if (peak >= 0)
      h += "<li>Gradient norm peaks at " + short_num(peak_v) + " at step " + std::to_string(peak) + " (median " +
           short_num(gmed) + ")" +
           (first_jump >= 0 ? "; first above 10x the median at step " + std::to_string(first_jump) : "") + ".</li>\n";
    h += first_bad >= 0 ? "<li><span class='nf'>First non-finite loss or gradient norm at step " + std::to_string(first_bad) + ".</span></li>\n"
                        : "<li>Loss and gradient norm are finite at every step.</li>\n";
  }
  h += "<li>" + std::to_string(ckpts.size()) + " checkpoints; plan " +
       (plan.base.empty() ? std::string("as default (BF16 everywhere)") : "<code>" + html_escape(plan.base) + "</code>") +
       (plan.changes.empty() ? "" : ", " + std::to_string(plan.changes.size()) + " plan change(s)") + ".</li>\n";
  for (const auto& j : jobs)
    h += "<li>Bisect " + html_escape(j.id) + ": " + html_escape(verdict_line(j.verdict.empty() ? "(did not finish)" : j.verdict)) +
         (j.report_href.empty() ? "" : " <a href='" + html_escape(j.report_href) + "'>report</a>") + "</li>\n";
  h += "</ul>\n";

  // Curves.
  h += "<h2>Curves</h2>\n<p class='key'><span class='ck'>|</span> purple ticks: checkpoints; "
       "<span class='pc'>- -</span> dashed orange lines: plan changes; <span class='nf'>red band</span>: "
       "non-finite steps. Long runs are drawn from at most 2000 points per curve (each bucket's min and max).</p>\n"
       "<div class='charts'>\n";
  LineChart base;
  base.checkpoints = ckpts;
  base.changes = plan.changes;
  LineChart lc = base, gc = base, rc = base;
  lc.title = "training loss over steps";
  lc.desc = n ? "loss from " + short_num(loss.values.front()) + " to " + short_num(loss.values.back()) : "no steps";
  lc.y_label = "loss";
  lc.curve = downsample(loss);
  double glo = INFINITY, ghi = 0;
  for (double g : gnorm.values)
    if (std::isfinite(g) && g > 0) glo = std::min(glo, g), ghi = std::max(ghi, g);
  gc.title = "gradient norm over steps";
  gc.desc = peak >= 0 ? "peaks at " + short_num(peak_v) + " at step " + std::to_string(peak) : "no finite value";
  gc.y_label = "grad norm";
  gc.log_y = std::isfinite(glo) && ghi / glo > 100;  // a spike would flatten the rest
  gc.color = "#a3341f";
  gc.curve = downsample(gnorm);
  gc.highlight = peak;
  rc.title = "learning rate over steps";
  rc.desc = "the schedule the run trained with";
  rc.y_label = "learning rate";
  rc.color = "#2d6a2d";
  rc.curve = downsample(lr);
  for (const LineChart* c : {&lc, &gc, &rc})
    h += "<figure><figcaption>" + html_escape(c->title) + (c->log_y ? " (log scale)" : "") + ": " +
         html_escape(c->desc) + "</figcaption>\n" + line_chart_svg(*c) + "</figure>\n";
  h += "</div>\n";

  // Commands to copy.
  h += "<h2>Commands</h2>\n";
  if (n) {
    int64_t c = -1;
    for (int64_t k : ckpts)
      if (k <= last) c = k;
    int64_t pc = -1;
    for (int64_t k : ckpts)
      if (peak >= 0 && k <= peak) pc = k;
    std::string cmds;
    if (c >= 0)
      cmds += "# replay from the last checkpoint (" + std::to_string(c) + ") to the last step, bit for bit\n"
              "rewind replay" + cmd_opt + " --store " + S + " --from " + std::to_string(c) + " --to " + std::to_string(last) + " --verify\n";
    if (peak >= 0) {
      if (pc >= 0)
        cmds += "# replay up to the gradient-norm peak (step " + std::to_string(peak) + ")\n"
                "rewind replay" + cmd_opt + " --store " + S + " --from " + std::to_string(pc) + " --to " + std::to_string(peak) + " --verify\n";
      if (cmd_opt.empty())  // rewind step recomputes a step of rewind's own trainer
        cmds += "# the peak step recomputed with every op in FP32 against the recorded plan (then narrow: --fp32 'L1.H2.pv')\n"
                "rewind step --store " + S + " --step " + std::to_string(peak) + " --fp32 'all'\n";
    }
    if (jobs.empty())
      cmds += "# localize a failure in time, then to layer, head and op\n"
              "rewind bisect" + cmd_opt + " --store " + S + " --find-window --fail 'nan || grad_norm > 10 * rmedian(grad_norm, " +
              std::to_string(std::clamp<int64_t>(int64_t(n) / 8, 5, 500)) + ")' --report " +
              shell_word((fs::path(req.store_arg).parent_path() / "report").string()) + "\n";
    else
      cmds += "# every bisect probe stored for this run\nrewind bisect log --store " + S + "\n";
    h += "<pre>" + html_escape(cmds) + "</pre>\n";
  } else {
    h += "<p>None: no step is recorded.</p>\n";
  }

  // Per-head monitors as layer x head heatmaps at a few steps.
  std::string key0;
  for (const auto& k : s.metric_keys(run)) {
    int l, hd;
    std::string name;
    if (parse_head_key(k, l, hd, name)) {
      key0 = k;
      break;
    }
  }
  h += "<h2>Per-head monitors</h2>\n";
  if (key0.empty() || !n) {
    h += "<p>This run recorded no per-head monitors.</p>\n";
  } else {
    std::vector<int64_t> msteps;
    for (const auto& m : s.metrics(run, first, last, key0))
      if (m.key == key0) msteps.push_back(m.step);
    std::vector<int64_t> shown;
    if (!msteps.empty()) {
      shown = {msteps.front(), msteps[msteps.size() / 2]};
      if (peak >= 0 && std::binary_search(msteps.begin(), msteps.end(), peak)) shown.push_back(peak);
      shown.push_back(msteps.back());
      std::sort(shown.begin(), shown.end());
      shown.erase(std::unique(shown.begin(), shown.end()), shown.end());
    }
    std::map<std::string, std::vector<HeadGrid>> by_monitor;
    for (int64_t k : shown)
      for (auto& [name, g] : grids_at(s, run, k, cfg.n_layer, cfg.n_head)) by_monitor[name].push_back(g);
    h += "<p>Layer (rows) x head (columns) at steps ";
    for (size_t i = 0; i < shown.size(); ++i)
      h += (i ? ", " : "") + std::to_string(shown[i]) + (shown[i] == peak ? " (gradient-norm peak)" : "");
    h += "; one colour scale per monitor across those steps. Hover a cell for its value.</p>\n";
    std::vector<std::pair<std::string, std::string>> order(std::begin(kMonitors), std::end(kMonitors));
    for (const auto& [name, grids] : by_monitor)
      if (std::none_of(order.begin(), order.end(), [&](const auto& o) { return o.first == name; }))
        order.push_back({name, "a per-head monitor"});
    for (const auto& [name, what] : order) {
      auto it = by_monitor.find(name);
      if (it == by_monitor.end()) continue;
      double lo = INFINITY, hi = -INFINITY;
      for (const auto& g : it->second)
        for (const auto& row : g.values)
          for (double v : row)
            if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
      if (!std::isfinite(lo)) lo = 0, hi = 1;
      const ColourScale scale{lo, hi, lo > 0 && hi / lo > 100};
      h += "<h3>" + html_escape(name) + "</h3>\n<p>" + html_escape(what) + ". " +
           html_escape(hot_head(name, it->second.back())) + "</p>\n" + colour_scale_svg(name, scale) + "<div class='heats'>\n";
      for (const auto& g : it->second) h += heatmap_svg(name, g, scale);
      h += "</div>\n";
    }
  }

  // Plan schedule, checkpoints, bisect jobs, the run's settings.
  h += "<h2>Plan schedule and checkpoints</h2>\n<div class='scroll'><table><tr><th scope='col'>from step</th>"
       "<th scope='col'>plan</th></tr>\n<tr><td>0</td><td><code>" +
       html_escape(plan.base.empty() ? "(default: BF16 everywhere)" : plan.base) + "</code></td></tr>\n";
  for (const auto& [step, spec] : plan.changes)
    h += "<tr><td>" + std::to_string(step) + "</td><td><code>" + html_escape(spec) + "</code> on top of the base</td></tr>\n";
  h += "</table></div>\n<p>Checkpoints at steps ";
  for (size_t i = 0; i < ckpts.size(); ++i) h += (i ? ", " : "") + std::to_string(ckpts[i]);
  h += ckpts.empty() ? "(none)</p>\n" : ".</p>\n";
  h += "<h2>Bisect</h2>\n";
  if (jobs.empty()) {
    h += "<p>No bisect has run on this store's run " + std::to_string(run) + ".</p>\n";
  } else {
    h += "<div class='scroll'><table><tr><th scope='col'>job</th><th scope='col'>what</th><th scope='col'>probes</th>"
         "<th scope='col'>verdict</th><th scope='col'>report</th></tr>\n";
    for (const auto& j : jobs)
      h += "<tr><td><code>" + html_escape(j.id) + "</code></td><td>" + html_escape(j.what) + "</td><td>" +
           std::to_string(j.probes) + "</td><td><details><summary>" + html_escape(verdict_line(j.verdict)) +
           "</summary><pre>" + html_escape(j.verdict) + "</pre></details></td><td>" +
           (j.report_href.empty() ? "not found beside the store (bisect --report DIR writes one)"
                                  : "<a href='" + html_escape(j.report_href) + "'>report.html</a>") +
           "</td></tr>\n";
    h += "</table></div>\n";
  }
  for (const auto& r : reports)
    if (r.matched) h += horizon_chart(r, gnorm);
  for (const auto& r : reports)
    if (r.matched && std::none_of(jobs.begin(), jobs.end(), [&](const BisectJob& j) { return j.report_href == r.href; }))
      h += "<p>Bisect report given with --report: <a href='" + html_escape(r.href) + "'>" + html_escape(r.href) +
           "</a>: " + html_escape(verdict_line(r.verdict)) + "</p>\n";
  h += "<h2>Run settings</h2>\n<details><summary>config and metadata as recorded</summary><pre>" +
       html_escape(info->config) + "\n" + html_escape(info->meta) + "</pre></details>\n";
  return h + "</main></body></html>\n";
}

}  // namespace rwd::cli
