// The LibTorch attention op: emulation error at most 2x that of plain BF16 LibTorch (autocast
// semantics) against the FP64 reference, gradients flow, capture, determinism, input checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>

#include "kernels/attention_cpu.h"
#include "kernels/attention_op.h"

namespace rwd::kernels {
namespace {

using torch::Tensor;

struct Grads {
  Tensor o, dq, dk, dv;
};

// FP64 reference through the plain-C++ kernel on the FP32 inputs' exact values.
Grads reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal) {
  AttentionParams p;
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.seq = q.size(2);
  p.dim = q.size(3);
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.dim));
  p.causal = causal;
  auto d = [](const Tensor& x) { return x.to(torch::kFloat64).contiguous(); };
  Tensor qd = d(q), kd = d(k), vd = d(v), gd = d(g);
  Grads r{torch::empty_like(qd), torch::empty_like(qd), torch::empty_like(qd), torch::empty_like(qd)};
  Tensor lse = torch::empty({p.batch, p.heads, p.seq}, qd.options());
  attention_reference_forward(p, qd.data_ptr<double>(), kd.data_ptr<double>(), vd.data_ptr<double>(),
                              r.o.data_ptr<double>(), lse.data_ptr<double>());
  attention_reference_backward(p, qd.data_ptr<double>(), kd.data_ptr<double>(), vd.data_ptr<double>(),
                               r.o.data_ptr<double>(), gd.data_ptr<double>(), lse.data_ptr<double>(),
                               r.dq.data_ptr<double>(), r.dk.data_ptr<double>(), r.dv.data_ptr<double>());
  return r;
}

template <class Fn>
Grads run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g, Fn fn) {
  Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
         v = v0.clone().requires_grad_(true);
  Tensor o = fn(q, k, v);
  o.backward(g);
  return {o.detach().to(torch::kFloat64), q.grad().to(torch::kFloat64), k.grad().to(torch::kFloat64),
          v.grad().to(torch::kFloat64)};
}

double err(const Tensor& a, const Tensor& ref) { return (a - ref).abs().max().item<double>(); }

AttentionOptions options(int64_t d, int block) {
  AttentionOptions opt;
  opt.scale = 1.0f / std::sqrt(static_cast<float>(d));
  opt.block_q = opt.block_k = block;
  return opt;
}

TEST(AttentionOp, ErrorAtMostTwicePlainBf16LibTorch) {
  struct Shape {
    int64_t b, h, t, d;
    int block;
    double qk_scale;
  };
  const Shape shapes[] = {{2, 4, 64, 32, 16, 1.0},  {1, 4, 100, 64, 32, 2.0},
                          {2, 2, 1, 16, 16, 1.0},   {1, 3, 128, 64, 64, 3.0},
                          {2, 2, 77, 16, 0, 1.5}};
  torch::manual_seed(1234);
  for (const Shape& s : shapes) {
    Tensor q = torch::randn({s.b, s.h, s.t, s.d}) * s.qk_scale, k = torch::randn({s.b, s.h, s.t, s.d}) * s.qk_scale;
    Tensor v = torch::randn({s.b, s.h, s.t, s.d}), g = torch::randn({s.b, s.h, s.t, s.d});
    AttentionOptions opt = options(s.d, s.block);
    Grads ref = reference(q, k, v, g, true);
    Grads emu = run(q, k, v, g, [&](auto& a, auto& b, auto& c) { return attention(a, b, c, opt); });
    Grads plain = run(q, k, v, g, [&](auto& a, auto& b, auto& c) {
      return attention_plain_bf16(a, b, c, opt.scale, true);
    });
    const char* names[] = {"O", "dQ", "dK", "dV"};
    const Tensor* e[] = {&emu.o, &emu.dq, &emu.dk, &emu.dv};
    const Tensor* pl[] = {&plain.o, &plain.dq, &plain.dk, &plain.dv};
    const Tensor* r[] = {&ref.o, &ref.dq, &ref.dk, &ref.dv};
    for (int i = 0; i < 4; ++i) {
      const double ee = err(*e[i], *r[i]), pe = err(*pl[i], *r[i]);
      std::printf("T=%lld %s: emulation max err %.3g, plain BF16 %.3g\n", static_cast<long long>(s.t),
                  names[i], ee, pe);
      EXPECT_LE(ee, 2.0 * pe) << names[i] << " T=" << s.t << " emu " << ee << " plain " << pe;
      if (s.t > 1) EXPECT_GT(pe, 0.0) << "the baseline must be BF16";
    }
  }
}

