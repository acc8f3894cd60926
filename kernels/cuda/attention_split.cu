// The split-BF16 planes of the FP32 operands (attention_split.cuh) for the heads that take the
// FP32 tensor-core forward: q, k for qk=fp32 (or softmax=fp32), v for pv=fp32.
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"

namespace rwd::kernels::cuda {

namespace {

constexpr int kSplitThreads = 256;
constexpr int kPlanesTotal = 9;  // q, k, v x three planes

// Grid (ceil(T D / (4 * 256)), B*H, 3 operands). Four consecutive elements per thread.
__global__ void split_kernel(KernelArgs a, int dim, uint16_t* ws) {
  const HeadFlags& hf = a.flags[blockIdx.y % a.heads];
  if (forward_variant(hf, false, a.simt_fp32) < 0 || !forward_fp32(hf)) return;
  const FlagView f = decode_flags(hf);
  const int which = blockIdx.z;  // 0 q, 1 k, 2 v
  if (which < 2 ? !f.qk_f32 : !f.pv_f32) return;
  const float* src = which == 0 ? a.q32 : which == 1 ? a.k32 : a.v32;
  const size_t per_head = static_cast<size_t>(a.seq) * dim;
  const size_t n = per_head * a.batch * a.heads;
  const size_t i = static_cast<size_t>(blockIdx.x * kSplitThreads + threadIdx.x) * 4;
  if (i >= per_head) return;  // dim is a multiple of 4, so a quad never straddles heads
  const size_t off = blockIdx.y * per_head + i;
  const float4 x = *reinterpret_cast<const float4*>(src + off);
  const Split3 s[4] = {split3(x.x), split3(x.y), split3(x.z), split3(x.w)};
  uint16_t* out = ws + which * 3 * n + off;
  *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(s[0].x0, s[1].x0), pack_bf16x2(s[2].x0, s[3].x0));
  *reinterpret_cast<uint2*>(out + n) = make_uint2(pack_bf16x2(s[0].x1, s[1].x1), pack_bf16x2(s[2].x1, s[3].x1));
  *reinterpret_cast<uint2*>(out + 2 * n) = make_uint2(pack_bf16x2(s[0].x2, s[1].x2), pack_bf16x2(s[2].x2, s[3].x2));
}

}  // namespace

size_t split_bytes(const AttentionParams& p, const HeadFlags* host_flags) {
  bool any = host_flags == nullptr;
  for (int h = 0; h < p.heads && !any; ++h) any = forward_fp32(host_flags[h]);
  const size_t n = static_cast<size_t>(p.batch) * p.heads * p.seq * p.dim;
  return any ? kPlanesTotal * n * sizeof(uint16_t) : 0;
}

int launch_split(KernelArgs& a, int dim, void* ws, cudaStream_t stream) {
  uint16_t* w = static_cast<uint16_t*>(ws);
  const size_t n = static_cast<size_t>(a.batch) * a.heads * a.seq * dim;
  for (int i = 0; i < 3; ++i) {
    a.q_pl[i] = w + i * n;
    a.k_pl[i] = w + (3 + i) * n;
    a.v_pl[i] = w + (6 + i) * n;
  }
  const size_t per_head = static_cast<size_t>(a.seq) * dim;
  const dim3 grid(static_cast<unsigned>((per_head / 4 + kSplitThreads - 1) / kSplitThreads),
                  a.batch * a.heads, 3);
  split_kernel<<<grid, kSplitThreads, 0, stream>>>(a, dim, w);
  return cudaGetLastError();
}

}  // namespace rwd::kernels::cuda
