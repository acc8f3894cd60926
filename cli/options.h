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
// Refuses fewer than 1 and more than kMaxThreads (no recording can have needed that many).
void set_threads(int n);
constexpr int kMaxThreads = 1024;
// The cores this process may run on (at least 1).
int machine_cores();
// A new run's --threads N, checked before anything is created: 1 to the machine's cores. The
// count is recorded and every replay and bisect probe of the run uses it, so threads beyond
// the cores would only slow all of them (and by the thousand exhaust the process limit).
int new_run_threads(int n);
// Prints `opts.help()` and returns true when --help was given.
bool wants_help(const cxxopts::Options& opts, const cxxopts::ParseResult& r);

}  // namespace rwd::cli
