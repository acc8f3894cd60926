// On a GPU: one training step of a small GPT on CUDA against the same step on the CPU (the
// emulation the kernels must match). Bitwise replay on the GPU cannot see a wrong layout or a
// dropped rounding point, since a wrong step repeats exactly; this test can: loss and every
// parameter's gradient must agree to BF16 rounding (the devices differ only in accumulation
// order). Skips cleanly without a CUDA device or in a CPU-only build.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "common/error.h"
#include "train/config.h"
#include "train/data.h"
#include "plan/plan.h"
#include "train/run_spec.h"
#include "train/fast_block.h"
#include "train/trainer.h"
#include "cuda_fixture.h"

namespace rwd::train {
namespace {

class GpuTrainer : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    char tmpl[] = "/tmp/rewind_gpu_trainer_XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/train.bin";
    write_synth_tokens(path_, 200000, 256, 3);
    config_ = Config::preset("tiny");
    config_.vocab_size = 256;
    config_.n_layer = 2;
    config_.n_head = 4;
    config_.n_embd = 256;  // head dim 64
    config_.block_size = 96;  // not a multiple of the 64-key tile: tails too
    config_.batch_size = 4;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  // Relative Frobenius distance of every parameter gradient, CUDA vs CPU, for one step.
  void expect_devices_agree(const std::string& spec, double tol) {
    const plan::Plan p = plan::parse(spec, config_.n_layer, config_.n_head);
    TokenFile data(path_);
    Trainer cpu(config_, p, data, torch::kCPU), gpu(config_, p, data, device_);
    std::map<std::string, torch::Tensor> gc, gg;
    StepResult rc = cpu.probe_step(p, {}, &gc);
    StepResult rg = gpu.probe_step(p, {}, &gg);
    EXPECT_NEAR(rg.loss, rc.loss, 1e-3 * rc.loss) << spec;
    ASSERT_EQ(gc.size(), gg.size());
    for (const auto& [name, g] : gc) {
      torch::Tensor a = g.to(torch::kFloat64), b = gg.at(name).to(torch::kCPU).to(torch::kFloat64);
      const double rel = (b - a).norm().item<double>() / (a.norm().item<double>() + 1e-30);
      EXPECT_LT(rel, tol) << spec << ": gradient of " << name;
    }
  }

  // `steps` training steps of a and b: equal losses, gradient norms and monitors, bit for bit.
  static void expect_same_steps(Trainer& a, Trainer& b, int steps, const std::string& what) {
    for (int s = 0; s < steps; ++s) {
      const StepResult x = a.train_step(), y = b.train_step();
      EXPECT_EQ(std::memcmp(&x.loss, &y.loss, sizeof x.loss), 0)
          << what << ": loss at step " << x.step << ": " << x.loss << " vs " << y.loss;
      EXPECT_EQ(std::memcmp(&x.grad_norm, &y.grad_norm, sizeof x.grad_norm), 0)
          << what << ": grad norm at step " << x.step << ": " << x.grad_norm << " vs " << y.grad_norm;
      ASSERT_EQ(x.monitors.size(), y.monitors.size());
      for (size_t i = 0; i < x.monitors.size(); ++i) {
        EXPECT_EQ(x.monitors[i].max_logit, y.monitors[i].max_logit) << what << ": monitor " << i;
        EXPECT_EQ(x.monitors[i].pbar_one, y.monitors[i].pbar_one) << what << ": monitor " << i;
        EXPECT_EQ(x.monitors[i].wq_sn, y.monitors[i].wq_sn) << what << ": monitor " << i;
      }
    }
  }
  // Parameters and AdamW moments of a and b, bit for bit.
  static void expect_same_state(const Trainer& a, const Trainer& b, const std::string& what) {
    const NamedTensors sa = a.state(), sb = b.state();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      const torch::Tensor x = sa[i].second.to(torch::kCPU).contiguous(), y = sb[i].second.to(torch::kCPU).contiguous();
      ASSERT_EQ(x.nbytes(), y.nbytes()) << sa[i].first;
      EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << what << ": " << sa[i].first << " differs";
    }
  }

