// On a GPU: the opt-in 3xTF32 GEMMs of the FP32 linears (train/fp32_gemm.h). Accuracy: against
// an FP64 reference, the largest and the RMS error of each GEMM a linear runs (y = x W^T, dX =
// g W, dW = g^T x, with and without BF16-valued operands) on random, offset (mean 3, spread
// 0.01), wide-range and cancelling inputs are at most 1.25x those of the tensor cores' sums
// alone (a TF32 GEMM of TF32-exact operands): the split adds no error of its own. Both are
// printed beside cuBLAS's FP32 GEMM's, which they exceed (not the FP32 contract: opt-in).
// Determinism: a linear's forward and backward twice, bit for bit. The split kernel equals its
// CPU twin bit for bit; REWIND_FP32_GEMM=simt's path is LibTorch's FP32 GEMM; the numerics
// version says which ran. Prints every error and the time of each GEMM. Skips without a GPU.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <limits>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_fixture.h"
#include "train/fp32_gemm.h"
#include "train/norm.h"
#include "train/mixed.h"
#include "train/run_spec.h"

namespace rwd::train {
namespace {

using Fp32Gemm3x = CudaTest;

// Restores the process-wide FP32 GEMM at the end of a test.
struct GemmScope {
  Fp32Gemm was = fp32_gemm();
  explicit GemmScope(Fp32Gemm g) { set_fp32_gemm(g); }
  ~GemmScope() { set_fp32_gemm(was); }
};

// Inputs of one kind, FP64 on the CPU, then cast to FP32 (the GEMMs' operands).
torch::Tensor make(const std::string& kind, int64_t r, int64_t c, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({r, c}, torch::kFloat64);
  if (kind == "offset") x = 3.0 + 0.01 * x;
  if (kind == "wide") x = x * torch::exp2(torch::randint(-20, 21, {r, c}).to(torch::kFloat64));
  // Cancelling: the second half of each row is minus the first half plus 1e-4 of noise, so
  // every product sum of a row against a column with equal halves is ~1e-4 of its terms.
  if (kind == "cancel") {
    const int64_t h = c / 2;
    x.slice(1, h, 2 * h).copy_(-x.slice(1, 0, h) + 1e-4 * torch::randn({r, h}, torch::kFloat64));
  }
  return x.to(torch::kFloat32);
}

struct Err {
  double max, rms;
};

Err err(const torch::Tensor& got, const torch::Tensor& ref64) {
  const torch::Tensor d = got.to(torch::kFloat64) - ref64;
  return {d.abs().max().item<double>(), d.pow(2).mean().sqrt().item<double>()};
}

double ms_of(const std::function<torch::Tensor()>& f) {
  f();
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kReps = 10;
  for (int i = 0; i < kReps; ++i) f();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kReps;
}

// One GEMM a (M, K) x b (K, N), operands given as stored (b_t: b is the transpose of a
// contiguous (N, K) matrix, as W^T in y = x W^T). Checks 3xTF32 against FP32 cuBLAS.
void check_gemm(const std::string& what, const torch::Tensor& a32, const torch::Tensor& b32, bool a_exact,
                bool b_exact, torch::Device dev) {
  const torch::Tensor a = a32.to(dev), b = b32.to(dev);
  const torch::Tensor ref = torch::mm(a.to(torch::kFloat64), b.to(torch::kFloat64));
  const torch::Tensor plain = torch::mm(a, b);  // TF32 off (setup_device)
  const torch::Tensor split = split_tf32_mm(a, b, a_exact, b_exact);
  const Err ep = err(plain, ref), es = err(split, ref);
  const double t_plain = ms_of([&] { return torch::mm(a, b); });
  const double t_split = ms_of([&] { return split_tf32_mm(a, b, a_exact, b_exact); });
  // Where an error comes from: the sums alone, a TF32 GEMM of TF32-exact operands (exact
  // products: only the tensor cores' accumulation errs) against the FP32 GEMM of the same.
  const torch::Tensor ah = tf32_parts(a, a_exact).hi, bh = tf32_parts(b, b_exact).hi;
  const torch::Tensor ref_h = torch::mm(ah.to(torch::kFloat64), bh.to(torch::kFloat64));
  const Err acc_tc = err(split_tf32_mm(ah, bh, true, true), ref_h), acc_simt = err(torch::mm(ah, bh), ref_h);
  std::printf("3xtf32 %-34s max %.3e vs fp32 %.3e (%.2fx) | rms %.3e vs %.3e (%.2fx) | %.3f ms vs %.3f ms (%.2fx faster)"
              " | sums alone: tensor cores max %.2e rms %.2e, fp32 max %.2e rms %.2e\n",
              what.c_str(), es.max, ep.max, es.max / (ep.max + 1e-300), es.rms, ep.rms, es.rms / (ep.rms + 1e-300),
              t_split, t_plain, t_plain / t_split, acc_tc.max, acc_tc.rms, acc_simt.max, acc_simt.rms);
  // The split is exact: what 3xTF32 errs is the tensor cores' own accumulation (the sums
  // alone above), which an H200 measured at 1.4-4.4x the FP32 GEMM's RMS error on random inputs
  // and up to 47x on cancelling sums: outside the FP32 contract, hence opt-in.
  EXPECT_LE(es.max, 1.25 * acc_tc.max + 1e-30) << what << ": 3xTF32 max error " << es.max
                                               << " > 1.25x the tensor cores' sums alone " << acc_tc.max;
  EXPECT_LE(es.rms, 1.25 * acc_tc.rms + 1e-30) << what << ": 3xTF32 RMS error " << es.rms
                                               << " > 1.25x the tensor cores' sums alone " << acc_tc.rms;
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS()) << "the TF32 guard did not restore the setting";
}

torch::Tensor bf16_values(const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); }

