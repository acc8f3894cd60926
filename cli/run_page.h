// `rewind view`: one self-contained HTML page per recorded run (inline SVG, no script, no request
// beyond the file), read from a store without LibTorch. run_page.cpp gathers and lays out the
// page; run_page_charts.cpp draws its SVG (line charts over steps, layer x head heatmaps).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "store/store.h"

namespace rwd::cli {

// One curve over steps: values[i] at steps[i] (NaN/Inf kept: the chart marks them).
struct Curve {
  std::vector<int64_t> steps;
  std::vector<double> values;
};

// At most `max_points` points, keeping every spike: long curves are cut into max_points / 3
// buckets of consecutive steps, each giving its minimum, its maximum and its first non-finite
// value, in step order. Shorter curves come back unchanged.
Curve downsample(const Curve& c, size_t max_points = 2000);

struct LineChart {
  std::string title;  // the SVG's <title> and aria-label
  std::string desc;   // its <desc>: what a reader should see
  std::string y_label;
  std::string color = "#1f4e99";
  bool log_y = false;
  Curve curve;
  std::vector<int64_t> checkpoints;                       // ticks under the plot
  std::vector<std::pair<int64_t, std::string>> changes;  // plan changes: dashed lines
  int64_t highlight = -1;                                 // a step to circle (-1: none)
  // More curves on the same axes (a bisect's branches past its window), each with its colour and
  // dash, and labelled vertical lines (the point of no return, the failure step, the horizon).
  struct Extra {
    Curve curve;
    std::string color, dash;
  };
  std::vector<Extra> extra;
  std::vector<std::pair<int64_t, std::string>> marks;
};
std::string line_chart_svg(const LineChart& c);

// One per-head monitor at one step: values[layer][head] (NaN where not recorded).
struct HeadGrid {
  int64_t step = 0;
  std::vector<std::vector<double>> values;
};
// The colour scale of one monitor's heatmaps, shared by its steps so they compare; log when a
// few heads are orders of magnitude above the rest (they would leave the others one colour).
struct ColourScale {
  double lo = 0, hi = 1;
  bool log = false;
  double at(double v) const;  // 0 (lo) .. 1 (hi)
};
std::string heatmap_svg(const std::string& monitor, const HeadGrid& g, const ColourScale& scale);
// The colour scale as a small labelled bar.
std::string colour_scale_svg(const std::string& monitor, const ColourScale& scale);

std::string html_escape(const std::string& s);
// A short number for labels: %.4g, or "NaN"/"inf".
std::string short_num(double x);

// What `rewind view` was asked: the store as the user named it (it goes into the commands the
// page offers), the run (0: the last one) and where the page goes (report links are relative
// to its folder); `reports` are bisect report folders or report.html files named by --report.
struct RunPageRequest {
  std::string store_arg;
  int64_t run = 0;
  std::string out_path;
  std::vector<std::string> reports;
};

// Reads the run and renders the page. Throws UsageError for a run the store lacks, and
// StoreError(kData) for a store it cannot read.
std::string run_page_html(store::Store& s, const RunPageRequest& req);

// The subcommand (cli/cmd_view.cpp), dispatched from main.cpp like those of cli/commands.h.
int run_view(int argc, char** argv);

}  // namespace rwd::cli