TEST(AttentionOp, GradientsMatchKernelAndAllFp32MatchesReference) {
  torch::manual_seed(7);
  const int64_t b = 2, h = 3, t = 40, d = 16;
  Tensor q = torch::randn({b, h, t, d}), k = torch::randn({b, h, t, d}), v = torch::randn({b, h, t, d});
  Tensor g = torch::randn({b, h, t, d});
  AttentionOptions opt = options(d, 16);
  opt.flags.assign(h, HeadFlags{});
  for (auto& f : opt.flags)
    for (auto& p : f.prec) p = Prec::kFp32;
  Grads ref = reference(q, k, v, g, true);
  Grads hi = run(q, k, v, g, [&](auto& a, auto& bb, auto& c) { return attention(a, bb, c, opt); });
  // All-FP32 plan: FP32 accuracy (sums of <= 40 terms, relative ~1e-6), far below BF16 2^-9.
  EXPECT_LE(err(hi.o, ref.o), 1e-5);
  EXPECT_LE(err(hi.dq, ref.dq), 1e-5 * (1 + ref.dq.abs().max().item<double>()));
  EXPECT_LE(err(hi.dk, ref.dk), 1e-5 * (1 + ref.dk.abs().max().item<double>()));
  EXPECT_LE(err(hi.dv, ref.dv), 1e-5 * (1 + ref.dv.abs().max().item<double>()));
}

TEST(AttentionOp, CaptureDeterminismAndNonContiguousInputs) {
  torch::manual_seed(3);
  const int64_t b = 2, h = 2, t = 33, d = 8;
  Tensor qkv = torch::randn({b, t, 3, h, d});
  auto part = [&](int i) { return qkv.select(2, i).transpose(1, 2); };  // (B, H, T, D) views
  Tensor g = torch::randn({b, h, t, d});
  AttentionOptions opt = options(d, 16);
  opt.flags.assign(h, HeadFlags{});
  opt.flags[1].stable = true;
  std::vector<Grads> runs;
  for (int rep = 0; rep < 2; ++rep) {
    auto cap = std::make_shared<AttentionCapture>();
    runs.push_back(run(part(0), part(1), part(2), g,
                       [&](auto& a, auto& bb, auto& c) { return attention(a, bb, c, opt, cap); }));
    ASSERT_EQ(cap->stats.size(), static_cast<size_t>(h));
    EXPECT_EQ(cap->stats[0].rows, b * t);
    EXPECT_EQ(cap->lse.sizes(), (std::vector<int64_t>{b, h, t}));
    EXPECT_EQ(cap->delta.sizes(), (std::vector<int64_t>{b, h, t}));
    EXPECT_TRUE(torch::equal(cap->d_o, g));
    EXPECT_TRUE(torch::equal(cap->o.to(torch::kFloat64), runs.back().o));
    EXPECT_TRUE(torch::equal(cap->q, part(0).contiguous()));
  }
  EXPECT_TRUE(torch::equal(runs[0].o, runs[1].o));
  EXPECT_TRUE(torch::equal(runs[0].dq, runs[1].dq));
  EXPECT_TRUE(torch::equal(runs[0].dk, runs[1].dk));
  EXPECT_TRUE(torch::equal(runs[0].dv, runs[1].dv));
  Grads ref = reference(part(0), part(1), part(2), g, true);
  EXPECT_LE(err(runs[0].dq, ref.dq), 0.05 * (1 + ref.dq.abs().max().item<double>()));
}

TEST(AttentionOp, RejectsBadInputs) {
  Tensor q = torch::randn({1, 2, 4, 8});
  AttentionOptions opt = options(8, 16);
  EXPECT_THROW(attention(q.to(torch::kFloat64), q, q, opt), c10::Error);
  EXPECT_THROW(attention(q, q.reshape({1, 2, 8, 4}), q, opt), c10::Error);
  EXPECT_THROW(attention(q.reshape({2, 4, 8}), q, q, opt), c10::Error);
  opt.flags.assign(3, HeadFlags{});
  EXPECT_THROW(attention(q, q, q, opt), c10::Error);
  opt.flags.clear();
  opt.scale = 0.0f;
  EXPECT_THROW(attention(q, q, q, opt), c10::Error);
}

TEST(AttentionOp, SdpaBaseline) {
  Tensor q = torch::randn({1, 2, 16, 8});
#if TORCH_VERSION_MAJOR >= 2
  Tensor o = attention_sdpa(q, q, q, true).to(torch::kFloat32);
  Tensor plain = attention_plain_bf16(q, q, q, 1.0 / std::sqrt(8.0), true);
  EXPECT_LE((o - plain).abs().max().item<double>(), 0.05);
#else
  EXPECT_THROW(attention_sdpa(q, q, q, true), c10::Error);
#endif
}

}  // namespace
}  // namespace rwd::kernels
