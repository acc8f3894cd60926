// Trainer: bitwise determinism, learning on the synthetic corpus, plans that change numbers,
// state save/load.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "common/hash.h"
#include "train/config.h"
#include "train/data.h"
#include "plan/plan.h"
#include "train/trainer.h"

namespace rwd::train {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rewind_trainer_XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/train.bin";
    write_synth_tokens(path_, 200000, 64, 7);
    config_ = Config::preset("tiny");
    config_.vocab_size = 64;
    config_.n_embd = 32;
    config_.block_size = 32;
    config_.learning_rate = 3e-3;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::vector<uint32_t> loss_bits(const std::string& spec, int steps) {
    TokenFile data(path_);
    Trainer t(config_, plan::parse(spec, config_.n_layer, config_.n_head), data);
    std::vector<uint32_t> bits;
    for (int i = 0; i < steps; ++i) {
      StepResult r = t.train_step();
      uint32_t b;
      std::memcpy(&b, &r.loss, 4);
      bits.push_back(b);
      std::memcpy(&b, &r.grad_norm, 4);
      bits.push_back(b);
    }
    return bits;
  }

  std::string dir_, path_;
  Config config_;
};

// The fingerprint and the largest token are computed once per file in a process (bisect opens
// the token file for every probe), and a file rewritten in between is read again.
TEST_F(TrainerTest, TokenFileFactsFollowTheFileNotTheProcess) {
  std::string fp;
  uint16_t mx;
  {
    TokenFile a(path_);
    fp = a.fingerprint();
    mx = a.max_token();
    TokenFile again(path_);
    EXPECT_EQ(again.fingerprint(), fp);
    EXPECT_EQ(again.max_token(), mx);
    const uint64_t h = fnv1a64(a.data(), a.size() * 2);
    EXPECT_EQ(fp, std::to_string(a.size()) + ":" + hex64(h));
  }
  write_synth_tokens(path_, 200000, 64, 8);  // same size, other tokens
  struct timespec later[2] = {{0, UTIME_OMIT}, {2000000000, 0}};  // a clearly different mtime
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), later, 0), 0);
  TokenFile b(path_);
  EXPECT_NE(b.fingerprint(), fp);
  EXPECT_EQ(b.fingerprint(), std::to_string(b.size()) + ":" + hex64(fnv1a64(b.data(), b.size() * 2)));
  write_synth_tokens(path_, 200000, 32, 8);  // fewer token values: a smaller maximum
  struct timespec later2[2] = {{0, UTIME_OMIT}, {2000000001, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), later2, 0), 0);
  TokenFile c(path_);
  EXPECT_LT(c.max_token(), 32);
}

TEST_F(TrainerTest, SameCommandTwiceGivesBitwiseIdenticalLosses) {
  auto a = loss_bits("", 5);
  auto b = loss_bits("", 5);
  EXPECT_EQ(a, b);
}

TEST_F(TrainerTest, PhaseTimesOnlyWhenAskedAndWithoutChangingBits) {
  auto plain = loss_bits("", 5);
  {
    TokenFile data(path_);
    Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
    for (int i = 0; i < 4; ++i) t.train_step();
    EXPECT_EQ(t.phase_report(), "");
  }
  setenv("REWIND_TIMES", "phase", 1);
  auto timed = loss_bits("", 5);
  TokenFile data(path_);
  Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
  for (int i = 0; i < 4; ++i) t.train_step();
  unsetenv("REWIND_TIMES");
  const std::string report = t.phase_report();
  EXPECT_NE(report.find("phase times over 2 steps after 2"), std::string::npos) << report;
  for (const char* phase : {" forward ", " backward ", " grad norm ", " monitors ", " optimizer "})
    EXPECT_NE(report.find(phase), std::string::npos) << phase << " missing: " << report;
  EXPECT_EQ(plain, timed);
}

TEST_F(TrainerTest, LoadStateRestoresTheRecordedGenerator) {
  TokenFile data(path_);
  Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
  NamedTensors s = t.state();
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  s.emplace_back("rng/cpu", gen.get_state().clone());  // what Recorder::checkpoint adds
  const torch::Tensor first = torch::rand({8});
  torch::rand({100});  // the generator moves on
  t.load_state(s);
  EXPECT_TRUE(torch::equal(torch::rand({8}), first));
}

// 30 alternating W / W^T power steps from the same start vector: the monitor's earlier method.
double plain_power_iteration(const torch::Tensor& w) {
  torch::Tensor a = w.to(torch::kFloat64), v = torch::ones({a.size(1)}, a.options()) / std::sqrt(double(a.size(1)));
  torch::Tensor u;
  for (int i = 0; i < 30; ++i) {
    u = torch::mv(a, v);
    u = u / u.norm();
    v = torch::mv(a.t(), u);
    if (i < 29) v = v / v.norm();
  }
  return v.norm().item<double>();
}

