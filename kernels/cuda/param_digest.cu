// The parameter digest's per-tensor word sums on the GPU (see param_digest.h): up to kSegs
// tensors a launch (segment_batch.cuh), each block one chunk of kChunk words of one tensor; a
// warp sum, one 64-bit atomic add per warp.
// Memory-bound: gpt2-small's 0.5 GB of parameters read once (the host path copied them to the
// CPU and hashed byte by byte: ~0.9 s).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/hash.h"
#include "kernels/cuda/param_digest.h"
#include "kernels/cuda/segment_batch.cuh"

namespace rwd::kernels::cuda {

namespace {

constexpr int kSegs = 64;
constexpr int64_t kChunk = 65536;
constexpr int kThreads = 256;
using Batch = SegmentBatch<DigestSegment, kSegs, kChunk>;

__global__ void __launch_bounds__(kThreads) digest_sums_kernel(const Batch b) {
  int s;
  int64_t begin, end;
  b.block_range(s, begin, end);
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
  for (int k = 0; k < count; ++k)
    if (segs[k].n < 0 || (segs[k].n > 0 && (segs[k].words == nullptr || segs[k].sum == nullptr)))
      return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  for (int first = 0; first < count; first += kSegs) {
    const Batch b = Batch::pack(segs, first, std::min(kSegs, count - first));
    if (b.blocks() == 0) continue;  // empty tensors only
    digest_sums_kernel<<<static_cast<unsigned>(b.blocks()), kThreads, 0, st>>>(b);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace rwd::kernels::cuda
