// Command-line pieces shared by subcommands that build or load a training run.
#pragma once

#include <cxxopts.hpp>
#include <string>

#include "train/config.h"

namespace rwd::cli {

// Adds --preset, --config and one option per nanoGPT config key (--n-layer, ...).
void add_config_options(cxxopts::Options& opts);
// Preset, then config file, then per-key overrides, validated.
train::Config config_from(const cxxopts::ParseResult& r);
// The whole text of a file named on the command line; UsageError when unreadable.
std::string read_text_file(const std::string& path);
// Sets LibTorch's (and OpenMP's) thread count: replay determinism needs the recorded count.
void set_threads(int n);
// Prints `opts.help()` and returns true when --help was given.
bool wants_help(const cxxopts::Options& opts, const cxxopts::ParseResult& r);

}  // namespace rwd::cli
