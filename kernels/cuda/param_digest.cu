// The parameter digest's per-tensor word sums on the GPU (see param_digest.h): each launch takes
// up to kSegs tensors by value (under the classic 4 KB kernel-parameter limit) and gives each
// block one chunk of kChunk words of one tensor; a warp sum, one 64-bit atomic add per warp.
// Memory-bound: gpt2-small's 0.5 GB of parameters read once (the host path copied them to the
// CPU and hashed byte by byte: ~0.9 s).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/hash.h"
#include "kernels/cuda/param_digest.h"

namespace rwd::kernels::cuda {

namespace {

constexpr int kSegs = 64;
constexpr int64_t kChunk = 65536;
constexpr int kThreads = 256;

struct Batch {
  DigestSegment seg[kSegs];
  int64_t chunk_begin[kSegs + 1];  // prefix sums of each tensor's chunk count
  int count;
};

__global__ void __launch_bounds__(kThreads) digest_sums_kernel(const Batch b) {
  const int64_t blk = blockIdx.x;
  int s = 0;
  while (s + 1 < b.count && b.chunk_begin[s + 1] <= blk) ++s;
  const int64_t begin = (blk - b.chunk_begin[s]) * kChunk;
  const int64_t end = min(begin + kChunk, b.seg[s].n);
  const uint32_t* __restrict__ words = b.seg[s].words;
  uint64_t acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) acc += digest_term(words[i], static_cast<uint64_t>(i));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0 && acc != 0) atomicAdd(b.seg[s].sum, static_cast<unsigned long long>(acc));
}

}  // namespace

int digest_word_sums(const DigestSegment* segs, int count, void* stream) {
  if (count < 0 || (count > 0 && segs == nullptr)) return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  for (int first = 0; first < count;) {
    Batch b{};
    b.chunk_begin[0] = 0;
    for (; first < count && b.count < kSegs; ++first) {
      const DigestSegment& g = segs[first];
      if (g.n <= 0) continue;  // nothing to add
      if (g.words == nullptr || g.sum == nullptr) return cudaErrorInvalidValue;
      b.seg[b.count] = g;
      b.chunk_begin[b.count + 1] = b.chunk_begin[b.count] + (g.n + kChunk - 1) / kChunk;
      ++b.count;
    }
    if (b.count == 0) continue;
    digest_sums_kernel<<<static_cast<unsigned>(b.chunk_begin[b.count]), kThreads, 0, st>>>(b);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
