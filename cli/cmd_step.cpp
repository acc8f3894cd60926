// `rewind step`: one recorded step in low precision vs with chosen ops promoted to FP32.
#include <cstdio>
#include <cxxopts.hpp>

#include "cli/commands.h"
#include "cli/replay_script.h"
#include "cli/options.h"
#include "common/error.h"
#include "train/run_spec.h"
#include "replay/step_probe.h"
#include "store/store.h"

namespace rwd::cli {

int run_step(int argc, char** argv) {
  cxxopts::Options opts("rewind step",
                        "replay one recorded step twice on identical state: the recorded plan vs\n"
                        "the same with SPEC promoted to FP32; per-head O bias, delta bias, W_Q grad\n\n"
                        "  rewind step --store run.db --step 42 --fp32 'L1.H2.pv'\n"
                        "  rewind step --store run.db --step 42 --fp32 'all' --json diff.json\n");
  opts.add_options()
      ("store", "the recording", cxxopts::value<std::string>())
      ("step", "the step to probe", cxxopts::value<int64_t>())
      ("fp32", "targets to promote, e.g. 'L2.H8.pv;L2.H{1,7}.o' or 'all'", cxxopts::value<std::string>())
      ("run", "run id (default: the last run)", cxxopts::value<int64_t>()->default_value("0"))
      ("data", "token file (default: the recorded path)", cxxopts::value<std::string>()->default_value(""))
      ("json", "also write the result as JSON to this file", cxxopts::value<std::string>())
      ("h,help", "show help");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("store") || !r.count("step") || !r.count("fp32"))
    throw UsageError("step: --store, --step and --fp32 are required");
  store::Store st = store::Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  refuse_script_run(st, r["run"].as<int64_t>(), "step");
  train::RunSpec spec = train::RunSpec::load(st, r["run"].as<int64_t>());
  set_threads(spec.threads);
  replay::StepProbeResult res = replay::probe_step(st, spec.run_id, r["step"].as<int64_t>(),
                                                   r["fp32"].as<std::string>(), r["data"].as<std::string>());
  std::printf("%s", res.to_table().c_str());
  if (r.count("json")) {
    const std::string path = r["json"].as<std::string>();
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw Error(ExitCode::kData, "cannot write '" + path + "'");
    std::fputs(res.to_json().c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace rwd::cli
