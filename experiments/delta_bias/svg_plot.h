// A minimal SVG line chart (no dependencies) for the experiments' curves: one x axis shared by
// several named series, linear axes with their ranges printed, a legend.
#pragma once

#include <string>
#include <vector>

namespace rwd::experiments {

struct Series {
  std::string name;
  std::vector<double> y;  // one value per x; non-finite values are skipped
};

// Writes the chart to `path`; returns false if the file cannot be written.
bool write_svg_lines(const std::string& path, const std::string& title, const std::string& x_label,
                     const std::vector<double>& x, const std::vector<Series>& series);

}  // namespace rwd::experiments
