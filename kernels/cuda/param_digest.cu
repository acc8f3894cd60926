// The parameter digest's per-tensor word sum on the GPU (see param_digest.h): a grid-stride
// loop, a warp sum, one 64-bit atomic add per warp. Memory-bound: gpt2-small's 0.5 GB of
// parameters read once (the host path copied them to the CPU and hashed byte by byte: ~0.9 s).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/hash.h"
#include "kernels/cuda/param_digest.h"

namespace rwd::kernels::cuda {

namespace {

__global__ void digest_sum_kernel(const uint32_t* __restrict__ words, int64_t n,
                                  unsigned long long* sum) {
  uint64_t s = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    s += digest_term(words[i], static_cast<uint64_t>(i));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
  if (threadIdx.x % 32 == 0 && s != 0) atomicAdd(sum, static_cast<unsigned long long>(s));
}

}  // namespace

int digest_word_sum(const uint32_t* words, int64_t n, unsigned long long* sum, void* stream) {
  if (n <= 0) return cudaSuccess;
  if (words == nullptr || sum == nullptr) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  // Enough blocks to fill an H100 (132 SMs x 8 blocks) and no more: the loop strides.
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 8);
  digest_sum_kernel<<<static_cast<int>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      words, n, sum);
  return cudaGetLastError();
}

}  // namespace rwd::kernels::cuda
