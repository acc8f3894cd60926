// rewind's LayerNorm kernels (train/norm.h) on a GPU: against LibTorch's LayerNorm in FP64, the
// BF16 output as the FP32 one rounded, the fused residual adds as the separate adds, the BF16 and
// FP32 gradients alike, the module path's autograd op as the kernels, and every output bitwise
// repeatable. Widths 768 (gpt2-small), 1600 (lanes with unequal shares) and 2048 (a backward
// with more than 48 KB of shared memory); 1000 rows, not a multiple of a block's.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <limits>
#include <string>

#include "cuda_fixture.h"
#include "train/norm.h"

namespace rwd::train {
namespace {

class GpuNorm : public CudaTest {};

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

TEST_F(GpuNorm, KernelsMatchFp64AndTheirOwnFusedForms) {
  for (int64_t C : {768, 1600, 2048}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    torch::manual_seed(11 + C);
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
    const torch::Tensor x = torch::randn({4, 250, C}, f32) * 3 + 0.5;
    const torch::Tensor w = torch::randn({C}, f32) * 0.2 + 1;
    const torch::Tensor r = torch::randn({4, 250, C}, f32).to(torch::kBFloat16);
    ASSERT_TRUE(norm_kernels_apply(x, torch::Tensor()));
    EXPECT_FALSE(norm_kernels_apply(x, w));  // a bias: LibTorch's LayerNorm

    // Forward: FP32 against FP64; BF16 = FP32 rounded once; the residual add fused = done first.
    const NormForward f = norm_forward(x, torch::Tensor(), w, false);
    const torch::Tensor ref = at::layer_norm(x.to(torch::kFloat64), {C}, w.to(torch::kFloat64), {}, 1e-5);
    EXPECT_LT(max_diff(f.out, ref), 2e-5);
    const NormForward fb = norm_forward(x, torch::Tensor(), w, true);
    EXPECT_TRUE(torch::equal(fb.out, f.out.to(torch::kBFloat16)));
    EXPECT_TRUE(torch::equal(fb.mean, f.mean) && torch::equal(fb.rstd, f.rstd));
    const NormForward fr = norm_forward(x, r, w, true);
    const torch::Tensor y = x + r;
    EXPECT_TRUE(torch::equal(fr.y, y));
    EXPECT_TRUE(torch::equal(fr.out, norm_forward(y, torch::Tensor(), w, true).out));

    // Backward: against FP64 autograd; BF16 and FP32 gradients of the same values alike; the
    // residual added in the kernel = added after it; dx_bf16 = dx rounded.
    const torch::Tensor g = torch::randn({4, 250, C}, f32).to(torch::kBFloat16);
    const torch::Tensor res = torch::randn({4, 250, C}, f32);
    const NormBackward b = norm_backward(g, x, f.mean, f.rstd, w, torch::Tensor(), true, true);
    const torch::Tensor xd = x.to(torch::kFloat64).requires_grad_(), wd = w.to(torch::kFloat64).requires_grad_();
    at::layer_norm(xd, {C}, wd, {}, 1e-5).backward(g.to(torch::kFloat64));
    EXPECT_LT(max_diff(b.dx, xd.grad()), 2e-5);
    EXPECT_LT(max_diff(b.dw, wd.grad()) / (wd.grad().abs().max().item<double>() + 1), 2e-5);
    EXPECT_TRUE(torch::equal(b.dx_bf16, b.dx.to(torch::kBFloat16)));
    const NormBackward b32 = norm_backward(g.to(torch::kFloat32), x, f.mean, f.rstd, w, torch::Tensor(), false, true);
    EXPECT_TRUE(torch::equal(b32.dx, b.dx) && torch::equal(b32.dw, b.dw));
    const NormBackward br = norm_backward(g, x, f.mean, f.rstd, w, res, true, true);
    EXPECT_TRUE(torch::equal(br.dx, res + b.dx));
    EXPECT_TRUE(torch::equal(br.dx_bf16, br.dx.to(torch::kBFloat16)));
    EXPECT_TRUE(torch::equal(br.dw, b.dw));

    // The module path's op computes the same bits through autograd.
    const torch::Tensor xm = x.clone().requires_grad_(), wm = w.clone().requires_grad_();
    const torch::Tensor out = norm_module(xm, wm);
    EXPECT_TRUE(torch::equal(out, f.out));
    out.backward(g.to(torch::kFloat32));
    EXPECT_TRUE(torch::equal(xm.grad(), b.dx) && torch::equal(wm.grad(), b.dw));

    // REWIND_FUSED_NORM=0: the same calls run LibTorch's LayerNorm, with the add and the
    // roundings around it as separate ops, within the kernels' distance of FP64.
    set_fused_norm(false);
    const NormForward lf = norm_forward(x, r, w, true);
    const NormBackward lb = norm_backward(g, lf.y, lf.mean, lf.rstd, w, res, true, lf.kernels);
    set_fused_norm(true);
    EXPECT_FALSE(lf.kernels);
    EXPECT_TRUE(fr.kernels);
    EXPECT_TRUE(torch::equal(lf.y, y));
    EXPECT_TRUE(torch::equal(lf.out, std::get<0>(at::native_layer_norm(y, {C}, w, {}, 1e-5)).to(torch::kBFloat16)));
    EXPECT_LE(max_diff(lf.out, fr.out), 0.0625);  // one BF16 unit at |out| < 8 where roundings differ
    const NormBackward kb = norm_backward(g, fr.y, fr.mean, fr.rstd, w, res, true, true);
    EXPECT_LT(max_diff(lb.dx, kb.dx), 4e-5);
    EXPECT_LT(max_diff(lb.dw, kb.dw) / (kb.dw.abs().max().item<double>() + 1), 4e-5);
    EXPECT_TRUE(torch::equal(lb.dx_bf16, lb.dx.to(torch::kBFloat16)));

    // Bitwise repeatable.
    for (int rep = 0; rep < 3; ++rep) {
      const NormForward f2 = norm_forward(x, r, w, true);
      EXPECT_TRUE(torch::equal(f2.out, fr.out) && torch::equal(f2.y, fr.y) && torch::equal(f2.rstd, fr.rstd));
      const NormBackward b2 = norm_backward(g, x, f.mean, f.rstd, w, res, true, true);
      EXPECT_TRUE(torch::equal(b2.dx, br.dx) && torch::equal(b2.dw, br.dw));
    }
  }
}

// A row of equal values has variance 0: rstd = 1/sqrt(eps), the output 0, no NaN.
TEST_F(GpuNorm, ConstantRowsAndNaNs) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  torch::Tensor x = torch::full({3, 768}, 2.5, f32);
  x[2][5] = std::numeric_limits<float>::quiet_NaN();
  const torch::Tensor w = torch::ones({768}, f32);
  const NormForward f = norm_forward(x, torch::Tensor(), w, false);
  EXPECT_TRUE(torch::equal(f.out[0], torch::zeros({768}, f32)));
  EXPECT_TRUE(torch::isnan(f.out[2]).all().item<bool>());  // a NaN spreads over its row only
  EXPECT_FALSE(torch::isnan(f.out[1]).any().item<bool>());
}

}  // namespace
}  // namespace rwd::train
