// The store library's exception type: a rwd::Error that also carries the SQLite or zstd code.
// Every message is one line: "<what was being done>: <library message> (<lib> code N)".
#pragma once

#include <string>

#include "common/error.h"

namespace rwd::store {

class StoreError : public Error {
 public:
  // lib_code: the SQLite result code or zstd error code behind the failure, 0 when none.
  StoreError(ExitCode code, const std::string& what, int lib_code = 0)
      : Error(code, what), lib_code_(lib_code) {}
  int lib_code() const noexcept { return lib_code_; }

 private:
  int lib_code_;
};

// Shorthand for the common case: the data on disk is not what it should be (exit code 3).
inline StoreError data_error(const std::string& what, int lib_code = 0) {
  return StoreError(ExitCode::kData, what, lib_code);
}

}  // namespace rwd::store