TEST(SpectralNorm, AtLeastAsAccurateAsPlainPowerIteration) {
  torch::manual_seed(5);
  for (auto shape : {std::vector<int64_t>{12, 64, 768}, std::vector<int64_t>{3, 40, 24}}) {
    torch::Tensor w = torch::randn(shape, torch::kFloat32);
    // Matrix 0 has a clear top direction; the others are Gaussian, whose top singular values
    // crowd together (the slowest case for any power iteration, and W_Q at initialization).
    w.select(0, 0).add_(torch::outer(torch::randn({shape[1]}), torch::randn({shape[2]})));
    const std::vector<double> sn = spectral_norms(w);
    torch::Tensor exact = torch::linalg_svdvals(w.to(torch::kFloat64)).select(1, 0);
    for (int64_t i = 0; i < shape[0]; ++i) {
      const double x = exact[i].item<double>(), plain = plain_power_iteration(w.select(0, i));
      EXPECT_LE(sn[i], x * (1 + 1e-12)) << "matrix " << i;  // a Rayleigh quotient: never above
      EXPECT_LE(x - sn[i], (x - plain) + 1e-9 * x) << "matrix " << i << ": worse than plain";
      EXPECT_NEAR(sn[i], x, (i == 0 ? 1e-9 : 5e-2) * x) << "matrix " << i;
    }
  }
  EXPECT_EQ(spectral_norm(torch::zeros({8, 16})), 0.0);
  EXPECT_NEAR(spectral_norm(torch::eye(5) * 3.0), 3.0, 1e-12);
}

TEST_F(TrainerTest, LearnsTheSyntheticCorpus) {
  TokenFile data(path_);
  Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
  float first = t.train_step().loss;
  float last = first;
  for (int i = 0; i < 60; ++i) last = t.train_step().loss;
  EXPECT_NEAR(first, std::log(64.0f), 0.3f);
  EXPECT_LT(last, first - 0.8f) << "first " << first << " last " << last;
}

TEST_F(TrainerTest, EveryModuleOverrideChangesTheNumbers) {
  // Tiles of 8x8 on T=32, so that naive attention and tiling=off differ from the base.
  auto base = loss_bits("tile=8x8", 2);
  for (const char* spec : {"L0.qkv=fp32", "L0.proj=fp32", "L0.mlp=fp32", "L1.ln=fp32",
                           "head=fp32", "L1.H2.pv=fp32", "L0.attn=naive", "tiling=off",
                           "all=fp32"}) {
    EXPECT_NE(loss_bits(std::string("tile=8x8;") + spec, 2), base) << spec;
  }
}

TEST_F(TrainerTest, StateRoundTripContinuesBitwise) {
  TokenFile data(path_);
  auto plan = plan::Plan::defaults(config_.n_layer, config_.n_head);
  Trainer a(config_, plan, data);
  for (int i = 0; i < 3; ++i) a.train_step();
  NamedTensors saved;
  for (auto& [name, t] : a.state()) saved.emplace_back(name, t.clone());
  float expect = a.train_step().loss;
  Trainer b(config_, plan, data);
  b.load_state(saved);
  EXPECT_EQ(b.step(), 3);
  float got = b.train_step().loss;
  EXPECT_EQ(std::memcmp(&expect, &got, 4), 0);
}

// The parameter digest (d2) changes with any one bit of any parameter, not with the thread
// count; a recorded legacy digest (no "d2:" prefix) gets FNV-1a over the parameter bytes.
TEST_F(TrainerTest, ParamDigestSeesEveryBitAndNotTheThreadCount) {
  TokenFile data(path_);
  Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
  t.train_step();
  const std::string d = t.param_digest();
  ASSERT_EQ(d.size(), 19u);
  EXPECT_EQ(d.rfind("d2:", 0), 0u);
  const int threads = at::get_num_threads();
  at::set_num_threads(threads == 1 ? 2 : 1);
  EXPECT_EQ(t.param_digest(), d);
  at::set_num_threads(threads);

  uint64_t fnv = kFnvOffset;
  std::vector<torch::Tensor> params;
  for (const auto& [name, p] : t.state()) {
    if (name.rfind("param/", 0) != 0) continue;
    params.push_back(p);
    fnv = fnv1a64(p.data_ptr(), p.numel() * p.element_size(), fnv);
  }
  EXPECT_EQ(t.param_digest("0123456789abcdef"), hex64(fnv));

  torch::NoGradGuard no_grad;
  for (size_t k : {size_t{0}, params.size() - 1}) {  // first and last tensor, last word
    torch::Tensor words = params[k].view(torch::kInt32).flatten();
    const int64_t last = words.numel() - 1;
    words[last].bitwise_xor_(1);
    EXPECT_NE(t.param_digest(), d) << k;
    words[last].bitwise_xor_(1);
    EXPECT_EQ(t.param_digest(), d) << k;
  }
}

