// run_ordered: every item produced once, consumed in order on the calling thread, never more
// than `window` (items, or their weights) in flight, and the first failure (of a worker or of
// consume) rethrown unchanged after the threads are joined.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/ordered_work.h"
#include "store/store_error.h"

namespace rwd::store {
namespace {

TEST(OrderedWork, ConsumesEveryItemInOrderWithinTheWindow) {
  for (bool weighted : {false, true}) {
    // Weighted: items of 1..5 units, some heavier than the smallest windows.
    const auto weight = [&](size_t i) { return weighted ? 1 + (i * 7) % 5 : size_t(1); };
    for (int threads : {0, 1, 2, 4, 8}) {
      for (size_t window : {size_t(1), size_t(3), size_t(100)}) {
        const size_t n = 57;
        std::vector<int> produced(n, 0);
        std::vector<size_t> consumed;
        std::mutex mu;
        std::set<int> workers;
        // Weight started minus weight consumed, seen by each item as it starts: never above the
        // window, or the item's own weight when it runs alone (the consumed weight only grows,
        // so reading it late can only lower the figure).
        std::atomic<int64_t> started{0}, n_consumed{0};
        std::atomic<bool> over{false};
        const std::thread::id caller = std::this_thread::get_id();
        run_ordered(
            n, threads, window,
            [&](size_t i, int w) {
              const int64_t ahead = (started += weight(i)) - n_consumed.load();
              if (ahead > static_cast<int64_t>(std::max(window, weight(i)))) over = true;
              std::this_thread::sleep_for(std::chrono::microseconds((i * 37) % 200));
              std::lock_guard<std::mutex> lock(mu);
              ++produced[i];
              workers.insert(w);
            },
            [&](size_t i) {
              EXPECT_EQ(std::this_thread::get_id(), caller);
              std::lock_guard<std::mutex> lock(mu);
              EXPECT_EQ(produced[i], 1) << "item " << i << " consumed before it was produced";
              consumed.push_back(i);
              n_consumed += weight(i);
            },
            weighted ? std::function<size_t(size_t)>(weight) : nullptr);
        const std::string what = std::to_string(threads) + " threads, window " +
                                 std::to_string(window) + (weighted ? ", weighted" : "");
        std::vector<size_t> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = i;
        EXPECT_EQ(consumed, want) << what;
        EXPECT_TRUE(std::all_of(produced.begin(), produced.end(), [](int c) { return c == 1; }));
        EXPECT_FALSE(over) << what;
        EXPECT_LE(workers.size(), static_cast<size_t>(std::max(threads, 1)));
        EXPECT_GE(*workers.begin(), 0);
        EXPECT_LT(*workers.rbegin(), std::max(threads, 1));
      }
    }
  }
}

TEST(OrderedWork, FailureOfAWorkerIsRethrownUnchangedAndStopsConsuming) {
  for (int threads : {0, 1, 2, 4}) {
    std::vector<size_t> consumed;
    std::atomic<size_t> started_after{0};
    try {
      run_ordered(
          40, threads, 4,
          [&](size_t i, int) {
            if (i > 10) ++started_after;
            if (i == 10) throw StoreError(ExitCode::kInternal, "zstd: compressing: boom", 7);
          },
          [&](size_t i) { consumed.push_back(i); });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const StoreError& e) {
      EXPECT_STREQ(e.what(), "zstd: compressing: boom");
      EXPECT_EQ(e.code(), ExitCode::kInternal);
      EXPECT_EQ(e.lib_code(), 7);
    }
    // Items before the failing one may be consumed; it and later ones never are.
    ASSERT_LE(consumed.size(), 10u) << threads << " threads";
    for (size_t i = 0; i < consumed.size(); ++i) EXPECT_EQ(consumed[i], i);
    // Within the window of 4 past the consumed items, nothing far beyond the failure started.
    EXPECT_LE(started_after.load(), 4u);
  }
}

TEST(OrderedWork, FailureOfConsumeJoinsTheWorkersAndIsRethrown) {
  for (int threads : {0, 1, 3}) {
    std::atomic<int> produced{0};
    EXPECT_THROW(run_ordered(
                     100, threads, 2, [&](size_t, int) { ++produced; },
                     [&](size_t i) {
                       if (i == 5) throw StoreError(ExitCode::kData, "insert failed");
                     }),
                 StoreError);
    // The workers are joined when run_ordered returns: the count no longer moves.
    const int after = produced.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(produced.load(), after);
    EXPECT_LE(after, 5 + 2) << threads << " threads";
  }
}

TEST(OrderedWork, NoItemsIsANoOp) {
  run_ordered(
      0, 4, 2, [](size_t, int) { ADD_FAILURE(); }, [](size_t) { ADD_FAILURE(); });
}

}  // namespace
}  // namespace rwd::store
