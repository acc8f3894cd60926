// report.json, report.md and report.html of a hand-made bisect: one probe count
// with its breakdown, the narrowing tree by parent, divergence from the recording, everything
// report.md has in the HTML, and the near miss of a not-reproducible run.
#include "bisect/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bisect/report_html.h"
#include "bisect/report_probes.h"

namespace rwd::bisect {
namespace {

// A long candidate (kept whole in the tree and the table: no "...").
const char* kLong = "low{L1.H0.qk,L1.H0.softmax,L1.H0.pv,L1.H0.o,L1.H0.delta,L1.H1.qk,L1.H1.softmax,L1.H1.pv}";

ProbeEntry probe(int index, const std::string& phase, const std::string& candidate, bool fails,
                 std::vector<double> loss, int parent, bool cached = false) {
  ProbeEntry p;
  p.index = index;
  p.phase = phase;
  p.spec.kind = phase == "fix" ? "fix" : "window";
  p.spec.from = 10;
  p.spec.to = 12;
  p.spec.candidate = parse_candidate(candidate);
  p.outcome.fails = fails;
  p.outcome.loss = std::move(loss);
  p.outcome.steps = static_cast<int>(p.outcome.loss.size());
  p.outcome.cached = cached;
  p.parent = parent;
  p.predicted_cost = p.measured_cost = NAN;
  return p;
}

BisectReport localized() {
  BisectReport r;
  r.store_path = "run.db";
  r.run = 1;
  r.predicate = "loss > 3.5";
  r.n_layer = 2;
  r.n_head = 2;
  r.narrowed = true;
  r.from = 10;
  r.to = 12;
  r.recorded_plan = "L*.H*.qk=sbf16";
  r.recorded_from = 10;
  r.recorded_loss = {2, 3, 4};
  r.search.status = Status::kLocalized;
  r.search.failing_set = r.search.fixing_set = {parse_element("L1.H0.pv")};
  r.search.phases = {{"check", 2}, {"cheap/layers", 2}, {"cheap/ops", 1}};
  r.search.probes.resize(5);
  r.probes = {probe(0, "check", "fp32{}", true, {2, 3, 4}, -1, true),
              probe(1, "check", "low{}", false, {2, 2.5, 2.6}, -1),
              probe(2, "cheap/layers", "low{L0.attn,L1.attn}", true, {2, 3, 4}, -1),
              probe(3, "cheap/layers", "low{L1.attn}", true, {2, 3, 4.5}, 2),
              probe(4, "cheap/ops", kLong, false, {2, 3, NAN}, 3),
              probe(5, "fix", "fp32{L1.H0.pv}", false, {2, 2.9, 3.1}, -1, true)};
  r.fixes = {{"promote the fixing set {L1.H0.pv} to FP32", "", true, 5},
             {"stabilized softmax (beta=2) in every head", "L*.H*.softmax=stable(beta=2)", false, -1}};
  r.executed = 4;
  r.cached = 2;
  r.verdict = "verdict: localized\n";
  return r;
}

// How many lists are open at the first occurrence of `what` (its depth in the tree).
int depth_at(const std::string& html, const std::string& what) {
  const size_t at = html.find(what);
  EXPECT_NE(at, std::string::npos) << what;
  int depth = 0;
  for (size_t i = html.find("<ul>"); i < at; i = html.find("<ul>", i + 1)) ++depth;
  for (size_t i = html.find("</ul>"); i < at; i = html.find("</ul>", i + 1)) --depth;
  return depth;
}

TEST(Report, OneProbeCountWithItsBreakdown) {
  const BisectReport r = localized();
  const ProbeTally t = tally(r);
  EXPECT_EQ(t.total, 6);
  EXPECT_EQ(t.narrowing, 5);
  EXPECT_EQ(t.fix, 1);
  EXPECT_EQ(t.windows, 1);
  EXPECT_EQ(t.text.rfind("6 probes: 4 run here, 2 read from the probe cache. ", 0), 0u) << t.text;
  EXPECT_NE(t.text.find("5 in the layer/head/op search (check 2, cheap/layers 2, cheap/ops 1); 1 fix check."),
            std::string::npos) << t.text;
  EXPECT_NE(report_html(r).find(t.text), std::string::npos);
  EXPECT_NE(report_markdown(r).find(t.text), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(report_json(r))["probe_count"]["total"], 6);
}

TEST(Report, TreeNestsEveryProbeUnderItsParent) {
  const std::string h = report_html(localized());
  const int top = depth_at(h, "<b>#2</b>"), mid = depth_at(h, "<b>#3</b>"), leaf = depth_at(h, "<b>#4</b>");
  EXPECT_EQ(mid, top + 1);
  EXPECT_EQ(leaf, top + 2);
  EXPECT_EQ(depth_at(h, "<b>#0</b>"), top);  // the anchors are roots beside the whole space
  EXPECT_NE(h.find(kLong), std::string::npos) << "labels are kept whole";
  EXPECT_EQ(h.find("..."), std::string::npos);
  EXPECT_NE(h.find("\u2717 fails</span> <b>#3</b>"), std::string::npos) << "verdicts by symbol and word";
  EXPECT_NE(h.find("\u2713 passes</span> <b>#4</b>"), std::string::npos);
  const auto j = nlohmann::json::parse(report_json(localized()));
  EXPECT_EQ(j["probes"][4]["parent"], 3);
  EXPECT_TRUE(j["probes"][0]["parent"].is_null());
}

TEST(Report, DivergenceFromTheRecordedRun) {
  const BisectReport r = localized();
  EXPECT_EQ(divergence_text(divergence(r, r.probes[0])), "0");
  EXPECT_EQ(divergence_text(divergence(r, r.probes[1])), "-1.4 (max 1.4 at 12)");
  EXPECT_EQ(divergence_text(divergence(r, r.probes[4])), "NaN/Inf at 12 (max 0 before)");
  const auto j = nlohmann::json::parse(report_json(r));
  EXPECT_NEAR(j["probes"][3]["divergence"]["last"].get<double>(), 0.5, 1e-12);
  EXPECT_EQ(j["probes"][4]["divergence"]["nonfinite_step"], 12);
  const std::string h = report_html(r), m = report_markdown(r);
  for (const std::string& s : {std::string("<th>divergence</th>"), std::string("<th>last loss</th>"),
                               std::string("<td>-1.4 (max 1.4 at 12)</td>")})
    EXPECT_NE(h.find(s), std::string::npos) << s;
  EXPECT_NE(m.find("| -1.4 (max 1.4 at 12) |"), std::string::npos);
}

TEST(Report, HtmlHasWhatMarkdownHas) {
  BisectReport r = localized();
  r.search.status = Status::kSeparateFix;  // the status in words, with the culprits, above the verdict's text
  EXPECT_NE(report_html(r).find("<strong>Result: separate fix</strong>; failing set <code>{L1.H0.pv}</code>"),
            std::string::npos);
  r = localized();
  const std::string h = report_html(r);
  for (const std::string& s : {std::string("Recorded plan at the window start: <code>L*.H*.qk=sbf16</code>"),
                               std::string("Probes per phase"), std::string("<td>cheap/layers</td><td>2</td>"),
                               std::string("Fix options checked on the window"),
                               std::string("<code>L*.H*.softmax=stable(beta=2)</code></td><td>\u2717 does not fix"),
                               std::string("<code>fp32{L1.H0.pv}</code></td><td>\u2713 fixes")})
    EXPECT_NE(h.find(s), std::string::npos) << s;
}

TEST(Report, ChartsNameTheirLinesAndSayWhichOneIsHidden) {
  const std::string h = report_html(localized());
  // The recorded run and the baseline replay are the same curve: the chart says so.
  EXPECT_NE(h.find("&#39;recorded&#39; is hidden under &#39;baseline (recorded plan)&#39;"), std::string::npos);
  EXPECT_NE(h.find("baseline (recorded plan) (red, dashed): fails"), std::string::npos);
  EXPECT_NE(h.find("all-FP32 (blue, dotted): passes"), std::string::npos);
  size_t charts = 0;
  for (size_t i = h.find("<svg"); i != std::string::npos; i = h.find("<svg", i + 1)) {
    ++charts;
    const size_t end = h.find('>', i);
    EXPECT_NE(h.substr(i, end - i).find("role='img'"), std::string::npos);
    EXPECT_EQ(h.compare(end + 2, 7, "<title>"), 0);
  }
  EXPECT_GE(charts, 1u);
}

TEST(Report, ALineWithinAPixelOfALaterOneIsNamedAsHidden) {
  using html::Line;
  auto page = [](double shift) {
    return html::chart("t", {Line{"a", "#000", 0, {1, 2, 3}}, Line{"b", "#111", 0, {1 + shift, 2 + shift, 3}}}, 0, 2);
  };
  EXPECT_NE(page(0.0).find("&#39;a&#39; is hidden under &#39;b&#39;: the same value at every step."), std::string::npos);
  // The plot is 230 px high over ~2.2 loss units: 0.001 is under a pixel, 0.1 is 10 px.
  EXPECT_NE(page(0.001).find("&#39;a&#39; is hidden under &#39;b&#39;: less than a pixel apart"), std::string::npos);
  EXPECT_EQ(page(0.1).find("hidden under"), std::string::npos);
}

TEST(Report, DivergenceChartMarksEachProbeByShape) {
  const std::string h = report_html(localized());
  const size_t at = h.find("<h2>Divergence from the recorded run</h2>");
  ASSERT_NE(at, std::string::npos);
  const std::string svg = h.substr(at, h.find("</svg>", at) - at);
  // Probe 0 equals the recording (the zero row), probe 4 went NaN (the top row), and every
  // probe with a comparable step is a mark: a cross where it fails, a circle where it passes.
  EXPECT_NE(svg.find("<title>probe 0: fails, max |d loss| 0</title><path"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>probe 1: passes, max |d loss| 1.4</title><circle"), std::string::npos);
  EXPECT_NE(svg.find("<title>probe 4: passes, NaN/Inf loss</title><circle"), std::string::npos);
  size_t marks = 0;
  for (size_t i = svg.find("<g><title>probe "); i != std::string::npos; i = svg.find("<g><title>probe ", i + 1)) ++marks;
  EXPECT_EQ(marks, 6u);
}

TEST(Report, NotReproducibleShowsTheCurveTheThresholdAndTheClosestStep) {
  BisectReport r;
  r.store_path = "run.db";
  r.predicate = "loss > 6";
  r.time = TimeSearch{};
  r.time->status = TimeSearch::Status::kNoFailure;
  Series s;
  s.first_step = 0;
  s.values["loss"] = {4, 5, 5.5, 5};
  r.near_miss = near_miss(Predicate::parse(r.predicate), s, 0, 3);
  r.verdict = "time: not reproducible\n";
  const std::string h = report_html(r);
  EXPECT_NE(h.find("not reproducible: where the recording came closest"), std::string::npos);
  EXPECT_NE(h.find("Closest at step 2: loss 5.5, threshold 6"), std::string::npos) << h;
  EXPECT_NE(h.find("closest: 2"), std::string::npos) << "the closest step is marked on the chart";
  EXPECT_NE(h.find("recorded loss and the threshold of"), std::string::npos);
  EXPECT_EQ(h.find("Narrowing tree"), std::string::npos) << "no empty tree";
  EXPECT_NE(report_markdown(r).find("Closest at step 2"), std::string::npos);
  const auto j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["near_miss"]["closest_step"], 2);
  // A predicate that holds from the start has no closest step: the text says why.
  const NearMiss always = near_miss(Predicate::parse("loss > 1"), s, 0, 3);
  EXPECT_EQ(near_miss_text(always).rfind("It holds at 4 of 4 steps", 0), 0u) << near_miss_text(always);
  EXPECT_NEAR(j["near_miss"]["threshold"][0].get<double>(), 6.0, 1e-4);
}

}  // namespace
}  // namespace rwd::bisect
