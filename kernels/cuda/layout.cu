// Layout copies (see layout.h): a grid-stride loop over the destination in order, so the
// stores are coalesced and each source run of d elements is read whole.
#include <cuda_bf16.h>
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

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// 8 FP32 values rounded to BF16 (to nearest even), or 8 BF16 values as they are.
__device__ __forceinline__ uint4 load_8(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], c = reinterpret_cast<const float4*>(p)[1];
  return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(c.x, c.y), pack_bf16(c.z, c.w));
}
__device__ __forceinline__ uint4 load_8(const uint16_t* p) { return *reinterpret_cast<const uint4*>(p); }

// dst, in order, in units of 8 elements; u: units per row of D. Src: FP32 (rounded) or BF16.
template <bool kToHeads, class Src>
__global__ void __launch_bounds__(kThreads)
    qkv_layout_kernel(const Src* __restrict__ src, uint4* __restrict__ dst, int64_t B, int64_t T, int64_t H,
                      int64_t u, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t iu = i % u;
    int64_t r = i / u, from;
    if constexpr (kToHeads) {  // dst (3, B, H, T) rows, src (B, T, 3, H)
      const int64_t t = r % T;
      r /= T;
      const int64_t h = r % H;
      r /= H;
      const int64_t b = r % B, s = r / B;
      from = ((b * T + t) * 3 + s) * H + h;
    } else {  // dst (B, T, 3, H) rows, src (3, B, H, T)
      const int64_t h = r % H;
      r /= H;
      const int64_t s = r % 3;
      r /= 3;
      const int64_t t = r % T, b = r / T;
      from = ((s * B + b) * H + h) * T + t;
    }
    dst[i] = load_8(src + (from * u + iu) * 8);
  }
}

template <class Src>
int launch_qkv_layout(const Src* src, uint16_t* dst, int64_t B, int64_t T, int64_t H, int64_t D, bool to_heads,
                      void* stream) {
  if (B < 0 || T < 0 || H < 0 || D < 0 || !src || !dst || D % 8 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(dst) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t u = D / 8, total = B * T * 3 * H * u;
  if (total == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16));
  auto* out = reinterpret_cast<uint4*>(dst);
  if (to_heads)
    qkv_layout_kernel<true><<<blocks, kThreads, 0, st>>>(src, out, B, T, H, u, total);
  else
    qkv_layout_kernel<false><<<blocks, kThreads, 0, st>>>(src, out, B, T, H, u, total);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int qkv_layout_to_bf16(const float* src, uint16_t* dst, int64_t B, int64_t T, int64_t H, int64_t D,
                       bool to_heads, void* stream) {
  return launch_qkv_layout(src, dst, B, T, H, D, to_heads, stream);
}

int qkv_layout_16bit(const uint16_t* src, uint16_t* dst, int64_t B, int64_t T, int64_t H, int64_t D,
                     bool to_heads, void* stream) {
  return launch_qkv_layout(src, dst, B, T, H, D, to_heads, stream);
}

int swap_middle_dims_16bit(const uint16_t* src, uint16_t* dst, int64_t n, int64_t x, int64_t y,
                           int64_t d, void* stream) {
  if (n < 0 || x < 0 || y < 0 || d < 0 || !src || !dst) return cudaErrorInvalidValue;
  if (n * x * y * d == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  const bool vec = d % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  return vec ? launch<uint4>(src, dst, n, x, y, d / 8, st) : launch<uint16_t>(src, dst, n, x, y, d, st);
}

}  // namespace rwd::kernels::cuda
