// LayerNorm through rewind's kernels (see norm.h).
#include "train/norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "common/switches.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/cuda/layer_norm.h"
#endif

namespace rwd::train {

namespace {

std::atomic<bool>& norm_on() {
  static std::atomic<bool> on(switches::on(switches::Switch::kFusedNorm));
  return on;
}

#ifdef REWIND_CUDA
void* stream() { return at::cuda::getCurrentCUDAStream().stream(); }
const uint16_t* bf16_ptr(const torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<const uint16_t*>(t.data_ptr()) : nullptr;
}
uint16_t* bf16_ptr_mut(const torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<uint16_t*>(t.data_ptr()) : nullptr;
}
const float* f32_ptr(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
#endif

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct NormModuleFn : public torch::autograd::Function<NormModuleFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w) {
    NormForward f = norm_forward(x, torch::Tensor(), w, /*bf16_out=*/false);
    ctx->save_for_backward({x, w, f.mean, f.rstd});
    ctx->saved_data["kernels"] = f.kernels;
    return f.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    NormBackward b = norm_backward(grads[0], s[0], s[2], s[3], s[1], torch::Tensor(), false,
                                   ctx->saved_data["kernels"].toBool());
    return {b.dx, b.dw};
  }
};

}  // namespace

#ifdef REWIND_CUDA
bool fused_norm() { return norm_on().load(); }
#else
bool fused_norm() { return false; }  // no kernels to run
#endif
void set_fused_norm(bool on) { norm_on().store(on); }
bool fused_norm_from_env() { return switches::is_set(switches::Switch::kFusedNorm); }

bool norm_kernels_apply(const torch::Tensor& x, const torch::Tensor& bias) {
#ifdef REWIND_CUDA
  return x.is_cuda() && x.scalar_type() == torch::kFloat32 && !bias.defined() && fused_norm() &&
         kernels::cuda::layer_norm_supports(x.size(-1));
#else
  (void)x, (void)bias;
  return false;
#endif
}

NormForward norm_forward(const torch::Tensor& x_in, const torch::Tensor& residual, const torch::Tensor& w,
                         bool bf16_out) {
  NormForward f;
  f.kernels = norm_kernels_apply(x_in, torch::Tensor());
  if (!f.kernels) {  // LibTorch's: y = x + residual (FP32 + BF16: exact), then LayerNorm, then the rounding
    if (residual.defined()) f.y = x_in + residual;
    const torch::Tensor& in = residual.defined() ? f.y : x_in;
    auto [out, mean, rstd] = at::native_layer_norm(in, {in.size(-1)}, w, torch::Tensor(), kLayerNormEps);
    f.out = bf16_out ? out.to(torch::kBFloat16) : out;
    f.mean = mean, f.rstd = rstd;
    return f;
  }
#ifdef REWIND_CUDA
  const torch::Tensor x = x_in.contiguous(), r = residual.defined() ? residual.contiguous() : residual;
  const torch::Tensor wc = w.contiguous();
  const int64_t C = x.size(-1), rows = x.numel() / C;
  TORCH_CHECK(!r.defined() || (r.scalar_type() == torch::kBFloat16 && r.sizes() == x.sizes()),
              "norm_forward: the residual must be BF16 of x's shape");
  f.out = torch::empty(x.sizes(), x.options().dtype(bf16_out ? torch::kBFloat16 : torch::kFloat32));
  if (r.defined()) f.y = torch::empty_like(x);
  f.mean = torch::empty({rows}, x.options());
  f.rstd = torch::empty({rows}, x.options());
  const int rc = kernels::cuda::layer_norm_forward(
      x.data_ptr<float>(), bf16_ptr(r), wc.data_ptr<float>(), rows, C, static_cast<float>(kLayerNormEps), f.y.defined() ? f.y.data_ptr<float>() : nullptr,
      bf16_out ? nullptr : f.out.data_ptr<float>(), bf16_out ? bf16_ptr_mut(f.out) : nullptr, f.mean.data_ptr<float>(),
      f.rstd.data_ptr<float>(), stream());
  TORCH_CHECK(rc == 0, "layer norm: CUDA launch failed (error ", rc, ")");
#endif
  return f;
}

NormBackward norm_backward(const torch::Tensor& g_in, const torch::Tensor& x, const torch::Tensor& mean,
                           const torch::Tensor& rstd, const torch::Tensor& w, const torch::Tensor& residual,
                           bool want_bf16, bool kernels) {
  NormBackward b;
  if (!kernels) {  // LibTorch's, as autograd calls it; then the residual's gradient and the rounding
    auto r = at::native_layer_norm_backward(g_in.to(torch::kFloat32), x, {x.size(-1)}, mean, rstd, w,
                                            torch::Tensor(), {true, true, false});
    b.dx = residual.defined() ? residual + std::get<0>(r) : std::get<0>(r);
    b.dw = std::get<1>(r);
    if (want_bf16) b.dx_bf16 = b.dx.to(torch::kBFloat16);
    return b;
  }
#ifdef REWIND_CUDA
  const torch::Tensor g = g_in.contiguous(), xc = x.contiguous(), wc = w.contiguous();
  const torch::Tensor r = residual.defined() ? residual.contiguous() : residual;
  const int64_t C = xc.size(-1), rows = xc.numel() / C;
  const bool g_bf16 = g.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((g_bf16 || g.scalar_type() == torch::kFloat32) && g.sizes() == xc.sizes(),
              "norm_backward: the gradient must be BF16 or FP32 of x's shape");
  TORCH_CHECK(!r.defined() || (r.scalar_type() == torch::kFloat32 && r.sizes() == xc.sizes()),
              "norm_backward: the residual must be FP32 of x's shape");
  b.dx = torch::empty_like(xc);
  if (want_bf16) b.dx_bf16 = torch::empty(xc.sizes(), xc.options().dtype(torch::kBFloat16));
  b.dw = torch::empty({C}, xc.options());
  const torch::Tensor ws = torch::empty({kernels::cuda::layer_norm_backward_workspace(rows, C)}, xc.options());
  const int rc = kernels::cuda::layer_norm_backward(
      g_bf16 ? nullptr : g.data_ptr<float>(), g_bf16 ? bf16_ptr(g) : nullptr, xc.data_ptr<float>(),
      mean.data_ptr<float>(), rstd.data_ptr<float>(), wc.data_ptr<float>(), f32_ptr(r), rows, C,
      b.dx.data_ptr<float>(), bf16_ptr_mut(b.dx_bf16), b.dw.data_ptr<float>(), ws.data_ptr<float>(), stream());
  TORCH_CHECK(rc == 0, "layer norm backward: CUDA launch failed (error ", rc, ")");
#else
  TORCH_CHECK(false, "norm_backward: the kernels need a REWIND_CUDA build");
#endif
  return b;
}

torch::Tensor norm_module(const torch::Tensor& x, const torch::Tensor& w) { return NormModuleFn::apply(x, w); }

}  // namespace rwd::train
