// Layout moves of the BF16 attention path (attention_layout.h): our copy kernels (layout.h) on
// a GPU where the tensors have the layouts models make, LibTorch's copies otherwise.
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

// dst (n, y, x, d) = t (n, x, y, d), both dense; BF16 on a GPU.
void swap_into(const Tensor& t, Tensor dst) {
#ifdef REWIND_CUDA
  if (t.is_cuda()) {
    TORCH_CHECK(t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && t.dim() == 4,
                "attention layout: the heads' transpose takes a contiguous 4-d BF16 tensor");
    check(cuda::swap_middle_dims_16bit(bits(t), bits(dst), t.size(0), t.size(1), t.size(2), t.size(3), stream()),
          "heads");
    return;
  }
#endif
  dst.copy_(t.permute({0, 2, 1, 3}));
}

// src's values, FP32 (rounded to nearest even) or BF16, moved into the dense BF16 dst: from
// (B, T, 3, H, D) (src dense, or for BF16 its strided view) to (3, B, H, T, D) (to_heads), or
// from dense (3, B, H, T, D) back.
void relayout_into(const Tensor& src, Tensor dst, int64_t B, int64_t T, int64_t H, int64_t D, bool to_heads) {
#ifdef REWIND_CUDA
  if (src.is_cuda() && D % 8 == 0 && aligned(src) && aligned(dst)) {
    if (src.scalar_type() == torch::kFloat32 && src.is_contiguous()) {
      check(cuda::qkv_layout_to_bf16(src.data_ptr<float>(), bits(dst), B, T, H, D, to_heads, stream()), "qkv");
      return;
    }
    if (src.scalar_type() == torch::kBFloat16) {  // the callers' BF16 views are laid out as named
      check(cuda::qkv_layout_16bit(bits(src), bits(dst), B, T, H, D, to_heads, stream()), "qkv");
      return;
    }
  }
#endif
  dst.copy_(to_heads ? src.reshape({B, T, 3, H, D}).permute({2, 0, 3, 1, 4}) : src.permute({1, 3, 0, 2, 4}));
}

}  // namespace

Tensor swap_heads_bf16(const Tensor& t) {
  TORCH_CHECK(t.dim() == 4, "attention layout: the heads' transpose takes a 4-d tensor");
  Tensor out = torch::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options());
  swap_into(t, out);
  return out;
}

Tensor qkv_relayout(const Tensor& src, int64_t B, int64_t T, int64_t H, int64_t D, bool to_heads) {
  const auto bf16 = src.options().dtype(torch::kBFloat16);
  Tensor out = to_heads ? torch::empty({3, B, H, T, D}, bf16) : torch::empty({B, T, 3, H, D}, bf16);
  relayout_into(src, out, B, T, H, D, to_heads);
  return out;
}

Tensor stack_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) {
#ifdef REWIND_CUDA
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), C = H * D;
  if (q.is_cuda() && D % 8 == 0 && q.scalar_type() == torch::kBFloat16) {
    if (fused_qkv(q, k, v)) {  // the (B, T, 3, H, D) buffer the views are made of
      Tensor out = torch::empty({3, B, H, T, D}, q.options());
      relayout_into(q.as_strided({B, T, 3, H, D}, {T * 3 * C, 3 * C, C, D, 1}), out, B, T, H, D, true);
      return out;
    }
    if (transposed_heads(q) && transposed_heads(k) && transposed_heads(v)) {
      Tensor out = torch::empty({3, B, H, T, D}, q.options());
      int i = 0;
      for (const Tensor* t : {&q, &k, &v}) swap_into(t->transpose(1, 2), out[i++]);
      return out;
    }
  }
#endif
  return torch::stack({q, k, v});
}

Tensor qkv_grad_bf16(const Tensor& dqkv) {
  TORCH_CHECK(dqkv.dim() == 5 && dqkv.size(0) == 3, "attention layout: dqkv must be (3, B, H, T, D)");
  const int64_t B = dqkv.size(1), H = dqkv.size(2), T = dqkv.size(3), D = dqkv.size(4), C = H * D;
  // (3, B, H, T, D) over a dense (B, T, 3, H, D) buffer; not a view, so a custom op may return it.
  Tensor out = torch::empty_strided(dqkv.sizes(), {C, T * 3 * C, D, 3 * C, 1}, dqkv.options().dtype(torch::kBFloat16));
  relayout_into(dqkv.contiguous(), out.permute({1, 3, 0, 2, 4}), B, T, H, D, /*to_heads=*/false);
  return out;
}

Tensor dense_heads_bf16(const Tensor& x) {
#ifdef REWIND_CUDA
  if (x.is_cuda() && x.scalar_type() == torch::kBFloat16 && transposed_heads(x)) {
    return swap_heads_bf16(x.transpose(1, 2));
  }
#endif
  return x.to(torch::kBFloat16).contiguous();
}

}  // namespace rwd::kernels
