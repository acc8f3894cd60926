// `rewind view STORE -o run.html`: one self-contained HTML page of a recorded run (curves,
// checkpoints, plan changes, per-head monitor heatmaps, bisect jobs, commands to copy).
// Reads the store only; the page is rewritten each time (it is derived from the store).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/run_page.h"
#include "common/error.h"
#include "store/store.h"

namespace rwd::cli {

int run_view(int argc, char** argv) {
  cxxopts::Options opts("rewind view",
                        "write one self-contained HTML page of a recorded run: loss, gradient norm\n"
                        "and learning rate over steps, checkpoints and plan changes, per-head\n"
                        "monitors as layer x head heatmaps, bisect verdicts and report links, and\n"
                        "replay/step commands to copy. No script, no request beyond the file.\n\n"
                        "  rewind view run.db -o run.html\n"
                        "  rewind view run.db -o out/run.html --run 2 --report out/report\n\n"
                        "Bisect reports (report.json) in the store's folder or one level below it\n"
                        "are linked when their verdict is one the store holds for the run.\n");
  opts.add_options()
      ("store", "the recording", cxxopts::value<std::string>())
      ("o,output", "the HTML page to write (replaced if it exists)", cxxopts::value<std::string>())
      ("run", "run id (default: the last run)", cxxopts::value<int64_t>()->default_value("0"))
      ("report", "also link this bisect report folder (repeatable)", cxxopts::value<std::vector<std::string>>())
      ("h,help", "show help");
  opts.parse_positional({"store"});
  opts.positional_help("STORE");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("store")) throw UsageError("view: STORE is required (rewind view run.db -o run.html)");
  if (!r.count("output")) throw UsageError("view: -o PAGE.html is required");
  RunPageRequest req;
  req.store_arg = r["store"].as<std::string>();
  req.out_path = r["output"].as<std::string>();
  req.run = r["run"].as<int64_t>();
  if (req.run < 0) throw UsageError("view: --run must be a run id (1 or more)");
  if (r.count("report")) req.reports = r["report"].as<std::vector<std::string>>();
  store::Store st = store::Store::open(req.store_arg, store::Mode::kReadOnly);
  const std::string page = run_page_html(st, req);
  // Written beside the page and renamed: a reader never sees half a page.
  const std::string tmp = req.out_path + ".partial";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(ExitCode::kData, "view: cannot write '" + req.out_path + "': " + std::strerror(errno));
  const bool ok = std::fwrite(page.data(), 1, page.size(), f) == page.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), req.out_path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(ExitCode::kData, "view: cannot write '" + req.out_path + "': " + why);
  }
  std::printf("run page: %s (%zu KB)\n", req.out_path.c_str(), (page.size() + 1023) / 1024);
  return 0;
}

}  // namespace rwd::cli