// The three GEMMs of a linear at gpt2-small shapes (rows x in -> out), FP32 and, as a low
// linear fed FP32 values runs them, with BF16-valued W and g.
TEST_F(Fp32Gemm3x, ErrsOnlyWhatTheTensorCoresSumsErr) {
  struct Shape {
    int64_t rows, in, out;
  };
  const Shape shapes[] = {{4096, 768, 768}, {4096, 768, 3072}, {4096, 3072, 768}, {1024, 768, 8192}};
  for (const char* kind : {"random", "offset", "wide", "cancel"}) {
    for (const Shape& s : shapes) {
      const std::string tag = std::string(kind) + " " + std::to_string(s.rows) + "x" + std::to_string(s.in) + "->" +
                              std::to_string(s.out);
      const torch::Tensor x = make(kind, s.rows, s.in, 1);                 // (rows, in)
      torch::Tensor w = make(kind, s.out, s.in, 2);                        // (out, in)
      const torch::Tensor g = make(kind == std::string("cancel") ? "random" : kind, s.rows, s.out, 3);
      // For "cancel" W's rows have equal halves, so x W^T cancels.
      if (kind == std::string("cancel")) w.slice(1, s.in / 2, s.in).copy_(w.slice(1, 0, s.in / 2));
      check_gemm(tag + " y", x, w.t(), false, false, device_);
      check_gemm(tag + " dX", g, w, false, false, device_);
      check_gemm(tag + " dW", g.t(), x, false, false, device_);
      const torch::Tensor wb = bf16_values(w), gb = bf16_values(g);
      check_gemm(tag + " y  (W bf16)", x, wb.t(), false, true, device_);
      check_gemm(tag + " dX (g, W bf16)", gb, wb, true, true, device_);
      check_gemm(tag + " dW (g bf16)", gb.t(), x, true, false, device_);
    }
  }
}

torch::Tensor ulp_input(torch::IntArrayRef shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape) * torch::exp2(torch::randint(-30, 31, shape).to(torch::kFloat32));
}