  std::string dir_, path_;
  Config config_;
};

// The parameter digest computed on the GPU (d2, one launch per 64 tensors) equals the CPU's for
// the same parameter bits, and moves with a training step.
TEST_F(GpuTrainer, ParamDigestOnTheGpuEqualsTheCpuOne) {
  const plan::Plan p = plan::Plan::defaults(config_.n_layer, config_.n_head);
  TokenFile data(path_);
  Trainer cpu(config_, p, data, torch::kCPU), gpu(config_, p, data, device_);
  cpu.train_step();
  gpu.load_state(cpu.state());
  const std::string d = cpu.param_digest();
  EXPECT_EQ(gpu.param_digest(), d);
  gpu.train_step();
  EXPECT_NE(gpu.param_digest(), d);
}

TEST_F(GpuTrainer, DefaultPlanStepMatchesTheCpuEmulation) { expect_devices_agree("", 2e-2); }

// FP32 heads (FP32 q/k/v twins, an FP32 output head inside the BF16 output), an FP32
// LayerNorm feeding a low linear (the FP32 GEMM path), stabilized heads, and an FP32 output
// projection whose unrounded dO reaches bwd=fp32 and delta=fp32 heads.
TEST_F(GpuTrainer, MixedPlanStepMatchesTheCpuEmulation) {
  expect_devices_agree("L0.ln=fp32;L0.H1.o=fp32;L1.H2.qk=fp32;L1.H3.pv=fp32;L0.H{0,2}.softmax=stable(beta=2);"
                       "L1.proj=fp32;L1.H0.bwd=fp32;L0.H3.delta=fp32",
                       2e-2);
}

// The fused optimizer (gradient norm and AdamW in kernels/cuda/optimizer.cu) finds a kernel
// variant equal to LibTorch's multi-tensor update bit for bit, and three training steps with
// it (clipping active: the first steps' norms exceed grad_clip) leave every parameter, AdamW
// moment, loss and gradient norm bitwise equal to the same steps on LibTorch's ops.
TEST_F(GpuTrainer, FusedOptimizerStepsEqualLibTorchOnesBitwise) {
  const plan::Plan p = plan::Plan::defaults(config_.n_layer, config_.n_head);
  TokenFile data(path_);
  Trainer fused(config_, p, data, device_);
  setenv("REWIND_FUSED_OPTIMIZER", "0", 1);
  Trainer plain(config_, p, data, device_);
  EXPECT_EQ(plain.optimizer_path(), "foreach");
  unsetenv("REWIND_FUSED_OPTIMIZER");
  const std::string path = fused.optimizer_path();
  std::printf("optimizer path on %s: %s\n", device_name(device_).c_str(), path.c_str());
  ASSERT_EQ(path.rfind("fused", 0), 0u) << "no fused AdamW variant reproduces LibTorch's update";
  plain.load_state(fused.state());
  int clipped = 0;
  for (int s = 0; s < 3; ++s) {
    const StepResult a = fused.train_step(), b = plain.train_step();
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof a.loss), 0) << "loss at step " << s;
    EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof a.grad_norm), 0)
        << "grad norm at step " << s << ": " << a.grad_norm << " vs " << b.grad_norm;
    clipped += a.grad_norm > config_.grad_clip;
  }
  EXPECT_GT(clipped, 0) << "no step clipped: the clip path went untested";
  expect_same_state(fused, plain, "fused optimizer");
  EXPECT_EQ(fused.param_digest(), plain.param_digest());
}

