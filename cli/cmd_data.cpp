// `rewind data`: make token files without any download.
#include <cstdio>
#include <cxxopts.hpp>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "train/data.h"

namespace rwd::cli {

int run_data(int argc, char** argv) {
  cxxopts::Options opts("rewind data",
                        "make nanoGPT-style uint16 token files\n\n"
                        "  rewind data synth -o train.bin [--tokens N] [--vocab V] [--seed S]\n"
                        "  rewind data text FILE -o train.bin   (byte-level, vocab 256)\n");
  opts.add_options()
      ("kind", "synth | text", cxxopts::value<std::string>())
      ("input", "text file (for `text`)", cxxopts::value<std::string>())
      ("o,output", "output token file", cxxopts::value<std::string>())
      ("tokens", "synth: number of tokens", cxxopts::value<size_t>()->default_value("1000000"))
      ("vocab", "synth: vocabulary size", cxxopts::value<int>()->default_value("256"))
      ("seed", "synth: seed", cxxopts::value<uint64_t>()->default_value("1"))
      ("h,help", "show help");
  opts.parse_positional({"kind", "input"});
  auto r = opts.parse(argc, argv);
  if (r.count("help") || !r.count("kind")) {
    std::printf("%s", opts.help().c_str());
    return r.count("help") ? 0 : static_cast<int>(ExitCode::kUsage);
  }
  if (!r.count("output")) throw UsageError("data: -o/--output is required");
  const std::string kind = r["kind"].as<std::string>();
  const std::string out = r["output"].as<std::string>();
  if (kind == "synth") {
    size_t n = r["tokens"].as<size_t>();
    train::write_synth_tokens(out, n, r["vocab"].as<int>(), r["seed"].as<uint64_t>());
    std::printf("wrote %zu synthetic tokens (vocab %d) to %s\n", n, r["vocab"].as<int>(), out.c_str());
    return 0;
  }
  if (kind == "text") {
    if (!r.count("input")) throw UsageError("data text: give the text file to encode");
    size_t n = train::write_text_tokens(r["input"].as<std::string>(), out);
    std::printf("wrote %zu byte tokens to %s\n", n, out.c_str());
    return 0;
  }
  throw UsageError("data: unknown kind '" + kind + "' (expected synth or text)");
}

}  // namespace rwd::cli
