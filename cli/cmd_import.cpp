// `rewind import nanogpt`: a nanoGPT train.py checkpoint (and its train.bin) becomes a store
// whose first checkpoint is that iteration, ready for `train --resume`, replay, step, bisect.
#include <cstdio>
#include <cxxopts.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
#include "interop/nanogpt.h"

namespace rwd::cli {

int run_import(int argc, char** argv) {
  cxxopts::Options opts("rewind import",
                        "import a nanoGPT checkpoint into a new store\n\n"
                        "  rewind import nanogpt --ckpt out/ckpt.pt --data data/train.bin --record run.db\n"
                        "  rewind import nanogpt --ckpt ckpt.pt --data train.bin --record run.db --config cpu.json\n\n"
                        "Reads train.py's ckpt.pt (model, AdamW moments and step counts, model_args,\n"
                        "iter_num, config; with or without torch.compile's _orig_mod. prefix) with\n"
                        "LibTorch. The store's run starts at a checkpoint at step iter_num: continue it\n"
                        "with `rewind train --resume STORE --steps N`, then replay, step or bisect.\n");
  opts.add_options()
      ("format", "nanogpt", cxxopts::value<std::string>())
      ("ckpt", "nanoGPT checkpoint (torch.save zip file)", cxxopts::value<std::string>())
      ("data", "the uint16 token file it trained on (train.bin)", cxxopts::value<std::string>())
      ("record", "the new store (never overwritten)", cxxopts::value<std::string>())
      ("config", "JSON file of nanoGPT keys overriding the checkpoint's hyperparameters "
                 "(e.g. a smaller batch_size)", cxxopts::value<std::string>())
      ("plan", "precision plan recorded with the run", cxxopts::value<std::string>()->default_value(""))
      ("checkpoint-every", "checkpoint schedule for `train --resume`", cxxopts::value<int>()->default_value("20"))
      ("threads", "CPU threads (recorded; replay uses the same)", cxxopts::value<int>()->default_value("1"))
      ("zstd-level", "zstd level of the store", cxxopts::value<int>()->default_value("1"))
      ("h,help", "show help");
  opts.parse_positional({"format"});
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("format") || r["format"].as<std::string>() != "nanogpt")
    throw UsageError("import: the only format is nanogpt (rewind import nanogpt --ckpt ...)");
  for (const char* k : {"ckpt", "data", "record"})
    if (!r.count(k)) throw UsageError(std::string("import: --") + k + " is required");
  interop::ImportOptions o;
  o.ckpt = r["ckpt"].as<std::string>();
  o.data = r["data"].as<std::string>();
  o.record = r["record"].as<std::string>();
  o.plan = r["plan"].as<std::string>();
  o.checkpoint_every = r["checkpoint-every"].as<int>();
  o.threads = r["threads"].as<int>();
  o.store.zstd_level = r["zstd-level"].as<int>();
  if (o.checkpoint_every < 1) throw UsageError("--checkpoint-every must be >= 1");
  set_threads(o.threads);
  if (r.count("config")) o.config_json = read_text_file(r["config"].as<std::string>());
  const interop::ImportResult res = interop::import_nanogpt(o);
  for (const std::string& w : res.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  const train::Config& c = res.config;
  std::printf("imported %s at iter %lld: %d layers x %d heads, width %d, seq %d, vocab %d%s\n",
              o.ckpt.c_str(), static_cast<long long>(res.iter_num), c.n_layer, c.n_head, c.n_embd,
              c.block_size, c.vocab_size, c.bias ? ", biases" : "");
  std::printf("recorded run %lld into %s (checkpoint at step %lld); continue with: rewind train --resume %s --steps N\n",
              static_cast<long long>(res.run), o.record.c_str(), static_cast<long long>(res.iter_num),
              o.record.c_str());
  return 0;
}

}  // namespace rwd::cli