// The fast block (train/fast_block.cpp: BF16 tensors, one autograd node per block) computes
// the module path's bits on CUDA: three training steps (clipping active, per-step head
// monitors) leave equal losses, gradient norms, monitors, parameters and AdamW moments, under
// the default plan, under stabilized and faulted heads, and under a plan whose promoted head
// sends layer 1 down the module path beside a fast layer 0.
TEST_F(GpuTrainer, FastBlockStepsEqualTheModulePathBitwise) {
  TokenFile data(path_);
  // Two micro-batches a step: the second runs on the BF16 weight casts the first made
  // (GPTImpl::keep_bf16_weights).
  Config c = config_;
  c.gradient_accumulation_steps = 2;
  for (const std::string spec : {"", "L0.H{0,2}.softmax=stable(beta=2);L1.H1.pv=fault(strength=8)",
                                 "L1.H3.pv=fp32"}) {
    const plan::Plan p = plan::parse(spec, c.n_layer, c.n_head);
    Trainer fast(c, p, data, device_), mod(c, p, data, device_);
    mod.model()->set_fast_path(FastPath::kOff);
    {  // the first step's gradients one by one: which op differs, if one does
      std::map<std::string, torch::Tensor> gf, gm;
      fast.probe_step(p, {}, &gf);
      mod.probe_step(p, {}, &gm);
      for (const auto& [name, g] : gm)
        EXPECT_TRUE(torch::equal(g.view(torch::kInt32), gf.at(name).view(torch::kInt32)))
            << spec << ": first gradient of " << name << " differs";
    }
    expect_same_steps(fast, mod, 3, spec);
    expect_same_state(fast, mod, spec);
  }
}

// CUDA graphs of the passes (train/step_graph.h) give the eager steps' bits: two micro-batches
// a step, the default plan, then a plan with an FP32 head (the module path in layer 1, the
// FP32 kernels on a second stream) from the sixth step; each plan's first step runs eagerly
// (REWIND_CUDA_GRAPHS=1), its second is captured, the rest replay. A probe step on the graph gives the same gradients.
TEST_F(GpuTrainer, GraphStepsEqualEagerStepsBitwise) {
  TokenFile data(path_);
  Config c = config_;
  c.gradient_accumulation_steps = 2;
  const plan::Plan p0 = plan::Plan::defaults(c.n_layer, c.n_head);
  const plan::Plan p1 = plan::parse("L1.H3.pv=fp32;L0.H1.softmax=stable(beta=2)", c.n_layer, c.n_head);
  setenv("REWIND_CUDA_GRAPHS", "0", 1);
  Trainer eager(c, p0, data, device_);
  setenv("REWIND_CUDA_GRAPHS", "1", 1);  // capture after one eager step (default 16)
  Trainer graphed(c, p0, data, device_);
  unsetenv("REWIND_CUDA_GRAPHS");
  ASSERT_EQ(eager.step_graph(), nullptr);
  ASSERT_NE(graphed.step_graph(), nullptr);
  expect_same_steps(graphed, eager, 5, "default plan");
  EXPECT_EQ(graphed.step_graph()->captures(), 1);
  EXPECT_EQ(graphed.step_graph()->replays(), 4);
  graphed.set_plan(p1);
  eager.set_plan(p1);
  expect_same_steps(graphed, eager, 4, "fp32 head");
  EXPECT_EQ(graphed.step_graph()->captures(), 2);
  EXPECT_EQ(graphed.step_graph()->replays(), 7);
  expect_same_state(graphed, eager, "after 9 steps");
  std::map<std::string, torch::Tensor> gg, ge;
  graphed.probe_step(p1, {}, &gg);
  eager.probe_step(p1, {}, &ge);
  EXPECT_EQ(graphed.step_graph()->replays(), 8);
  for (const auto& [name, g] : ge)
    EXPECT_TRUE(torch::equal(g.view(torch::kInt32), gg.at(name).view(torch::kInt32))) << "probe gradient of " << name;
}

