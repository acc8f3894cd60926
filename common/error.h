// Base error type and process exit codes shared by every rewind library. Header-only.
// Each library derives its own exception type; only the CLI's main catches and prints one line.
#pragma once

#include <stdexcept>
#include <string>

namespace rwd {

// Documented in `rewind --help` and docs/cli.md (exit codes).
enum class ExitCode : int {
  kOk = 0,        // success
  kInternal = 1,  // a bug or an unexpected library failure
  kUsage = 2,     // bad command line, plan spec, predicate, step range
  kData = 3,      // not a store, corrupt/tampered data, newer schema, missing checkpoint, I/O
  kFinding = 4,   // a result the user asked to detect: replay diverged, bisect localized a failure
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// Usage errors are raised by every layer that parses user text (plans, predicates, flags).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(ExitCode::kUsage, what) {}
};

}  // namespace rwd
