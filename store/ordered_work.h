// A bounded parallel loop whose results are consumed in order on the calling thread: the store
// prepares blobs (hash, shuffle, compress) on worker threads and inserts them on its own.
#pragma once

#include <cstddef>
#include <functional>

namespace rwd::store {

// Calls produce(i, worker) for every i in [0, n) on `threads` new threads (worker in
// [0, threads) names the calling thread's own state, e.g. its zstd context) and consume(i) on
// the calling thread in increasing i, each as soon as items 0..i are produced. Items are
// started in increasing i while the weights of the items started but not yet consumed add up
// to at most `window`, which bounds the memory their results hold; an item heavier than the
// window starts once nothing else is in flight. weight(i) is 1 when no weight is given; it is
// called under a lock from any of the threads, so it must be cheap and only read.
// threads <= 0 runs produce(i, 0) and consume(i) in turn on the calling thread.
// The first exception thrown by produce or consume stops the loop: no further item starts,
// items being produced finish, no further item is consumed, the threads are joined, and the
// exception is rethrown on the calling thread as it was thrown.
void run_ordered(size_t n, int threads, size_t window,
                 const std::function<void(size_t i, int worker)>& produce,
                 const std::function<void(size_t i)>& consume,
                 const std::function<size_t(size_t i)>& weight = nullptr);

}  // namespace rwd::store
