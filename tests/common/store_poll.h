// Shared by the end-to-end kill tests: wait until a recording that another process writes has
// committed a given step (the store is opened read-only and may not exist yet).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "store/store.h"

namespace rwd::testing {

// True once run 1 of the store at `path` holds step `step`; false after `limit`.
inline bool wait_for_step(const std::string& path, int64_t step,
                          std::chrono::seconds limit = std::chrono::seconds(120)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    try {
      auto s = rwd::store::Store::open(path, rwd::store::Mode::kReadOnly);
      const auto range = s.step_range(1);
      if (range && range->second >= step) return true;
    } catch (const std::exception&) {  // not created yet, or its schema not yet written
    }
  }
  return false;
}

}  // namespace rwd::testing
