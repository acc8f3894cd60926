// On a GPU: what `fp32` promises for the linears, LayerNorm and LM head (plan `qkv`, `proj`,
// `mlp`, `ln`, `head`, `all=fp32`), the modules the attention kernels' split-BF16 contract
// (AttentionFp32.*) does not cover. On the GPU the GEMMs are cuBLAS's FP32 GEMMs with TF32 off
// (the opt-in 3xTF32 of train/fp32_gemm.h fails this on cancelling sums), the rest LibTorch's FP32
// kernels. The contract, per module, output and gradient, on random and crafted inputs: the
// relative RMS error against an FP64 reference is at most 3x that of the same function in FP32
// on the CPU (the twin), the largest error of one element at most 4x. A plain TF32 GEMM breaks
// it by orders of magnitude; the last test shows the check sees that. Skips cleanly without a
// CUDA device.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_fixture.h"
#include "train/fp32_gemm.h"
#include "train/mixed.h"

namespace rwd::train {
namespace {

using Tensors = std::vector<torch::Tensor>;
// A module under test: leaf inputs -> outputs and the inputs' gradients under a fixed
// upstream gradient (the first input's autograd leaves are the float tensors).
using Fn = std::function<Tensors(const Tensors&)>;

// Error of got against the FP64 reference: relative RMS (|got - ref|_F / |ref|_F) and relative
// max (max |got - ref| / max |ref|).
struct Err {
  double rms, max;
};

Err rel_err(const torch::Tensor& got, const torch::Tensor& ref) {
  const torch::Tensor d = got.detach().to(torch::kCPU).to(torch::kFloat64) - ref;
  return {d.norm().item<double>() / (ref.norm().item<double>() + 1e-300),
          d.abs().max().item<double>() / (ref.abs().max().item<double>() + 1e-300)};
}

// Runs fn on copies of `inputs` cast to dtype on device (floating ones become leaves).
Tensors run_on(const Fn& fn, const Tensors& inputs, torch::Dtype dtype, torch::Device device) {
  Tensors in;
  for (const auto& t : inputs) {
    torch::Tensor c = t.to(device);
    if (c.is_floating_point()) c = c.to(dtype).detach().requires_grad_(true);
    in.push_back(c);
  }
  Tensors out = fn(in);
  for (auto& t : out) t = t.detach();
  return out;
}

struct Outcome {
  std::vector<Err> gpu, twin;  // per output
};

Outcome measure(const Fn& fn, const Tensors& inputs, torch::Device device) {
  const Tensors ref = run_on(fn, inputs, torch::kFloat64, torch::kCPU);
  const Tensors twin = run_on(fn, inputs, torch::kFloat32, torch::kCPU);
  const Tensors gpu = run_on(fn, inputs, torch::kFloat32, device);
  Outcome o;
  for (size_t i = 0; i < ref.size(); ++i) {
    o.twin.push_back(rel_err(twin[i], ref[i]));
    o.gpu.push_back(rel_err(gpu[i], ref[i]));
  }
  return o;
}

// The contract for one module and input kind: relative RMS error at most 3x the twin's, and
// the largest error of one element at most 4x. Both devices do FP32 products and FP32 sums;
// the GEMMs sum in cuBLAS's order, not the CPU's, and over long reductions that order is
// less lucky (H100: RMS 1.1-1.65x at K 768-2048, 2.4x for the head's dX over an 8192-token
// vocabulary; max 0.2-2.6x), while a TF32 GEMM is 460-830x off. Prints both ratios.
void expect_contract(const std::string& what, const std::vector<std::string>& names,
                     const Fn& fn, const Tensors& inputs, torch::Device device) {
  const Outcome o = measure(fn, inputs, device);
  ASSERT_EQ(o.gpu.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const Err& g = o.gpu[i];
    const Err& t = o.twin[i];
    std::printf("fp32 contract %-22s %-5s rms gpu %.3e twin %.3e ratio %.2f | max gpu %.3e twin %.3e ratio %.2f\n",
                what.c_str(), names[i].c_str(), g.rms, t.rms, g.rms / (t.rms + 1e-300), g.max, t.max,
                g.max / (t.max + 1e-300));
    // 2^-24: one FP32 rounding, for outputs the twin gets exactly right.
    EXPECT_LE(g.rms, 3.0 * t.rms + 0x1p-24) << what << " " << names[i] << ": GPU RMS error " << g.rms
                                            << " > 3x the CPU FP32 twin's " << t.rms;
    EXPECT_LE(g.max, 4.0 * t.max + 0x1p-24) << what << " " << names[i] << ": GPU max error " << g.max
                                            << " > 4x the CPU FP32 twin's " << t.max;
  }
}

// Upstream gradient for outputs of x's shape: fixed, so FP64 and FP32 runs see the same one
// up to its rounding to the run's dtype.
torch::Tensor upstream(torch::IntArrayRef shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kFloat64);
}

// Input kinds: random N(0,1); offset (mean 3, spread 0.01: cancellation in LayerNorm's
// variance and in sums of near-equal products); wide (magnitudes spread over e^±4).
torch::Tensor make_input(const std::string& kind, torch::IntArrayRef shape, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor r = torch::randn(shape, torch::kFloat64);
  if (kind == "offset") return 3.0 + 0.01 * r;
  if (kind == "wide") return r * torch::exp(2.0 * torch::randn(shape, torch::kFloat64));
  return r;
}

const char* const kKinds[] = {"random", "offset", "wide"};

using Fp32Contract = CudaTest;

// y = x Wᵀ, dX = g W, dW = gᵀ X at gpt2-small's qkv shape (C 768 -> 2304), 2048 rows.
Fn linear_fn(const torch::Tensor& g64) {
  return [g64](const Tensors& in) -> Tensors {
    torch::Tensor y = linear(in[0], in[1], /*low=*/false, /*round_out=*/false, /*x_bf16=*/false);
    (y * g64.to(y.device()).to(y.scalar_type())).sum().backward();
    return {y, in[0].grad(), in[1].grad()};
  };
}

TEST_F(Fp32Contract, LinearForwardAndBackward) {
  for (const char* kind : kKinds) {
    const torch::Tensor x = make_input(kind, {2048, 768}, 1);
    const torch::Tensor w = 0.02 * make_input("random", {2304, 768}, 2);
    expect_contract(std::string("linear/") + kind, {"y", "dx", "dw"},
                    linear_fn(upstream({2048, 2304}, 3)), {x, w}, device_);
  }
}

TEST_F(Fp32Contract, LayerNormForwardAndBackward) {
  const torch::Tensor g64 = upstream({2048, 768}, 13);
  const Fn fn = [g64](const Tensors& in) -> Tensors {
    torch::Tensor y = layer_norm(in[0], in[1], in[2], /*low=*/false);
    (y * g64.to(y.device()).to(y.scalar_type())).sum().backward();
    return {y, in[0].grad(), in[1].grad(), in[2].grad()};
  };
  for (const char* kind : kKinds) {
    const torch::Tensor x = make_input(kind, {2048, 768}, 11);
    const torch::Tensor w = 1.0 + 0.1 * make_input("random", {768}, 12);
    const torch::Tensor b = 0.1 * make_input("random", {768}, 14);
    expect_contract(std::string("layer_norm/") + kind, {"y", "dx", "dw", "db"}, fn, {x, w, b},
                    device_);
  }
}

// The LM head as the model runs it with head=fp32: final LayerNorm, tied projection onto an
// 8192-token vocabulary, mean cross-entropy; the loss and the gradients of x, ln_f and wte.
TEST_F(Fp32Contract, LmHeadLossAndGradients) {
  torch::manual_seed(21);
  const torch::Tensor targets = torch::randint(0, 8192, {4, 256}, torch::kLong);
  const Fn fn = [](const Tensors& in) -> Tensors {
    torch::Tensor logits = lm_head(in[0], in[1], torch::Tensor(), in[2], /*low=*/false);
    torch::Tensor loss = mean_cross_entropy(logits, in[3]);
    loss.backward();
    return {loss, in[0].grad(), in[1].grad(), in[2].grad()};
  };
  for (const char* kind : kKinds) {
    const torch::Tensor x = make_input(kind, {4, 256, 768}, 22);
    const torch::Tensor ln = 1.0 + 0.1 * make_input("random", {768}, 23);
    const torch::Tensor wte = 0.02 * make_input("random", {8192, 768}, 24);
    expect_contract(std::string("lm_head/") + kind, {"loss", "dx", "dln", "dwte"}, fn,
                    {x, ln, wte, targets}, device_);
  }
}

// The check can fail: with TF32 GEMMs (10-bit mantissa products) the linear is off by
// orders of magnitude more than the twin, far past both bounds.
TEST_F(Fp32Contract, Tf32GemmsFailTheContract) {
  const torch::Tensor x = make_input("random", {2048, 768}, 1);
  const torch::Tensor w = 0.02 * make_input("random", {2304, 768}, 2);
  const Fp32Gemm was = fp32_gemm();
  set_fp32_gemm(Fp32Gemm::kSimt);  // a plain GEMM, TF32 by the global flag (3xTF32 would pass)
  at::globalContext().setAllowTF32CuBLAS(true);
  const Outcome o = measure(linear_fn(upstream({2048, 2304}, 3)), {x, w}, device_);
  at::globalContext().setAllowTF32CuBLAS(false);
  set_fp32_gemm(was);
  std::printf("fp32 contract linear/random with TF32: y rms ratio %.1f, max ratio %.1f\n",
              o.gpu[0].rms / o.twin[0].rms, o.gpu[0].max / o.twin[0].max);
  EXPECT_GT(o.gpu[0].rms, 8.0 * o.twin[0].rms);
  EXPECT_GT(o.gpu[0].max, 8.0 * o.twin[0].max);
}

}  // namespace
}  // namespace rwd::train
