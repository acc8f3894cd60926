// `rewind store ...` run in this process through cli::run_store (cli/cmd_store.cpp compiled into
// the test: it needs only the store and cxxopts), as cli/main.cpp calls it, without the
// `rewind` binary's LibTorch start-up. Captures stdout: call it from one thread at a time.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"

namespace rwd::store::test {

// Mirrors main(): a rwd::Error becomes its exit code, its message (one line) ends `out`.
inline int run_store_cli(std::vector<std::string> args, std::string* out = nullptr) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  int rc;
  std::string error;
  try {
    rc = cli::run_store(static_cast<int>(argv.size()), argv.data());
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    rc = static_cast<int>(e.code());
    error = e.what();
  }
  std::fflush(stdout);
  const std::string captured = ::testing::internal::GetCapturedStdout();
  if (out) *out = captured + error;
  return rc;
}

}  // namespace rwd::store::test
