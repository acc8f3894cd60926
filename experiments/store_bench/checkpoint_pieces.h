// store_bench's breakdown of a checkpoint write into its pieces (hash, shuffle, zstd, SQLite
// inserts, WAL checkpoint, fsyncs), each timed alone on the calling thread against a plain
// write + fsync of the same bytes in the same run.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rwd::bench {

// One tensor of the checkpoint: `size` bytes of FP32 at `data`.
struct TensorBytes {
  const void* data;
  size_t size;
};

// Prints one row per piece (seconds, MB/s of raw bytes, x plain = plain seconds / piece
// seconds, best of `reps`), writing its files into `dir`.
void bench_checkpoint_pieces(const std::string& dir, int reps, int level,
                             const std::vector<TensorBytes>& tensors);

}  // namespace rwd::bench
