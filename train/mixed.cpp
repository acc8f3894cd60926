// Autograd functions for the BF16 rounding points of the non-attention modules.
#include "train/mixed.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/normalization.h>
#include <torch/version.h>

#include <vector>

#include "train/fp32_gemm.h"
#include "train/norm.h"

namespace rwd::train {

// On CUDA a low linear whose input already holds BF16 values runs as a real BF16 GEMM
// (cuBLAS: BF16 operands, FP32 accumulation) — the rounding points of LinearFn below, with
// the accumulation order of the GPU; this is what torch.autocast does there. With round_out
// the GEMM writes BF16 (autocast's result); without it (the qkv projection, whose Q/K/V are
// rounded inside attention per op) it writes FP32 where LibTorch can (>= 2.8: mm's out_dtype),
// else it runs the FP32 GEMM on the BF16 operands, which rounds the same way but slower.
torch::Tensor bf16_matmul(const torch::Tensor& a, const torch::Tensor& b_t, bool round_out) {
  if (round_out) return torch::matmul(a, b_t).to(torch::kFloat32);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  std::vector<int64_t> shape = a.sizes().vec();
  shape.back() = b_t.size(1);
  return at::mm(a.reshape({-1, a.size(-1)}), b_t, torch::kFloat32).view(shape);
#else
  return torch::matmul(a.to(torch::kFloat32), b_t.to(torch::kFloat32));
#endif
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor rnd(const torch::Tensor& x) { return x.to(torch::kBFloat16).to(torch::kFloat32); }

struct RoundBf16Fn : public torch::autograd::Function<RoundBf16Fn> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x) { return rnd(x); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

struct CudaBf16LinearFn : public torch::autograd::Function<CudaBf16LinearFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, bool round_out) {
    torch::Tensor xb = x.to(torch::kBFloat16), wb = w.to(torch::kBFloat16);  // x: exact
    ctx->save_for_backward({xb, wb});
    return bf16_matmul(xb, wb.t(), round_out);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor g = grads[0].to(torch::kBFloat16);
    torch::Tensor dx = torch::matmul(g, saved[1]).to(torch::kFloat32);
    torch::Tensor dw = torch::matmul(g.reshape({-1, g.size(-1)}).t(),
                                     saved[0].reshape({-1, saved[0].size(-1)}))
                           .to(torch::kFloat32);
    return {dx, dw, torch::Tensor()};
  }
};

struct LinearFn : public torch::autograd::Function<LinearFn> {
  // x: (..., in), w: (out, in) -> (..., out)
  // x_bf16: x holds BF16 values (exact in TF32: the split GEMM skips its low part).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, bool low, bool round_out, bool x_bf16) {
    // The input is rounded by its producer (LayerNorm, attention's O, GELU), not here, so
    // that promoting the producer (e.g. `ln=fp32`) really feeds FP32 values in.
    const torch::Tensor& xs = x;
    torch::Tensor ws = low ? rnd(w) : w;
    ctx->save_for_backward({xs, ws});
    ctx->saved_data["low"] = low;
    ctx->saved_data["x_bf16"] = x_bf16;
    torch::Tensor y;
    if (split_fp32_gemm(xs)) {  // GPU: 3xTF32 (fp32_gemm.h); ws is BF16-valued when low
      std::vector<int64_t> shape = xs.sizes().vec();
      shape.back() = ws.size(0);
      y = split_tf32_mm(tf32_parts(xs.reshape({-1, xs.size(-1)}), x_bf16), tf32_parts(ws, low).t()).view(shape);
    } else {
      y = torch::matmul(xs, ws.t());
    }
    return (low && round_out) ? rnd(y) : y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& xs = saved[0];
    const torch::Tensor& ws = saved[1];
    const bool low = ctx->saved_data["low"].toBool();
    torch::Tensor g = low ? rnd(grads[0]) : grads[0];
    torch::Tensor dx, dw;
    torch::Tensor g2 = g.reshape({-1, g.size(-1)});                   // (N, out)
    torch::Tensor x2 = xs.reshape({-1, xs.size(-1)});                 // (N, in)
    if (split_fp32_gemm(g)) {
      // g is split once for both GEMMs; low: g and ws hold BF16 values (one exact GEMM for dX).
      const Tf32Parts gp = tf32_parts(g2.contiguous(), low);
      dx = split_tf32_mm(gp, tf32_parts(ws, low)).view(xs.sizes());                    // (..., in)
      dw = split_tf32_mm(gp.t(), tf32_parts(x2, ctx->saved_data["x_bf16"].toBool()));  // (out, in)
    } else {
      dx = torch::matmul(g, ws);                                      // (..., in)
      dw = torch::matmul(g2.t(), x2);                                 // (out, in)
    }
    if (low) {
      dx = rnd(dx);
      dw = rnd(dw);
    }
    return {dx, dw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor round_bf16(const torch::Tensor& x) { return RoundBf16Fn::apply(x); }

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, bool low, bool round_out,
                     bool x_bf16) {
  if (low && x_bf16 && x.is_cuda()) return CudaBf16LinearFn::apply(x, w, round_out);
  return LinearFn::apply(x, w, low, round_out, x_bf16);
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         bool low) {
  if (w.defined() && norm_kernels_apply(x, b)) {  // the fast block's kernels (norm.h)
    const torch::Tensor y = norm_module(x, w);
    return low ? round_bf16(y) : y;
  }
  namespace F = torch::nn::functional;
  auto y = F::layer_norm(x, F::LayerNormFuncOptions({x.size(-1)}).weight(w).bias(b).eps(kLayerNormEps));
  return low ? round_bf16(y) : y;
}

torch::Tensor lm_head(const torch::Tensor& x, const torch::Tensor& ln_f, const torch::Tensor& ln_f_bias,
                      const torch::Tensor& wte, bool low) {
  return linear(layer_norm(x, ln_f, ln_f_bias, low), wte, low, low, /*x_bf16=*/low);
}

torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace rwd::train
