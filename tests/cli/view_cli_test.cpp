// `rewind view`: the run page of a tiny recorded run is one self-contained file with the loss,
// gradient-norm and learning-rate curves, the plan change and checkpoints, layer x head
// heatmaps of every monitor, commands to copy and a link to the bisect report beside the store;
// bad input is one line and exit 2 or 3. Also downsample() on a long curve.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "cli/run_page.h"
#include "tests/bisect/bisect_test_util.h"

namespace rwd::cli {
namespace {

using rwd::testing::Cmd;
using rwd::testing::rewind_cmd;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A 20-step tiny run (2 layers x 4 heads), checkpoints every 10, a fault from step 12 that sends
// the gradient norm up, and a bisect of 10:19 with --report in the store's folder.
class ViewCli : public rwd::bisect::testing::TinyRunSuite {
 protected:
  static void SetUpTestSuite() {
    make_data("view_cli");
    store_ = dir_ + "/run.db";
    Cmd c = rewind_cmd(rwd::bisect::testing::train_args(data_, store_, 20, 10,
                                                        "--learning-rate 0.01 --plan-from '12:L1.H2.delta=fault(strength=1e30)'"));
    ASSERT_EQ(c.code, 0) << c.out;
    c = rewind_cmd("bisect --store " + store_ + " --window 10:19 --fail 'nan' --quiet --report " + dir_ + "/report");
    ASSERT_EQ(c.code, 0) << c.out;  // the loss stays finite: not reproducible, exit 0
  }
  inline static std::string store_;
};

TEST_F(ViewCli, PageIsSelfContainedWithCurvesHeatmapsAndCommands) {
  const std::string page = dir_ + "/run.html";
  Cmd c = rewind_cmd("view " + store_ + " -o " + page);
  ASSERT_EQ(c.code, 0) << c.out;
  const std::string h = slurp(page);
  ASSERT_FALSE(h.empty());
  // Self-contained: no script, stylesheet, image or frame from anywhere; the only URL is the
  // SVG namespace name (not fetched).
  EXPECT_EQ(h.find("<script"), std::string::npos);
  EXPECT_EQ(h.find("<link"), std::string::npos);
  EXPECT_EQ(h.find("src="), std::string::npos);
  EXPECT_EQ(h.find("url("), std::string::npos);
  EXPECT_EQ(count(h, "http"), count(h, "xmlns='http://www.w3.org/2000/svg'"));
  EXPECT_NE(h.find("<html lang='en'>"), std::string::npos);
  EXPECT_NE(h.find("<main>"), std::string::npos);
  EXPECT_NE(h.find("name='viewport'"), std::string::npos);
  // The three curves, each a polyline; the grad norm spans decades, so it is on a log axis.
  for (const char* t : {"training loss over steps", "gradient norm over steps", "learning rate over steps"})
    EXPECT_NE(h.find(std::string("aria-label='") + t), std::string::npos) << t;
  EXPECT_GE(count(h, "<polyline"), 3u);
  EXPECT_NE(h.find("grad norm (log)"), std::string::npos);
  EXPECT_NE(h.find("plan change at step 12: L1.H2.delta=fault(strength=1e30)"), std::string::npos);
  EXPECT_NE(h.find("checkpoints at steps 0, 10"), std::string::npos);
  // Every monitor as a layer x head heatmap at the first, middle and last step (and the peak).
  for (const char* m : {"max_logit", "repmax_rate", "pbar_one", "wq_sn"}) {
    EXPECT_NE(h.find(std::string("aria-label='") + m + " per layer (rows) and head (columns) at step 0"), std::string::npos) << m;
    EXPECT_NE(h.find(std::string(m) + " per layer (rows) and head (columns) at step 19"), std::string::npos) << m;
    EXPECT_NE(h.find(std::string("L1.H3 ") + m + " = "), std::string::npos) << m;
  }
  // Commands for the last checkpoint before the last step and for the gradient-norm peak.
  EXPECT_NE(h.find("rewind replay --store " + store_ + " --from 10 --to 19 --verify"), std::string::npos);
  EXPECT_TRUE(std::regex_search(h, std::regex("rewind step --store " + store_ + " --step 1[2-9] --fp32")));
  // The bisect job the store holds, linked to its report beside the store.
  EXPECT_NE(h.find("href='report/report.html'"), std::string::npos);
  EXPECT_NE(h.find("run 1 window 10:19 fail nan"), std::string::npos);
}

TEST_F(ViewCli, BadInputIsOneLineWithItsExitCode) {
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  {
    std::ofstream junk(dir_ + "/junk.db");
    junk << "not a store";
  }
  const std::vector<Case> cases = {
      {"view " + dir_ + "/missing.db -o " + dir_ + "/x.html", 3, "no such file"},
      {"view " + dir_ + "/junk.db -o " + dir_ + "/x.html", 3, "not a rewind store"},
      {"view " + store_ + " -o " + dir_ + "/x.html --run 7", 2, "no run 7"},
      {"view " + store_, 2, "-o PAGE.html is required"},
      {"view -o " + dir_ + "/x.html", 2, "STORE is required"},
      {"view " + store_ + " -o " + dir_ + "/no/such/folder/x.html", 3, "cannot write"},
      {"view " + store_ + " -o " + dir_ + "/x.html --report " + dir_, 2, "no report.json"},
  };
  for (const auto& c : cases) {
    Cmd r = rewind_cmd(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_EQ(count(r.out, "\n"), 1u) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
  }
}

TEST(RunPageCharts, DownsampleKeepsSpikesAndNonFiniteSteps) {
  Curve c;
  for (int64_t i = 0; i < 100000; ++i) {
    c.steps.push_back(i);
    c.values.push_back(1.0 + 0.001 * std::sin(0.01 * double(i)));
  }
  c.values[77777] = 500.0;   // one spike
  c.values[90001] = NAN;     // one non-finite step
  c.values[12345] = -3.0;    // one dip
  const Curve d = downsample(c);
  EXPECT_LE(d.values.size(), 2000u);
  EXPECT_GE(d.values.size(), 1000u);
  bool spike = false, nan = false, dip = false;
  for (size_t i = 0; i < d.values.size(); ++i) {
    spike |= d.steps[i] == 77777 && d.values[i] == 500.0;
    dip |= d.steps[i] == 12345 && d.values[i] == -3.0;
    nan |= d.steps[i] == 90001 && std::isnan(d.values[i]);
    if (i) EXPECT_LT(d.steps[i - 1], d.steps[i]);
  }
  EXPECT_TRUE(spike && nan && dip);
  const Curve small = downsample(Curve{{0, 1, 2}, {1.0, NAN, 3.0}});
  EXPECT_EQ(small.steps.size(), 3u);
}

TEST(RunPageCharts, LogAxisAndHeatmapAreAccessible) {
  LineChart lc;
  lc.title = "gradient norm over steps";
  lc.desc = "peaks";
  lc.y_label = "grad norm";
  lc.log_y = true;
  lc.curve = Curve{{0, 1, 2, 3}, {0.5, 2.0, 4e6, INFINITY}};
  const std::string s = line_chart_svg(lc);
  EXPECT_NE(s.find("role='img'"), std::string::npos);
  EXPECT_NE(s.find("<title>gradient norm over steps</title>"), std::string::npos);
  EXPECT_NE(s.find("non-finite grad norm at steps 3..3"), std::string::npos);
  EXPECT_NE(s.find(">1e6<"), std::string::npos);
  HeadGrid g{5, {{1.0, 2.0}, {NAN, 9.0}}};
  const std::string hm = heatmap_svg("max_logit", g, ColourScale{1.0, 9.0, false});
  EXPECT_NE(hm.find("highest 9 at L1.H1, lowest 1 at L0.H0"), std::string::npos);
  EXPECT_NE(hm.find("L1.H0 max_logit = NaN"), std::string::npos);
}

}  // namespace
}  // namespace rwd::cli
