// LayerNorm forward and backward over FP32 rows (see layer_norm.h). One warp a row: each lane
// sums its strided share of the row's 4-value chunks in chunk order, then a xor butterfly
// (which gives every lane the same sum) finishes the row. The weight gradient is summed per
// warp over its rows in shared memory, then per block over its warps, then over the blocks by
// a second kernel, each in index order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/layer_norm.h"

namespace rwd::kernels::cuda {

namespace {

constexpr int kWarps = 8;        // warps (rows in flight) a block
constexpr int kRowsPerWarp = 4;  // backward: rows a warp sums into its weight-gradient row
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Chunk j (4 values) of the row at `off`, widened to FP32.
__device__ __forceinline__ void load4(const float* p, int64_t off, int j, float (&v)[4]) {
  const float4 u = reinterpret_cast<const float4*>(p + off)[j];
  v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
}
__device__ __forceinline__ void load4(const uint16_t* p, int64_t off, int j, float (&v)[4]) {
  const uint2 u = reinterpret_cast<const uint2*>(p + off)[j];
  v[0] = bf16_bits_to_f32(u.x & 0xffffu), v[1] = bf16_bits_to_f32(u.x >> 16);
  v[2] = bf16_bits_to_f32(u.y & 0xffffu), v[3] = bf16_bits_to_f32(u.y >> 16);
}
__device__ __forceinline__ void store4(float* p, int64_t off, int j, const float (&v)[4]) {
  reinterpret_cast<float4*>(p + off)[j] = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(uint16_t* p, int64_t off, int j, const float (&v)[4]) {
  reinterpret_cast<uint2*>(p + off)[j] = make_uint2(f32_to_bf16_bits(v[0]) | (f32_to_bf16_bits(v[1]) << 16),
                                                    f32_to_bf16_bits(v[2]) | (f32_to_bf16_bits(v[3]) << 16));
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
  return s;
}

// Chunk j of v = x (+ residual): the same FP32 add as LibTorch's x + r.
template <bool kRes>
__device__ __forceinline__ void load_v(const float* x, const uint16_t* res, int64_t off, int j, float (&v)[4]) {
  load4(x, off, j, v);
  if constexpr (kRes) {
    float r[4];
    load4(res, off, j, r);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __fadd_rn(v[k], r[k]);
  }
}

template <bool kRes>
__global__ void __launch_bounds__(kThreads)
    ln_forward_kernel(const float* __restrict__ x, const uint16_t* __restrict__ res, const float* __restrict__ w,
                      int64_t rows, int C, float eps, float* __restrict__ y_out, float* __restrict__ out_f32,
                      uint16_t* __restrict__ out_bf16, float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int n4 = C / 4;
  const int64_t off = row * C;
  float v[4], s = 0.f;
  for (int j = lane; j < n4; j += 32) {
    load_v<kRes>(x, res, off, j, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) s = __fadd_rn(s, v[k]);
  }
  const float mean = __fdiv_rn(warp_sum(s), float(C));
  float ss = 0.f;
  for (int j = lane; j < n4; j += 32) {
    load_v<kRes>(x, res, off, j, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float d = __fsub_rn(v[k], mean);
      ss = __fmaf_rn(d, d, ss);
    }
  }
  const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(warp_sum(ss), float(C)), eps));
  for (int j = lane; j < n4; j += 32) {
    load_v<kRes>(x, res, off, j, v);
    float g[4], o[4];
    load4(w, 0, j, g);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = __fmul_rn(__fmul_rn(__fsub_rn(v[k], mean), rstd), g[k]);
    if (kRes && y_out) store4(y_out, off, j, v);
    if (out_f32) store4(out_f32, off, j, o);
    if (out_bf16) store4(out_bf16, off, j, o);
  }
  if (lane == 0) mean_out[row] = mean, rstd_out[row] = rstd;
}

template <typename G, bool kRes>
__global__ void __launch_bounds__(kThreads)
    ln_backward_kernel(const G* __restrict__ g, const float* __restrict__ x, const float* __restrict__ mean,
                       const float* __restrict__ rstd, const float* __restrict__ w, const float* __restrict__ res,
                       int64_t rows, int C, float* __restrict__ dx, uint16_t* __restrict__ dx_bf16,
                       float* __restrict__ partial) {
  extern __shared__ float acc[];  // kWarps x C: each warp's sum of g * xhat over its rows
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n4 = C / 4;
  float* mine = acc + warp * C;
  for (int j = lane; j < n4; j += 32) reinterpret_cast<float4*>(mine)[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t first = (int64_t(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t row = first + i;
    if (row >= rows) break;
    const int64_t off = row * C;
    const float m = mean[row], rs = rstd[row];
    float v[4], gg[4], ww[4], a[4], s1 = 0.f, s2 = 0.f;
    for (int j = lane; j < n4; j += 32) {
      load4(x, off, j, v);
      load4(g, off, j, gg);
      load4(w, 0, j, ww);
      load4(mine, 0, j, a);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float xh = __fmul_rn(__fsub_rn(v[k], m), rs), gw = __fmul_rn(gg[k], ww[k]);
        s1 = __fmaf_rn(gw, xh, s1);
        s2 = __fadd_rn(s2, gw);
        a[k] = __fmaf_rn(gg[k], xh, a[k]);
      }
      store4(mine, 0, j, a);
    }
    const float c1 = __fdiv_rn(warp_sum(s1), float(C)), c2 = __fdiv_rn(warp_sum(s2), float(C));
    for (int j = lane; j < n4; j += 32) {
      load4(x, off, j, v);
      load4(g, off, j, gg);
      load4(w, 0, j, ww);
      float d[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float xh = __fmul_rn(__fsub_rn(v[k], m), rs), gw = __fmul_rn(gg[k], ww[k]);
        d[k] = __fmul_rn(rs, __fsub_rn(__fsub_rn(gw, __fmul_rn(xh, c1)), c2));
      }
      if constexpr (kRes) {
        float r[4];
        load4(res, off, j, r);
#pragma unroll
        for (int k = 0; k < 4; ++k) d[k] = __fadd_rn(r[k], d[k]);
      }
      store4(dx, off, j, d);
      if (dx_bf16) store4(dx_bf16, off, j, d);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float t = acc[c];
    for (int k = 1; k < kWarps; ++k) t = __fadd_rn(t, acc[k * C + c]);
    partial[int64_t(blockIdx.x) * C + c] = t;
  }
}

// dw[c] = the blocks' partial sums of column c: 32 groups of blocks (b = group mod 32), each
// summed in order, then the 32 group sums in order.
__global__ void __launch_bounds__(1024) ln_dw_finish_kernel(const float* __restrict__ partial, int64_t blocks,
                                                             int C, float* __restrict__ dw) {
  __shared__ float part[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float t = 0.f;
  if (c < C)
    for (int64_t b = threadIdx.y; b < blocks; b += 32) t = __fadd_rn(t, partial[b * C + c]);
  part[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = part[0][threadIdx.x];
    for (int k = 1; k < 32; ++k) s = __fadd_rn(s, part[k][threadIdx.x]);
    dw[c] = s;
  }
}

int64_t backward_blocks(int64_t rows) { return (rows + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp); }

template <typename G, bool kRes>
int launch_backward(const G* g, const float* x, const float* mean, const float* rstd, const float* w,
                    const float* res, int64_t rows, int C, float* dx, uint16_t* dx_bf16, float* ws,
                    cudaStream_t s) {
  const size_t smem = sizeof(float) * kWarps * C;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(ln_backward_kernel<G, kRes>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return int(e);
  }
  ln_backward_kernel<G, kRes><<<unsigned(backward_blocks(rows)), kThreads, smem, s>>>(g, x, mean, rstd, w, res, rows,
                                                                                     C, dx, dx_bf16, ws);
  return int(cudaGetLastError());
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool layer_norm_supports(int64_t C) { return C > 0 && C % 4 == 0 && C <= kLayerNormMaxWidth; }

int layer_norm_forward(const float* x, const uint16_t* residual, const float* w, int64_t rows, int64_t C,
                       float eps, float* y_out, float* out_f32, uint16_t* out_bf16, float* mean, float* rstd,
                       void* stream) {
  if (!layer_norm_supports(C) || !aligned16(x) || !aligned16(w) || (residual && !aligned16(residual)))
    return int(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = unsigned((rows + kWarps - 1) / kWarps);
  if (residual)
    ln_forward_kernel<true><<<grid, kThreads, 0, s>>>(x, residual, w, rows, int(C), eps, y_out, out_f32, out_bf16,
                                                      mean, rstd);
  else
    ln_forward_kernel<false><<<grid, kThreads, 0, s>>>(x, nullptr, w, rows, int(C), eps, nullptr, out_f32, out_bf16,
                                                       mean, rstd);
  return int(cudaGetLastError());
}

int64_t layer_norm_backward_workspace(int64_t rows, int64_t C) { return backward_blocks(rows) * C; }

int layer_norm_backward(const float* g_f32, const uint16_t* g_bf16, const float* x, const float* mean,
                        const float* rstd, const float* w, const float* residual, int64_t rows, int64_t C,
                        float* dx, uint16_t* dx_bf16, float* dw, float* workspace, void* stream) {
  if (!layer_norm_supports(C) || (g_f32 == nullptr) == (g_bf16 == nullptr)) return int(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  const int c = int(C);
  int rc = 0;
  if (rows > 0) {
    if (g_bf16)
      rc = residual ? launch_backward<uint16_t, true>(g_bf16, x, mean, rstd, w, residual, rows, c, dx, dx_bf16, workspace, s)
                    : launch_backward<uint16_t, false>(g_bf16, x, mean, rstd, w, nullptr, rows, c, dx, dx_bf16, workspace, s);
    else
      rc = residual ? launch_backward<float, true>(g_f32, x, mean, rstd, w, residual, rows, c, dx, dx_bf16, workspace, s)
                    : launch_backward<float, false>(g_f32, x, mean, rstd, w, nullptr, rows, c, dx, dx_bf16, workspace, s);
    if (rc != 0) return rc;
  }
  ln_dw_finish_kernel<<<unsigned((C + 31) / 32), dim3(32, 32), 0, s>>>(workspace, backward_blocks(rows), c, dw);
  return int(cudaGetLastError());
}

}  // namespace rwd::kernels::cuda
