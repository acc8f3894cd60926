// Gradient norm and fused AdamW over many tensors (see optimizer.h). Each launch takes up to
// kSegs tensors by value (under the classic 4 KB kernel-parameter limit) and gives each block
// one chunk of kChunk elements of one tensor. Every sum runs in a fixed order (per thread,
// then a fixed tree), so the norm is bitwise repeatable; AdamW is elementwise.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/hash.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/segment_batch.cuh"

namespace rwd::kernels::cuda {

namespace {

constexpr int kSegs = 64;
constexpr int64_t kChunk = 32768;
constexpr int kThreads = 256;

using Batch = SegmentBatch<AdamSegment, kSegs, kChunk>;

// Fixed-order block sum of one double per thread; the result in thread 0.
__device__ __forceinline__ double block_sum(double x) {
  __shared__ double warp_sums[kThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_down_sync(0xffffffffu, x, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

__global__ void __launch_bounds__(kThreads) sumsq_kernel(const Batch b, double* partials) {
  int s;
  int64_t begin, end;
  b.block_range(s, begin, end);
  const float* g = b.seg[s].g;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double x = g[i];
    acc = fma(x, x, acc);
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads) finish_kernel(const double* partials, int64_t n, double* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = sqrt(total);
}

__device__ __forceinline__ float adam_one(float& p, float g, float& m, float& v, bool decay,
                                          const AdamScalars& c) {
  const int var = c.variant;
  if (c.scale_g) g = __fmul_rn(g, c.gscale);
  if (decay) p = __fmul_rn(p, c.decay);
  m = __fmul_rn(m, c.b1);
  m = (var % 2 == 0) ? __fmaf_rn(c.a1, g, m) : __fadd_rn(m, __fmul_rn(c.a1, g));
  v = __fmul_rn(v, c.b2);
  switch (var / 2 % 4) {
    case 0: v = __fmaf_rn(__fmul_rn(c.a2, g), g, v); break;
    case 1: v = __fmaf_rn(c.a2, __fmul_rn(g, g), v); break;
    case 2: v = __fadd_rn(v, __fmul_rn(__fmul_rn(c.a2, g), g)); break;
    default: v = __fadd_rn(v, __fmul_rn(c.a2, __fmul_rn(g, g))); break;
  }
  float d;
  switch (var / 8 % 3) {
    case 0: d = __fdiv_rn(v, c.bc2); break;
    case 1: d = __fmul_rn(v, c.rbc2_d); break;
    default: d = __fmul_rn(v, c.rbc2_f); break;
  }
  d = __fadd_rn(__fsqrt_rn(d), c.eps);
  const float q = __fdiv_rn(m, d);
  p = (var / 24 == 0) ? __fmaf_rn(c.step, q, p) : __fadd_rn(p, __fmul_rn(c.step, q));
  return g;
}

// Four elements through adam_one: the same arithmetic per element as the scalar loop.
__device__ __forceinline__ void adam_four(float4& p, float4& g, float4& m, float4& v, bool decay,
                                          const AdamScalars& c) {
  g.x = adam_one(p.x, g.x, m.x, v.x, decay, c);
  g.y = adam_one(p.y, g.y, m.y, v.y, decay, c);
  g.z = adam_one(p.z, g.z, m.z, v.z, decay, c);
  g.w = adam_one(p.w, g.w, m.w, v.w, decay, c);
}

// The digest terms of four updated parameters at indices 4j .. 4j+3.
__device__ __forceinline__ uint64_t digest_four(const float4& p, int64_t j) {
  const uint64_t i = static_cast<uint64_t>(4 * j);
  return digest_term(__float_as_uint(p.x), i) + digest_term(__float_as_uint(p.y), i + 1) +
         digest_term(__float_as_uint(p.z), i + 2) + digest_term(__float_as_uint(p.w), i + 3);
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(const Batch b, const AdamScalars c) {
  int s;
  int64_t begin, end;
  b.block_range(s, begin, end);
  const AdamSegment& t = b.seg[s];
  const bool decay = t.decay != 0;
  const bool digest = t.digest != nullptr;
  uint64_t dsum = 0;
  const auto addr = [](const float* x) { return reinterpret_cast<uintptr_t>(x); };
  if (((addr(t.p) | addr(t.g) | addr(t.m) | addr(t.v)) & 15) == 0) {
    // 16-byte loads and stores (begin is a multiple of kChunk, so of 4): twice the bytes in
    // flight per thread of the scalar loop below, which then takes the tail.
    float4* p4 = reinterpret_cast<float4*>(t.p);
    float4* g4 = reinterpret_cast<float4*>(t.g);
    float4* m4 = reinterpret_cast<float4*>(t.m);
    float4* v4 = reinterpret_cast<float4*>(t.v);
    const int64_t vend = end / 4;
    for (int64_t j = begin / 4 + threadIdx.x; j < vend; j += 2 * kThreads) {
      const int64_t j2 = j + kThreads;
      const bool two = j2 < vend;
      float4 p[2], g[2], m[2], v[2];
      p[0] = p4[j]; g[0] = g4[j]; m[0] = m4[j]; v[0] = v4[j];
      if (two) { p[1] = p4[j2]; g[1] = g4[j2]; m[1] = m4[j2]; v[1] = v4[j2]; }
      adam_four(p[0], g[0], m[0], v[0], decay, c);
      p4[j] = p[0]; m4[j] = m[0]; v4[j] = v[0];
      if (c.scale_g) g4[j] = g[0];
      if (digest) dsum += digest_four(p[0], j);
      if (two) {
        adam_four(p[1], g[1], m[1], v[1], decay, c);
        p4[j2] = p[1]; m4[j2] = m[1]; v4[j2] = v[1];
        if (c.scale_g) g4[j2] = g[1];
        if (digest) dsum += digest_four(p[1], j2);
      }
    }
    begin = max(begin, vend * 4);
  }
  constexpr int kUnroll = 4;
  for (int64_t base = begin + threadIdx.x; base < end; base += kUnroll * kThreads) {
    float p[kUnroll], g[kUnroll], m[kUnroll], v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < end) {
        p[u] = t.p[i];
        g[u] = t.g[i];
        m[u] = t.m[i];
        v[u] = t.v[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < end) {
        const float gs = adam_one(p[u], g[u], m[u], v[u], decay, c);
        t.p[i] = p[u];
        t.m[i] = m[u];
        t.v[i] = v[u];
        if (c.scale_g) t.g[i] = gs;
        if (digest) dsum += digest_term(__float_as_uint(p[u]), static_cast<uint64_t>(i));
      }
    }
  }
  if (digest) {  // uniform per block: every thread of the block takes this branch
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dsum += __shfl_down_sync(0xffffffffu, dsum, off);
    if (threadIdx.x % 32 == 0 && dsum != 0) atomicAdd(t.digest, static_cast<unsigned long long>(dsum));
  }
}

bool valid(const AdamSegment* segs, int count) {
  if (count < 0 || (count > 0 && segs == nullptr)) return false;
  for (int k = 0; k < count; ++k)
    if (segs[k].n < 1 || !segs[k].p || !segs[k].g || !segs[k].m || !segs[k].v) return false;
  return true;
}

}  // namespace

int64_t sumsq_partial_count(const AdamSegment* segs, int count) {
  int64_t n = 0;
  for (int k = 0; k < count; ++k) n += Batch::chunks_of(segs[k].n);
  return n;
}

int grad_sumsq_sqrt(const AdamSegment* segs, int count, double* partials, double* out, void* stream) {
  if (!valid(segs, count) || partials == nullptr || out == nullptr) return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  int64_t done = 0;
  for (int first = 0; first < count; first += kSegs) {
    const Batch b = Batch::pack(segs, first, std::min(kSegs, count - first));
    const int64_t blocks = b.blocks();
    sumsq_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(b, partials + done);
    done += blocks;
  }
  finish_kernel<<<1, kThreads, 0, st>>>(partials, done, out);
  return cudaGetLastError();
}

int adamw_update(const AdamSegment* segs, int count, const AdamScalars& s, void* stream) {
  if (!valid(segs, count) || s.variant < 0 || s.variant >= kAdamVariants) return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  for (int first = 0; first < count; first += kSegs) {
    const Batch b = Batch::pack(segs, first, std::min(kSegs, count - first));
    adamw_kernel<<<static_cast<unsigned>(b.blocks()), kThreads, 0, st>>>(b, s);
  }
  return cudaGetLastError();
}

}  // namespace rwd::kernels::cuda