// Sampled monitors (--monitor-every 3) in CUDA graphs: one graph, captured with the monitors,
// serves steps with and without them (the kernels read the step's flag); every step has the
// bits of an eager run that monitors every step, the due steps its monitors, the others none.
// Then a plan with a stabilized head (whose variant counts regardless of the flag).
TEST_F(GpuTrainer, SampledMonitorsInAGraphKeepTheBitsAndTheDueStepsMonitors) {
  TokenFile data(path_);
  const plan::Plan p0 = plan::Plan::defaults(config_.n_layer, config_.n_head);
  const plan::Plan p1 = plan::parse("L0.H1.softmax=stable(beta=2)", config_.n_layer, config_.n_head);
  setenv("REWIND_CUDA_GRAPHS", "0", 1);
  Trainer every(config_, p0, data, device_);
  setenv("REWIND_CUDA_GRAPHS", "1", 1);
  Trainer sampled(config_, p0, data, device_);
  unsetenv("REWIND_CUDA_GRAPHS");
  sampled.set_monitor_every(3);
  for (const plan::Plan* p : {&p0, &p1}) {
    every.set_plan(*p);
    sampled.set_plan(*p);
    for (int i = 0; i < 7; ++i) {
      const StepResult x = every.train_step(), y = sampled.train_step();
      SCOPED_TRACE(testing::Message() << "step " << x.step);
      EXPECT_EQ(std::memcmp(&x.loss, &y.loss, sizeof x.loss), 0);
      EXPECT_EQ(std::memcmp(&x.grad_norm, &y.grad_norm, sizeof x.grad_norm), 0);
      if (!monitor_due(3, x.step)) {
        EXPECT_TRUE(y.monitors.empty());
        continue;
      }
      ASSERT_EQ(x.monitors.size(), y.monitors.size());
      for (size_t m = 0; m < x.monitors.size(); ++m) {
        EXPECT_EQ(x.monitors[m].max_logit, y.monitors[m].max_logit) << "monitor " << m;
        EXPECT_EQ(x.monitors[m].repmax_rate, y.monitors[m].repmax_rate) << "monitor " << m;
        EXPECT_EQ(x.monitors[m].pbar_one, y.monitors[m].pbar_one) << "monitor " << m;
        EXPECT_EQ(x.monitors[m].wq_sn, y.monitors[m].wq_sn) << "monitor " << m;
      }
    }
  }
  EXPECT_EQ(sampled.step_graph()->captures(), 2);
  EXPECT_EQ(sampled.step_graph()->replays(), 12);
  expect_same_state(sampled, every, "after 14 steps");
}

// With a digest wanted, the fused AdamW pass sums the digest of the parameters it writes
// (kernels/cuda/optimizer.cu); that digest, read back behind the step, equals the one computed
// from the parameters afterwards, and moves with every step.
TEST_F(GpuTrainer, DigestSummedByTheFusedUpdateEqualsTheParamDigest) {
  TokenFile data(path_);
  const plan::Plan p = plan::Plan::defaults(config_.n_layer, config_.n_head);
  Trainer t(config_, p, data, device_);
  ASSERT_EQ(t.optimizer_path().rfind("fused", 0), 0u);
  t.set_want_digest(true);
  std::string before = t.param_digest();
  for (int s = 0; s < 3; ++s) {
    const StepResult r = t.train_step();
    ASSERT_TRUE(r.digest) << "step " << s;
    const std::string d = r.digest();
    EXPECT_EQ(d, t.param_digest()) << "step " << s;
    EXPECT_NE(d, before) << "step " << s;
    before = d;
  }
  t.set_want_digest(false);
  EXPECT_FALSE(t.train_step().digest);
}

