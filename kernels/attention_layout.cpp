// Layout moves of the BF16 attention path (attention_layout.h): our copy kernels (layout.h) on
// a GPU where the views have the layouts models make, LibTorch's copies otherwise.
#include "kernels/attention_layout.h"

#include <cstdint>

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/cuda/layout.h"
#endif

namespace rwd::kernels {
namespace {

using torch::Tensor;

#ifdef REWIND_CUDA
bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }
uint16_t* bits(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }
void check(int rc, const char* what) {
  TORCH_CHECK(rc == 0, "attention layout (", what, "): CUDA launch failed (error ", rc, ")");
}
void* stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// x (B, H, T, D) is the transposed view of a dense (B, T, H, D) tensor.
bool transposed_heads(const Tensor& x) {
  const int64_t H = x.size(1), T = x.size(2), D = x.size(3);
  return x.stride(3) == 1 && x.stride(2) == H * D && x.stride(1) == D && (x.size(0) == 1 || x.stride(0) == T * H * D);
}
// Where q, k, v are the three (B, H, T, D) views of one (B, T, 3, H, D) buffer.
bool fused_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t H = q.size(1), T = q.size(2), D = q.size(3), C = H * D;
  const auto* base = static_cast<const uint16_t*>(q.data_ptr());
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->stride(3) != 1 || t->stride(2) != 3 * C || t->stride(1) != D ||
        (t->size(0) != 1 && t->stride(0) != T * 3 * C))
      return false;
  }
  return k.data_ptr() == base + C && v.data_ptr() == base + 2 * C;
}
#endif

}  // namespace

Tensor stack_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) {
#ifdef REWIND_CUDA
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  if (q.is_cuda() && D % 8 == 0 && q.scalar_type() == torch::kBFloat16) {
    Tensor out = torch::empty({3, B, H, T, D}, q.options());
    if (fused_qkv(q, k, v) && aligned(q) && aligned(out)) {
      check(cuda::qkv_layout_16bit(bits(q), bits(out), B, T, H, D, /*to_heads=*/true, stream()), "qkv");
      return out;
    }
    if (transposed_heads(q) && transposed_heads(k) && transposed_heads(v) && aligned(q) && aligned(k) &&
        aligned(v) && aligned(out)) {
      int i = 0;
      for (const Tensor* t : {&q, &k, &v}) {
        check(cuda::swap_middle_dims_16bit(bits(*t), bits(out[i++]), B, T, H, D, stream()), "heads");
      }
      return out;
    }
  }
#endif
  return torch::stack({q, k, v});
}

std::vector<int64_t> qkv_grad_strides(int64_t B, int64_t H, int64_t T, int64_t D) {
  (void)B;
  const int64_t C = H * D;
  return {C, T * 3 * C, D, 3 * C, 1};  // (3, B, H, T, D) over a (B, T, 3, H, D) buffer
}

Tensor qkv_grad_bf16(const Tensor& dqkv) {
  TORCH_CHECK(dqkv.dim() == 5 && dqkv.size(0) == 3, "attention layout: dqkv must be (3, B, H, T, D)");
  const int64_t B = dqkv.size(1), H = dqkv.size(2), T = dqkv.size(3), D = dqkv.size(4);
  Tensor out = torch::empty_strided(dqkv.sizes(), qkv_grad_strides(B, H, T, D),
                                    dqkv.options().dtype(torch::kBFloat16));
#ifdef REWIND_CUDA
  if (dqkv.is_cuda() && dqkv.is_contiguous() && dqkv.scalar_type() == torch::kFloat32 && D % 8 == 0 &&
      aligned(dqkv) && aligned(out)) {
    check(cuda::qkv_layout_to_bf16(dqkv.data_ptr<float>(), bits(out), B, T, H, D, /*to_heads=*/false, stream()),
          "dqkv");
    return out;
  }
#endif
  return out.copy_(dqkv);
}

Tensor dense_heads_bf16(const Tensor& x) {
#ifdef REWIND_CUDA
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  if (x.is_cuda() && x.scalar_type() == torch::kBFloat16 && D % 8 == 0 && transposed_heads(x) && aligned(x)) {
    Tensor out = torch::empty({B, H, T, D}, x.options());
    check(cuda::swap_middle_dims_16bit(bits(x), bits(out), B, T, H, D, stream()), "dO");
    return out;
  }
#endif
  return x.to(torch::kBFloat16).contiguous();
}

}  // namespace rwd::kernels
