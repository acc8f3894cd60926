// Cross-entropy over BF16 logits (see cross_entropy.h). One block per row; each thread keeps
// an online (max, sum of exp(x - max)) over its strided share of the row, read 8 BF16 at a
// time where the row is 16-byte aligned; the block merges the pairs in a fixed tree (warp
// shuffles, then warp 0 in warp order), so the result does not depend on scheduling.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cross_entropy.h"

namespace rwd::kernels::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// The 8 BF16 values of one 16-byte load, widened.
__device__ __forceinline__ void unpack8(const uint4& u, float f[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = bf16_bits_to_f32(w[k] & 0xffffu);
    f[2 * k + 1] = bf16_bits_to_f32(w[k] >> 16);
  }
}

// s rescaled from max m to max mn >= m: s itself where m == mn (also both -inf: an empty part,
// whose exp(-inf - -inf) would be NaN), else s * exp(m - mn), which is 0 for an empty part.
__device__ __forceinline__ float rescale(float s, float m, float mn) { return m == mn ? s : s * expf(m - mn); }

// (m, s) <- the pair for the union of both parts. An empty part is (-inf, 0). A NaN logit
// makes s NaN (fmaxf skips it in m), which every merge keeps: the loss of such a row is NaN,
// as log_softmax's is.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = rescale(s, m, mn) + rescale(s2, m2, mn);
  m = mn;
}

// Adds n values to a thread's pair: one rescale for the lot.
template <int N>
__device__ __forceinline__ void add_values(float& m, float& s, const float (&f)[N]) {
  float mx = f[0];
#pragma unroll
  for (int k = 1; k < N; ++k) mx = fmaxf(mx, f[k]);
  const float mn = fmaxf(m, mx);
  float add = 0.f;
#pragma unroll
  for (int k = 0; k < N; ++k) add += expf(f[k] - mn);
  s = rescale(s, m, mn) + add;
  m = mn;
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    ce_forward_kernel(const uint16_t* logits, const int64_t* targets, int64_t vocab, float* lse,
                      float* loss) {
  const int64_t r = blockIdx.x;
  const uint16_t* x = logits + r * vocab;
  float m = -INFINITY, s = 0.f;
  if (kVec) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int64_t i = threadIdx.x; i < vocab / 8; i += kThreads) {
      float f[8];
      unpack8(xv[i], f);
      add_values(m, s, f);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      const float f[1] = {bf16_bits_to_f32(x[j])};
      add_values(m, s, f);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, off), s2 = __shfl_down_sync(0xffffffffu, s, off);
    merge(m, s, m2, s2);
  }
  __shared__ float wm[kWarps], ws[kWarps];
  if (threadIdx.x % 32 == 0) {
    wm[threadIdx.x / 32] = m;
    ws[threadIdx.x / 32] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    m = wm[0];
    s = ws[0];
    for (int w = 1; w < kWarps; ++w) merge(m, s, wm[w], ws[w]);
    const float l = m + logf(s);
    lse[r] = l;
    loss[r] = l - bf16_bits_to_f32(x[targets[r]]);
  }
}

__device__ __forceinline__ float ce_grad(float x, float l, bool is_target, float scale) {
  return (expf(x - l) - (is_target ? 1.f : 0.f)) * scale;
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(const uint16_t* logits, const int64_t* targets, const float* lse,
                       const float* scale, int64_t vocab, uint16_t* dlogits) {
  const int64_t r = blockIdx.x;
  const uint16_t* x = logits + r * vocab;
  uint16_t* d = dlogits + r * vocab;
  const float l = lse[r], sc = scale[0];
  const int64_t t = targets[r];
  if (kVec) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint4* dv = reinterpret_cast<uint4*>(d);
    for (int64_t i = threadIdx.x; i < vocab / 8; i += kThreads) {
      float f[8];
      unpack8(xv[i], f);
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t j = 8 * i + 2 * k;
        w[k] = f32_to_bf16_bits(ce_grad(f[2 * k], l, j == t, sc)) |
               (f32_to_bf16_bits(ce_grad(f[2 * k + 1], l, j + 1 == t, sc)) << 16);
      }
      dv[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads)
      d[j] = static_cast<uint16_t>(f32_to_bf16_bits(ce_grad(bf16_bits_to_f32(x[j]), l, j == t, sc)));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int cross_entropy_forward(const uint16_t* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                          float* lse, float* loss, void* stream) {
  if (rows <= 0 || vocab <= 0) return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  if (vocab % 8 == 0 && aligned16(logits))
    ce_forward_kernel<true><<<rows, kThreads, 0, st>>>(logits, targets, vocab, lse, loss);
  else
    ce_forward_kernel<false><<<rows, kThreads, 0, st>>>(logits, targets, vocab, lse, loss);
  return static_cast<int>(cudaGetLastError());
}

int cross_entropy_backward(const uint16_t* logits, const int64_t* targets, const float* lse,
                           const float* scale, int64_t rows, int64_t vocab, uint16_t* dlogits,
                           void* stream) {
  if (rows <= 0 || vocab <= 0) return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  if (vocab % 8 == 0 && aligned16(logits) && aligned16(dlogits))
    ce_backward_kernel<true><<<rows, kThreads, 0, st>>>(logits, targets, lse, scale, vocab, dlogits);
  else
    ce_backward_kernel<false><<<rows, kThreads, 0, st>>>(logits, targets, lse, scale, vocab, dlogits);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace rwd::kernels::cuda
