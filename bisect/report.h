// Bisect reports: report.json (everything), report.md (the verdict and every probe) and a
// self-contained report.html with inline SVG charts (loss curves, narrowing tree, time axis).
#pragma once

#include <string>

#include "bisect/driver.h"

namespace rwd::bisect {

std::string report_json(const BisectReport& r);
std::string report_markdown(const BisectReport& r);
std::string report_html(const BisectReport& r);
// A probe's cost for the report tables: "%.2f", or "-" where unknown (NaN).
std::string cost_text(double x);
// A not-reproducible run's near miss in one line: the closest step, its value and threshold.
std::string near_miss_text(const NearMiss& m);

// Writes the three files into `dir` (created if missing); throws Error(kData) on I/O failure.
void write_report(const BisectReport& r, const std::string& dir);

}  // namespace rwd::bisect
