// Layout copies (see layout.h): a grid-stride loop over the destination in order, so the
// stores are coalesced and each source run of d elements is read whole.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/layout.h"

namespace rwd::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// T: the unit moved per thread (uint4: 8 elements, uint16_t: 1); v: units per row of d.
template <class T>
__global__ void __launch_bounds__(kThreads)
    swap_middle_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t x, int64_t y, int64_t v,
                       int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t u = i % v;
    int64_t r = i / v;
    const int64_t ix = r % x;
    r /= x;
    const int64_t iy = r % y;
    const int64_t in = r / y;
    dst[i] = src[((in * x + ix) * y + iy) * v + u];
  }
}

template <class T>
int launch(const void* src, void* dst, int64_t n, int64_t x, int64_t y, int64_t v, cudaStream_t st) {
  const int64_t total = n * x * y * v;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16);
  swap_middle_kernel<T><<<static_cast<int>(blocks), kThreads, 0, st>>>(static_cast<const T*>(src),
                                                                      static_cast<T*>(dst), x, y, v, total);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int swap_middle_dims_16bit(const uint16_t* src, uint16_t* dst, int64_t n, int64_t x, int64_t y,
                           int64_t d, void* stream) {
  if (n < 0 || x < 0 || y < 0 || d < 0 || !src || !dst) return cudaErrorInvalidValue;
  if (n * x * y * d == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  const bool vec = d % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  return vec ? launch<uint4>(src, dst, n, x, y, d / 8, st) : launch<uint16_t>(src, dst, n, x, y, d, st);
}

}  // namespace rwd::kernels::cuda
