// The TF32 split of tf32_split.h on the GPU: tf32_split_one per element, four elements a
// thread where the three arrays are 16-byte aligned. No FTZ (no fast-math flags), so x - hi is
// computed exactly for subnormal results too, as on the CPU (x - hi has no product to contract
// into an FMA).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/tf32_split.h"

namespace rwd::kernels::cuda {

namespace {

__global__ void split4_kernel(const float4* __restrict__ x, int64_t n4, float4* __restrict__ hi,
                              float4* __restrict__ lo) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    float4 h, l;
    tf32_split_one(v.x, h.x, l.x);
    tf32_split_one(v.y, h.y, l.y);
    tf32_split_one(v.z, h.z, l.z);
    tf32_split_one(v.w, h.w, l.w);
    hi[i] = h;
    lo[i] = l;
  }
}

__global__ void split1_kernel(const float* __restrict__ x, int64_t begin, int64_t n, float* __restrict__ hi,
                              float* __restrict__ lo) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tf32_split_one(x[i], hi[i], lo[i]);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

int tf32_split(const float* x, int64_t n, float* hi, float* lo, void* stream) {
  if (n <= 0) return 0;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond: ~30 blocks per SM on an H100
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int64_t done = 0;
  if (aligned16(x) && aligned16(hi) && aligned16(lo)) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      const int64_t blocks = (n4 + kThreads - 1) / kThreads;
      split4_kernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0, s>>>(
          reinterpret_cast<const float4*>(x), n4, reinterpret_cast<float4*>(hi), reinterpret_cast<float4*>(lo));
    }
    done = n4 * 4;
  }
  if (done < n) {
    const int64_t blocks = (n - done + kThreads - 1) / kThreads;
    split1_kernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0, s>>>(
        x, done, n, hi, lo);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace rwd::kernels::cuda