// The fused cross-entropy kernels (kernels/cuda/cross_entropy.cu) against an FP64 reference:
// the loss to FP32 summation error, each logit's BF16 gradient to half a BF16 ulp; two runs
// bitwise equal; a NaN logit gives a NaN loss. Both the 16-byte path (V = 50304) and the
// scalar one (V = 1001).
TEST_F(GpuTrainer, FusedCrossEntropyMatchesFp64AndRepeatsBitwise) {
  for (const int64_t vocab : {50304, 1001}) {
    const int64_t n = 96;
    torch::Tensor logits = (torch::randn({n, vocab}, torch::TensorOptions().dtype(torch::kFloat64)) * 3.0)
                               .to(torch::kBFloat16).to(device_);
    const torch::Tensor targets = torch::randint(vocab, {n}, torch::TensorOptions().dtype(torch::kLong)).to(device_);
    auto run = [&](torch::Tensor& grad) {
      torch::Tensor l = logits.detach().clone().requires_grad_(true);
      torch::Tensor loss = fused_cross_entropy(l, targets);
      (loss * 0.5).backward();
      grad = l.grad().to(torch::kCPU);
      return loss.to(torch::kCPU);
    };
    torch::Tensor g1, g2;
    const torch::Tensor loss1 = run(g1), loss2 = run(g2);
    EXPECT_TRUE(torch::equal(loss1, loss2)) << vocab;
    EXPECT_TRUE(torch::equal(g1.view(torch::kShort), g2.view(torch::kShort))) << vocab;
    const torch::Tensor x = logits.to(torch::kCPU).to(torch::kFloat64), t = targets.to(torch::kCPU);
    const torch::Tensor lse = x.logsumexp(1), ref_loss = (lse - x.gather(1, t.unsqueeze(1)).squeeze(1)).mean();
    EXPECT_NEAR(loss1.item<double>(), ref_loss.item<double>(), 1e-5 * ref_loss.item<double>()) << vocab;
    const double scale = 0.5 / n;
    const torch::Tensor ref = ((x - lse.unsqueeze(1)).exp() - torch::zeros_like(x).scatter_(1, t.unsqueeze(1), 1.0)) * scale;
    const torch::Tensor err = (g1.to(torch::kFloat64) - ref).abs() - (ref.abs() * (1.0 / 256) + 1e-6 * scale);
    EXPECT_LE(err.max().item<double>(), 0.0) << vocab << ": a gradient off by more than half a BF16 ulp";
    logits.index_put_({3, 7}, std::nan(""));
    torch::Tensor g3;
    EXPECT_TRUE(std::isnan(run(g3).item<float>())) << vocab;
  }
}

// The default loss on CUDA (BF16 head, fused cross-entropy) against the module path's FP32
// loss (REWIND_FUSED_LOSS=0): the same loss to FP32 summation order, gradients to BF16 rounding.
TEST_F(GpuTrainer, FusedLossMatchesTheModuleLoss) {
  TokenFile data(path_);
  const plan::Plan p = plan::Plan::defaults(config_.n_layer, config_.n_head);
  Trainer fused(config_, p, data, device_), mod(config_, p, data, device_);
  mod.model()->set_fused_loss(FastPath::kOff);
  std::map<std::string, torch::Tensor> gf, gm;
  const StepResult a = fused.probe_step(p, {}, &gf), b = mod.probe_step(p, {}, &gm);
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
  EXPECT_NE(std::memcmp(&a.loss, &b.loss, sizeof a.loss) == 0 &&
                torch::equal(gf.at("wte").view(torch::kInt32), gm.at("wte").view(torch::kInt32)),
            true)
      << "the fused loss did not run: loss and head gradient bitwise equal to the module path's";
  for (const auto& [name, g] : gm) {
    const torch::Tensor x = g.to(torch::kCPU).to(torch::kFloat64), y = gf.at(name).to(torch::kCPU).to(torch::kFloat64);
    EXPECT_LT((y - x).norm().item<double>() / (x.norm().item<double>() + 1e-30), 1e-2) << "gradient of " << name;
  }
}

}  // namespace
}  // namespace rwd::train
