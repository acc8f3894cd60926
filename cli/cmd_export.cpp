// `rewind export nanogpt`: the training state at a step of a recording written as nanoGPT's
// ckpt.pt (loadable by its GPT with strict=True, resumable by train.py).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/replay_script.h"
#include "common/error.h"
#include "interop/nanogpt.h"
#include "replay/replayer.h"
#include "train/run_spec.h"
#include "train/tensor_io.h"

namespace rwd::cli {

int run_export(int argc, char** argv) {
  cxxopts::Options opts("rewind export",
                        "write a recorded step as a nanoGPT checkpoint\n\n"
                        "  rewind export nanogpt --store run.db --step 400 -o out/ckpt.pt\n\n"
                        "A step with a checkpoint is written as stored; any other recorded step is\n"
                        "replayed from the nearest checkpoint before it (needs the token file).\n");
  opts.add_options()
      ("format", "nanogpt", cxxopts::value<std::string>())
      ("store", "the store", cxxopts::value<std::string>())
      ("step", "the step (iter_num of the checkpoint)", cxxopts::value<int64_t>())
      ("run", "run id (default: the last run)", cxxopts::value<int64_t>()->default_value("0"))
      ("data", "token file when replaying (default: the recorded path)", cxxopts::value<std::string>()->default_value(""))
      ("o,output", "the checkpoint file to write (never overwritten)", cxxopts::value<std::string>())
      ("h,help", "show help");
  opts.parse_positional({"format"});
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("format") || r["format"].as<std::string>() != "nanogpt")
    throw UsageError("export: the only format is nanogpt (rewind export nanogpt --store ...)");
  for (const char* k : {"store", "step", "output"})
    if (!r.count(k)) throw UsageError(std::string("export: --") + k + " is required");
  const std::string out = r["output"].as<std::string>();
  // An existing output is never overwritten: exit 3, as for an existing `train --record` store.
  if (access(out.c_str(), F_OK) == 0)
    throw Error(ExitCode::kData, "export: " + out + ": already exists; refusing to overwrite it");
  const int64_t step = r["step"].as<int64_t>();
  // The file is written as OUT.partial and renamed: whether OUT's folder takes it is known
  // before any replay, and said with OUT's name and the reason.
  const std::string tmp = out + ".partial";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(ExitCode::kData, "export: cannot write '" + out + "': " + std::strerror(errno));
  ::close(fd);
  struct RemoveTmp {  // every failure below leaves nothing behind
    std::string path;
    bool keep = false;
    ~RemoveTmp() {
      if (!keep) std::remove(path.c_str());
    }
  } guard{tmp};

  store::Store s = store::Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  if (is_script_run(s, r["run"].as<int64_t>()))  // its checkpoints hold the script's own state_dicts (pickled)
    throw UsageError("export: this run was recorded by a Python script (rewind.record); write its checkpoint "
                     "with Python: rewind.open(\"run.db\").run().export_nanogpt(step, \"ckpt.pt\") (nanoGPT's GPT), "
                     "or replay it with rewind replay --cmd \"python3 train.py ...\"");
  const train::RunSpec spec = train::RunSpec::load(s, r["run"].as<int64_t>());
  const auto ckpts = s.checkpoint_steps(spec.run_id);
  train::NamedTensors state;
  if (std::find(ckpts.begin(), ckpts.end(), step) != ckpts.end()) {
    state = train::read_checkpoint(s, spec.run_id, step);
  } else {
    set_threads(spec.threads);
    replay::RestoreOptions ro;
    ro.data_path = r["data"].as<std::string>();
    replay::Restored rs = replay::restore_before(s, spec.run_id, step, ro);
    state = rs.trainer->state();
  }
  errno = 0;
  try {
    interop::write_nanogpt(tmp, spec.config, state, step, interop::imported_extra(s, spec.run_id));
  } catch (const Error& e) {
    // The writer names the temporary file: say OUT instead, with the reason when it has none.
    std::string what = e.what();
    for (size_t at; (at = what.find(tmp)) != std::string::npos;) what.replace(at, tmp.size(), out);
    if (errno != 0 && what.back() == '\'') what += std::string(": ") + std::strerror(errno);
    throw Error(e.code(), "export: " + what);
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0)
    throw Error(ExitCode::kData, "export: cannot write '" + out + "': " + std::strerror(errno));
  guard.keep = true;
  std::printf("wrote run %lld step %lld as a nanoGPT checkpoint to %s\n",
              static_cast<long long>(spec.run_id), static_cast<long long>(step), out.c_str());
  return 0;
}

}  // namespace rwd::cli
