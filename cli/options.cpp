// Shared command-line handling: config presets/files/overrides and thread counts.
#include "cli/options.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"

namespace rwd::cli {

namespace {

std::string dashed(std::string key) {
  for (char& c : key)
    if (c == '_') c = '-';
  return key;
}

}  // namespace

void add_config_options(cxxopts::Options& opts) {
  opts.add_options("model and optimisation")
      ("preset", "tiny | small-cpu | gpt2-small", cxxopts::value<std::string>()->default_value("tiny"))
      ("config", "JSON file of nanoGPT keys (applied after the preset)", cxxopts::value<std::string>());
  for (int i = 0; i < train::kNumConfigKeys; ++i) {
    opts.add_options("model and optimisation")(dashed(train::kConfigKeys[i]),
                                               std::string("override ") + train::kConfigKeys[i],
                                               cxxopts::value<std::string>());
  }
}

train::Config config_from(const cxxopts::ParseResult& r) {
  train::Config c = train::Config::preset(r["preset"].as<std::string>());
  if (r.count("config"))  // the file overrides the keys it names
    c = train::Config::from_json(read_text_file(r["config"].as<std::string>()), c);
  for (int i = 0; i < train::kNumConfigKeys; ++i) {
    const std::string key = dashed(train::kConfigKeys[i]);
    if (r.count(key)) train::set_config_value(c, key, r[key].as<std::string>());
  }
  c.validate();
  return c;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void set_threads(int n) {
  if (n < 1) throw UsageError("--threads must be >= 1");
  if (n > kMaxThreads)
    throw UsageError("--threads " + std::to_string(n) + " is more than " + std::to_string(kMaxThreads) +
                     " (the most rewind runs)");
  at::set_num_threads(n);
}

int machine_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int new_run_threads(int n) {
  if (n < 1) throw UsageError("train: --threads must be >= 1, got " + std::to_string(n));
  const int cores = machine_cores();
  if (n > cores)
    throw UsageError("train: --threads " + std::to_string(n) + " is more than the " + std::to_string(cores) +
                     " cores this process may use (at most " + std::to_string(cores) +
                     ": the count is recorded and every replay of the run uses it)");
  return n;
}

bool wants_help(const cxxopts::Options& opts, const cxxopts::ParseResult& r) {
  if (!r.count("help")) return false;
  std::printf("%s", opts.help().c_str());
  return true;
}

}  // namespace rwd::cli