// The fast block (train/fast_block.cpp), forced on the CPU, against the module path: its
// layouts and gradient plumbing. The CPU's BF16 GEMMs accumulate otherwise than the
// emulation's FP32 ones, so they agree to BF16 rounding here; on CUDA the two are bitwise
// equal (gpu_trainer_test). A plan with a promoted head sends layer 1 down the module path.
TEST_F(TrainerTest, FastBlockMatchesTheModulePathOnTheCpu) {
  TokenFile data(path_);
  for (const std::string spec : {"", "L0.H{0,1}.softmax=stable(beta=2);L1.H0.pv=fault(strength=8)",
                                 "L1.H1.pv=fp32"}) {
    const plan::Plan p = plan::parse(spec, config_.n_layer, config_.n_head);
    Trainer fast(config_, p, data), mod(config_, p, data);
    fast.model()->set_fast_path(FastPath::kOn);
    mod.model()->set_fast_path(FastPath::kOff);
    std::map<std::string, torch::Tensor> gf, gm;
    const StepResult a = fast.probe_step(p, {}, &gf), b = mod.probe_step(p, {}, &gm);
    EXPECT_NEAR(a.loss, b.loss, 1e-3 * b.loss) << spec;
    ASSERT_EQ(gf.size(), gm.size());
    for (const auto& [name, g] : gm) {
      const torch::Tensor x = g.to(torch::kFloat64), y = gf.at(name).to(torch::kFloat64);
      const double rel = (y - x).norm().item<double>() / (x.norm().item<double>() + 1e-30);
      EXPECT_LT(rel, 2e-2) << spec << ": gradient of " << name;
    }
    ASSERT_EQ(a.monitors.size(), b.monitors.size());
    for (size_t i = 0; i < a.monitors.size(); ++i)
      EXPECT_NEAR(a.monitors[i].max_logit, b.monitors[i].max_logit, 2e-2 * std::abs(b.monitors[i].max_logit) + 1e-3);
  }
}

// The fast block and head on BF16 weight casts kept from an earlier forward (a step's later
// micro-batches, GPTImpl::keep_bf16_weights) compute the bits of fresh casts, and casts kept
// across a change of the weights are not reused once dropped.
TEST_F(TrainerTest, KeptBf16WeightCastsGiveTheBitsOfFreshOnes) {
  TokenFile data(path_);
  const plan::Plan p = plan::Plan::defaults(config_.n_layer, config_.n_head);
  Trainer t(config_, p, data);
  GPT& m = t.model();
  m->set_fast_path(FastPath::kOn);
  m->set_fused_loss(FastPath::kOn);
  torch::manual_seed(5);
  const torch::Tensor x = torch::randint(0, config_.vocab_size, {2, config_.block_size}, torch::kLong);
  const torch::Tensor y = torch::randint(0, config_.vocab_size, {2, config_.block_size}, torch::kLong);
  auto run = [&] {  // loss and every parameter's gradient, as bits
    for (auto& q : m->parameters()) q.mutable_grad() = torch::Tensor();
    const torch::Tensor loss = m->loss(x, y, p, nullptr);
    loss.backward();
    std::vector<torch::Tensor> out = {loss.detach().clone()};
    for (auto& q : m->parameters()) out.push_back(q.grad().clone());
    return out;
  };
  auto same = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!torch::equal(a[i].view(torch::kInt32), b[i].view(torch::kInt32))) return false;
    return true;
  };
  const auto fresh = run();
  m->keep_bf16_weights(true);
  const auto first = run(), kept = run();  // the second forward reuses the first's casts
  EXPECT_TRUE(same(fresh, first));
  EXPECT_TRUE(same(fresh, kept));
  m->keep_bf16_weights(false);
  {
    torch::NoGradGuard no_grad;
    for (auto& q : m->parameters()) q.mul_(1.5);
  }
  const auto changed = run();
  EXPECT_FALSE(same(fresh, changed));
  m->keep_bf16_weights(true);
  EXPECT_TRUE(same(changed, run()));
  EXPECT_TRUE(same(changed, run()));
  m->keep_bf16_weights(false);
}

