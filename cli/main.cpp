// `rewind` entry point: dispatches to subcommands and is the only place errors are printed.
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <cxxopts.hpp>

#include "cli/commands.h"
#include "cli/run_page.h"
#include "common/error.h"
#include "common/switches.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"data", rwd::cli::run_data, "make token files: `data synth` or `data text FILE`"},
    {"train", rwd::cli::run_train, "train a GPT under a precision plan; --record STORE"},
    {"replay", rwd::cli::run_replay, "re-execute a recorded window; --verify bit-exactness"},
    {"step", rwd::cli::run_step, "one recorded step, low precision vs FP32-substituted ops"},
    {"bisect", rwd::cli::run_bisect, "localize a failure: layer/head/op (--window) or time (--find-window)"},
    {"doctor", rwd::cli::run_doctor, "is a Python training script bitwise repeatable? names the first op that is not"},
    {"store", rwd::cli::run_store, "inspect or thin a store: info | ls | verify | export | thin"},
    {"import", rwd::cli::run_import, "a nanoGPT checkpoint into a new store: `import nanogpt --ckpt`"},
    {"export", rwd::cli::run_export, "a recorded step as a nanoGPT checkpoint: `export nanogpt -o`"},
    {"view", rwd::cli::run_view, "one self-contained HTML page of a recorded run: `view STORE -o run.html`"},
};

void print_help() {
  std::printf(
      "rewind: record, replay and bisect low-precision (BF16) transformer training\n\n"
      "usage: rewind <command> [options]    (rewind <command> --help for details)\n\n"
      "commands:\n");
  for (const Command& c : kCommands) std::printf("  %-8s %s\n", c.name, c.summary);
  std::printf("\nrewind --help-env: the REWIND_* environment switches\n");
  std::printf(
      "\nexit codes:\n"
      "  0  success\n"
      "  1  internal error (a bug)\n"
      "  2  usage error: bad option, plan spec, predicate or step range\n"
      "  3  data error: not a store, corrupt or tampered data, newer schema, missing checkpoint\n"
      "  4  finding: replay diverged, bisect localized a precision failure, or doctor found a difference\n");
}

// LibTorch's messages run on with a C++ backtrace; the error line is their first line.
std::string first_line(const char* what) {
  std::string s = what ? what : "";
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? static_cast<int>(rwd::ExitCode::kUsage) : 0;
  }
  if (!std::strcmp(argv[1], "--help-env")) {
    // `--help-env markdown` is docs/switches.md, which a test holds to this output.
    const bool md = argc > 2 && !std::strcmp(argv[2], "markdown");
    std::fputs((md ? rwd::switches::markdown() : rwd::switches::help_text()).c_str(), stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      rwd::switches::check_all();  // before any thread of the command reads one
      return c.run(argc - 1, argv + 1);
    } catch (const rwd::Error& e) {
      std::fprintf(stderr, "rewind: error: %s\n", e.what());
      return static_cast<int>(e.code());
    } catch (const cxxopts::exceptions::exception& e) {
      std::fprintf(stderr, "rewind: error: %s (try rewind %s --help)\n", e.what(), c.name);
      return static_cast<int>(rwd::ExitCode::kUsage);
    } catch (const c10::OutOfMemoryError& e) {
      // One line, no backtrace: which rank ran out and what it asked for (LibTorch's first line).
      const char* rank = rwd::switches::external("RANK");
      std::fprintf(stderr, "rewind: error: out of device memory%s%s: %s\n", rank ? " on rank " : "", rank ? rank : "",
                   first_line(e.what_without_backtrace()).c_str());
      return static_cast<int>(rwd::ExitCode::kInternal);
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "rewind: error: internal: %s\n", first_line(e.what_without_backtrace()).c_str());
      return static_cast<int>(rwd::ExitCode::kInternal);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rewind: error: internal: %s\n", e.what());
      return static_cast<int>(rwd::ExitCode::kInternal);
    }
  }
  std::fprintf(stderr, "rewind: error: unknown command '%s' (try rewind --help)\n", argv[1]);
  return static_cast<int>(rwd::ExitCode::kUsage);
}