TEST_F(Fp32Gemm3x, SplitKernelEqualsItsCpuTwin) {
  torch::Tensor x = ulp_input({100003}, 4);
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = -std::numeric_limits<float>::infinity();
  x[7] = std::numeric_limits<float>::quiet_NaN();
  x[8] = std::numeric_limits<float>::max();
  x[9] = 1e-42f;  // subnormal
  for (int64_t off : {0, 1}) {  // off 1: not 16-byte aligned, the one-element kernel
    const torch::Tensor xs = x.slice(0, off);
    auto [h_cpu, l_cpu] = split_tf32(xs);
    auto [h_gpu, l_gpu] = split_tf32(xs.to(device_));
    const torch::Tensor hg = h_gpu.cpu(), lg = l_gpu.cpu();
    EXPECT_TRUE(torch::equal(hg.view(torch::kInt32), h_cpu.view(torch::kInt32))) << "offset " << off;
    EXPECT_TRUE(torch::equal(lg.view(torch::kInt32), l_cpu.view(torch::kInt32))) << "offset " << off;
  }
}

// y, dX, dW of a linear fed FP32 values, on the GPU.
std::vector<torch::Tensor> linear_step(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& g,
                                       bool low) {
  torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  torch::Tensor y = linear(x, w, low, /*round_out=*/low, /*x_bf16=*/false);
  (y * g).sum().backward();
  return {y.detach(), x.grad(), w.grad()};
}

TEST_F(Fp32Gemm3x, LinearIsBitwiseRepeatable) {
  GemmScope scope(Fp32Gemm::kSplitTf32);
  const torch::Tensor x = torch::randn({8, 512, 768}).to(device_);
  const torch::Tensor w = (0.02 * torch::randn({2304, 768})).to(device_);
  const torch::Tensor g = torch::randn({8, 512, 2304}).to(device_);
  for (bool low : {false, true}) {
    const auto first = linear_step(x, w, g, low);
    for (int run = 0; run < 5; ++run) {
      const auto again = linear_step(x, w, g, low);
      for (size_t i = 0; i < first.size(); ++i)
        EXPECT_TRUE(torch::equal(first[i], again[i])) << "low " << low << " output " << i << " run " << run;
    }
  }
}

TEST_F(Fp32Gemm3x, SimtEscapeIsTheFp32GemmAndNumericsSaysWhich) {
  const torch::Tensor x = torch::randn({256, 768}).to(device_);
  const torch::Tensor w = torch::randn({1024, 768}).to(device_);
  {
    GemmScope scope(Fp32Gemm::kSimt);
    EXPECT_EQ(numerics_version(true), fused_norm() ? 5 : 3);  // 5: LayerNorm in rewind's kernels
    const torch::Tensor y = linear(x, w, false, false, false);
    EXPECT_TRUE(torch::equal(y, torch::matmul(x, w.t())));
  }
  {
    GemmScope scope(Fp32Gemm::kSplitTf32);
    EXPECT_EQ(numerics_version(true), fused_norm() ? 6 : 4);
    EXPECT_EQ(numerics_version(false), 2);
    const torch::Tensor y = linear(x, w, false, false, false);
    EXPECT_TRUE(torch::equal(y, split_tf32_mm(x, w.t(), false, false)));
    EXPECT_FALSE(torch::equal(y, torch::matmul(x, w.t())));
    // A recorded run replays with the FP32 GEMM and the LayerNorm it was recorded with
    // (3xTF32 under 4 and 6, rewind's LayerNorm kernels from 5 on: CUDA builds only).
    const bool norm_was = fused_norm();
    const struct {
      int numerics;
      Fp32Gemm gemm;
      bool norm;
    } cases[] = {{3, Fp32Gemm::kSimt, false},
                 {4, Fp32Gemm::kSplitTf32, false},
                 {5, Fp32Gemm::kSimt, true},
                 {6, Fp32Gemm::kSplitTf32, true}};
    for (const auto& c : cases) {
      RunSpec old;
      old.recorded_numerics = c.numerics;
      use_recorded_numerics(old, device_);
      if (!fp32_gemm_from_env()) EXPECT_EQ(fp32_gemm(), c.gemm) << "numerics " << c.numerics;
#ifdef REWIND_CUDA
      if (!fused_norm_from_env()) EXPECT_EQ(fused_norm(), c.norm) << "numerics " << c.numerics;
#endif
    }
    set_fused_norm(norm_was);
  }
}

}  // namespace
}  // namespace rwd::train