// The BF16 head and fused cross-entropy (fast_block.h), forced on the CPU, against the module
// path's FP32 loss: the same loss to FP32 summation order, the same gradients to the error of
// the host's BF16 matmuls. That error depends on the CPU: LibTorch 1.13 on a CPU without
// AVX512-BF16 sums BF16 products with 3.6% relative error (a 64 x 1024 x 256 product against
// FP64, where FP32 sums rounded once give 0.17%), and the gradients here then differ by up to
// 1.7% (under 1% on the machines where this test first ran); a plumbing error differs by O(1).
TEST_F(TrainerTest, FusedLossMatchesTheModuleLossOnTheCpu) {
  TokenFile data(path_);
  const plan::Plan p = plan::Plan::defaults(config_.n_layer, config_.n_head);
  Trainer fused(config_, p, data), mod(config_, p, data);
  fused.model()->set_fused_loss(FastPath::kOn);
  mod.model()->set_fused_loss(FastPath::kOff);
  std::map<std::string, torch::Tensor> gf, gm;
  const StepResult a = fused.probe_step(p, {}, &gf), b = mod.probe_step(p, {}, &gm);
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
  ASSERT_EQ(gf.size(), gm.size());
  for (const auto& [name, g] : gm) {
    const torch::Tensor x = g.to(torch::kFloat64), y = gf.at(name).to(torch::kFloat64);
    EXPECT_LT((y - x).norm().item<double>() / (x.norm().item<double>() + 1e-30), 5e-2) << "gradient of " << name;
  }
}

// A digest wanted from train_step is the digest of the parameters after its update.
TEST_F(TrainerTest, StepDigestIsTheDigestAfterTheUpdate) {
  TokenFile data(path_);
  Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
  t.set_want_digest(true);
  const StepResult r = t.train_step();
  ASSERT_TRUE(r.digest);
  EXPECT_EQ(r.digest(), t.param_digest());
}

TEST_F(TrainerTest, MonitorsArePopulated) {
  TokenFile data(path_);
  Trainer t(config_, plan::Plan::defaults(config_.n_layer, config_.n_head), data);
  StepResult r = t.train_step();
  ASSERT_EQ(r.monitors.size(), static_cast<size_t>(config_.n_layer * config_.n_head));
  for (const auto& m : r.monitors) {
    EXPECT_GT(m.wq_sn, 0.0);
    EXPECT_GT(m.max_logit, -1e29);
  }
}

// --monitor-every 3: monitors on steps 0 and 3 only, equal to an every-step run's there, and
// the same loss, gradient norm and parameters on every step (the monitors change no bit).
TEST_F(TrainerTest, SampledMonitorsOnlyOnDueStepsAndTheSameBits) {
  TokenFile data(path_);
  const plan::Plan plan = plan::Plan::defaults(config_.n_layer, config_.n_head);
  Trainer every(config_, plan, data), sampled(config_, plan, data);
  sampled.set_monitor_every(3);
  EXPECT_THROW(sampled.set_monitor_every(0), std::exception);
  sampled.set_monitor_every(3);
  for (int s = 0; s < 6; ++s) {
    SCOPED_TRACE(s);
    const StepResult a = every.train_step(), b = sampled.train_step();
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof a.loss), 0);
    EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof a.grad_norm), 0);
    EXPECT_EQ(monitor_due(3, s), s % 3 == 0);
    if (!monitor_due(3, s)) {
      EXPECT_TRUE(b.monitors.empty());
      continue;
    }
    ASSERT_EQ(b.monitors.size(), a.monitors.size());
    for (size_t i = 0; i < a.monitors.size(); ++i) {
      EXPECT_EQ(b.monitors[i].max_logit, a.monitors[i].max_logit);
      EXPECT_EQ(b.monitors[i].repmax_rate, a.monitors[i].repmax_rate);
      EXPECT_EQ(b.monitors[i].pbar_one, a.monitors[i].pbar_one);
      EXPECT_EQ(b.monitors[i].wq_sn, a.monitors[i].wq_sn);
    }
  }
  EXPECT_EQ(every.param_digest(), sampled.param_digest());
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  Config c;
  c.learning_rate = 1e-3;
  c.min_lr = 1e-5;
  c.warmup_iters = 10;
  c.lr_decay_iters = 110;
  EXPECT_LT(lr_at(c, 0), lr_at(c, 5));
  EXPECT_NEAR(lr_at(c, 10), 1e-3, 1e-12);
  EXPECT_NEAR(lr_at(c, 60), 0.5 * (1e-3 + 1e-5), 1e-9);
  EXPECT_NEAR(lr_at(c, 200), 1e-5, 1e-15);
}

}  // namespace
}  // namespace rwd::train
