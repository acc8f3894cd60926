// Many tensors in one launch (the fused optimizer's kernels, the parameter digest's): up to
// kSegs segments passed by value (under the classic 4 KB kernel-parameter limit), each block one
// chunk of kChunk elements of one segment. Seg is a struct with an element count `n`; a
// segment of n = 0 takes no block.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace rwd::kernels::cuda {

template <typename Seg, int kSegs, int64_t kChunk>
struct SegmentBatch {
  Seg seg[kSegs];
  int64_t chunk_begin[kSegs + 1];  // prefix sums of each segment's chunk count
  int count;

  static int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

  // segs[first, first + count), count <= kSegs.
  static SegmentBatch pack(const Seg* segs, int first, int count) {
    SegmentBatch b{};
    b.count = count;
    b.chunk_begin[0] = 0;
    for (int k = 0; k < count; ++k) {
      b.seg[k] = segs[first + k];
      b.chunk_begin[k + 1] = b.chunk_begin[k] + chunks_of(segs[first + k].n);
    }
    return b;
  }

  int64_t blocks() const { return chunk_begin[count]; }

  // This block's segment and element range [begin, end).
  __device__ __forceinline__ void block_range(int& s, int64_t& begin, int64_t& end) const {
    const int64_t blk = blockIdx.x;
    s = 0;
    while (s + 1 < count && chunk_begin[s + 1] <= blk) ++s;
    begin = (blk - chunk_begin[s]) * kChunk;
    end = min(begin + kChunk, seg[s].n);
  }
};

}  // namespace rwd::kernels::cuda
