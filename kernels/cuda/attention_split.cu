// The split-BF16 planes of the FP32 operands (attention_split.cuh) for the heads that take the
// FP32 tensor-core variants: forward q, k for qk=fp32, v for pv=fp32; backward also q, k, v and
// dO for bwd=fp32.
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_split.cuh"

namespace rwd::kernels::cuda {

namespace {

constexpr int kSplitThreads = 256;
constexpr int kPlanesTotal = 12;  // q, k, v, dO x three planes

// Grid (ceil(T D / (4 * 256)), B*H, 3 or 4 operands). Four consecutive elements per thread.
__global__ void split_kernel(KernelArgs a, int dim, uint16_t* ws, bool backward) {
  const HeadFlags& hf = a.flags[blockIdx.y % a.heads];
  const FlagView f = decode_flags(hf);
  if (backward ? backward_needs_simt(f, a.simt_fp32) : forward_variant(hf, false, a.simt_fp32) < 0) return;
  const int which = blockIdx.z;  // 0 q, 1 k, 2 v, 3 dO
  const bool need = which < 2    ? f.qk_f32 || (backward && f.bwd_f32)
                    : which == 2 ? f.pv_f32 || (backward && f.bwd_f32)
                                 : f.bwd_f32;
  if (!need) return;
  const float* src = which == 0 ? a.q32 : which == 1 ? a.k32 : which == 2 ? a.v32 : a.do32;
  const size_t per_head = static_cast<size_t>(a.seq) * dim;
  const size_t n = per_head * a.batch * a.heads;
  const size_t i = static_cast<size_t>(blockIdx.x * kSplitThreads + threadIdx.x) * 4;
  if (i >= per_head) return;  // dim is a multiple of 4, so a quad never straddles heads
  const size_t off = blockIdx.y * per_head + i;
  float4 x;
  if (src != nullptr) {
    x = *reinterpret_cast<const float4*>(src + off);
  } else {  // dO without its FP32 copy: the BF16 values
    const uint2 b = *reinterpret_cast<const uint2*>(a.d_o + off);
    x = make_float4(bf16_bits_to_float(b.x & 0xffffu), bf16_bits_to_float(b.x >> 16),
                    bf16_bits_to_float(b.y & 0xffffu), bf16_bits_to_float(b.y >> 16));
  }
  const Split3 s[4] = {split3(x.x), split3(x.y), split3(x.z), split3(x.w)};
  uint16_t* out = ws + which * 3 * n + off;
  *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(s[0].x0, s[1].x0), pack_bf16x2(s[2].x0, s[3].x0));
  *reinterpret_cast<uint2*>(out + n) = make_uint2(pack_bf16x2(s[0].x1, s[1].x1), pack_bf16x2(s[2].x1, s[3].x1));
  *reinterpret_cast<uint2*>(out + 2 * n) = make_uint2(pack_bf16x2(s[0].x2, s[1].x2), pack_bf16x2(s[2].x2, s[3].x2));
}

}  // namespace

size_t split_bytes(const AttentionParams& p, const HeadFlags* host_flags) {
  if (!split_head_dim(p.dim)) return 0;  // FP32 heads of this dim take the SIMT kernels
  bool any = host_flags == nullptr;
  for (int h = 0; h < p.heads && !any; ++h) {
    for (Op op : {Op::kQk, Op::kSoftmax, Op::kPv, Op::kDelta, Op::kBwd}) {
      any = any || host_flags[h].prec[static_cast<int>(op)] == Prec::kFp32;
    }
  }
  const size_t n = static_cast<size_t>(p.batch) * p.heads * p.seq * p.dim;
  return any ? kPlanesTotal * n * sizeof(uint16_t) : 0;
}

int launch_split(KernelArgs& a, int dim, void* ws, bool backward, cudaStream_t stream) {
  uint16_t* w = static_cast<uint16_t*>(ws);
  const size_t n = static_cast<size_t>(a.batch) * a.heads * a.seq * dim;
  for (int i = 0; i < 3; ++i) {
    a.q_pl[i] = w + i * n;
    a.k_pl[i] = w + (3 + i) * n;
    a.v_pl[i] = w + (6 + i) * n;
    a.do_pl[i] = w + (9 + i) * n;
  }
  const size_t per_head = static_cast<size_t>(a.seq) * dim;
  const dim3 grid(static_cast<unsigned>((per_head / 4 + kSplitThreads - 1) / kSplitThreads),
                  a.batch * a.heads, backward ? 4 : 3);
  split_kernel<<<grid, kSplitThreads, 0, stream>>>(a, dim, w, backward);
  return cudaGetLastError();
}

}  // namespace rwd::kernels::cuda
