// Benchmark: the CPU BF16 attention emulation (forward + backward through the autograd op)
// against LibTorch's own attention math in FP32 and the plain BF16 (autocast-like) variant,
// measured in the same run; prints milliseconds per iteration and ratios to the FP32 baseline.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include <torch/autograd.h>
#include <ATen/Parallel.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <torch/types.h>

#include "kernels/attention_op.h"

namespace {

using rwd::kernels::AttentionOptions;
using torch::Tensor;

// Median wall time in milliseconds of fn() over `iters` runs after one warm-up.
double time_ms(const std::function<void()>& fn, int iters) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One forward + backward of fn on fresh leaf copies of q, k, v.
void fwd_bwd(const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& fn,
             const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g) {
  Tensor q = q0.detach().requires_grad_(true), k = k0.detach().requires_grad_(true),
         v = v0.detach().requires_grad_(true);
  fn(q, k, v).backward(g);
}

}  // namespace

int main() {
  struct Shape {
    int64_t b, h, t, d;
  };
  const Shape shapes[] = {{8, 4, 128, 32}, {4, 6, 256, 64}, {2, 4, 512, 64}};
  // Same thread count for LibTorch's intra-op pool and the emulation's OpenMP loop.
#ifdef _OPENMP
  at::set_num_threads(omp_get_max_threads());
#endif
  std::printf("threads: %d (LibTorch intra-op and OpenMP)\n", at::get_num_threads());
  std::printf("%-18s %10s %10s %10s %10s %10s %9s %9s\n", "shape B,H,T,D", "torch32", "plainbf16",
              "emu", "emu_naive", "emu_fwd", "emu/t32", "naive/t32");
  torch::manual_seed(0);
  for (const Shape& s : shapes) {
    Tensor q = torch::randn({s.b, s.h, s.t, s.d}), k = torch::randn({s.b, s.h, s.t, s.d});
    Tensor v = torch::randn({s.b, s.h, s.t, s.d}), g = torch::randn({s.b, s.h, s.t, s.d});
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    AttentionOptions opt;
    opt.scale = static_cast<float>(scale);
    AttentionOptions naive = opt;
    naive.naive = true;
    const int iters = 5;
    const double t32 = time_ms([&] {
      fwd_bwd([&](auto& a, auto& b, auto& c) { return rwd::kernels::attention_torch_fp32(a, b, c, scale, true); }, q, k, v, g);
    }, iters);
    const double tbf = time_ms([&] {
      fwd_bwd([&](auto& a, auto& b, auto& c) { return rwd::kernels::attention_plain_bf16(a, b, c, scale, true); }, q, k, v, g);
    }, iters);
    const double temu = time_ms([&] {
      fwd_bwd([&](auto& a, auto& b, auto& c) { return rwd::kernels::attention(a, b, c, opt); }, q, k, v, g);
    }, iters);
    const double tnaive = time_ms([&] {
      fwd_bwd([&](auto& a, auto& b, auto& c) { return rwd::kernels::attention(a, b, c, naive); }, q, k, v, g);
    }, iters);
    const double tfwd = time_ms([&] {
      torch::NoGradGuard no_grad;
      rwd::kernels::attention(q, k, v, opt);
    }, iters);
    char name[64];
    std::snprintf(name, sizeof name, "%lld,%lld,%lld,%lld", static_cast<long long>(s.b),
                  static_cast<long long>(s.h), static_cast<long long>(s.t), static_cast<long long>(s.d));
    std::printf("%-18s %10.2f %10.2f %10.2f %10.2f %10.2f %9.2f %9.2f\n", name, t32, tbf, temu,
                tnaive, tfwd, temu / t32, tnaive / t32);
  }
  std::printf("(ms per forward+backward, median of 5; emu_fwd is forward only; ratios vs torch32;\n"
              " torch computes the full T x T scores, the emulation skips masked key tiles)\n");
  return 0;
}
