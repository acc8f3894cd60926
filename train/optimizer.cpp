// The optimizer's end of a training step: global gradient norm and AdamW, with LibTorch's
// multi-tensor ops or, on a GPU, the fused kernels of kernels/cuda/optimizer.h once one of
// their rounding variants has been shown to equal LibTorch's update bit for bit.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/switches.h"
#include "train/trainer.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/cuda/optimizer.h"
#endif

namespace rwd::train {

namespace {

constexpr double kAdamEps = 1e-8;

// AdamW's scalars for one update (double, as LibTorch's ops take them).
struct AdamStep {
  double lr, weight_decay, b1, b2, bc1, bc2;
};

AdamStep adam_step(const Config& c, double lr, int64_t step) {
  const double t = static_cast<double>(step + 1);
  return {lr, c.weight_decay, c.beta1, c.beta2, 1.0 - std::pow(c.beta1, t), 1.0 - std::pow(c.beta2, t)};
}

// The update with LibTorch's multi-tensor ops: on CUDA a handful of launches for all
// parameters instead of seven per parameter; on the CPU they run the per-tensor ops. The same
// elementwise FP32 arithmetic either way, in the same order. decay: the parameters that take
// weight decay (a subset of p).
void foreach_adamw(std::vector<torch::Tensor>& p, std::vector<torch::Tensor>& g,
                   std::vector<torch::Tensor>& m, std::vector<torch::Tensor>& v,
                   std::vector<torch::Tensor>& decay, const AdamStep& a) {
  if (!decay.empty()) torch::_foreach_mul_(decay, 1.0 - a.lr * a.weight_decay);
  torch::_foreach_mul_(m, a.b1);
  torch::_foreach_add_(m, g, 1.0 - a.b1);
  torch::_foreach_mul_(v, a.b2);
  torch::_foreach_addcmul_(v, g, g, 1.0 - a.b2);
  std::vector<torch::Tensor> denom = torch::_foreach_div(v, a.bc2);
  torch::_foreach_sqrt_(denom);
  torch::_foreach_add_(denom, kAdamEps);
  torch::_foreach_addcdiv_(p, m, denom, -a.lr / a.bc1);
}

#ifdef REWIND_CUDA
namespace kc = kernels::cuda;

kc::AdamScalars adam_scalars(const AdamStep& a, double clip_coef, int variant) {
  kc::AdamScalars s{};
  s.scale_g = clip_coef > 0 ? 1 : 0;
  s.gscale = static_cast<float>(clip_coef);
  s.decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  s.b1 = static_cast<float>(a.b1);
  s.a1 = static_cast<float>(1.0 - a.b1);
  s.b2 = static_cast<float>(a.b2);
  s.a2 = static_cast<float>(1.0 - a.b2);
  s.bc2 = static_cast<float>(a.bc2);
  s.rbc2_d = static_cast<float>(1.0 / a.bc2);
  s.rbc2_f = 1.0f / static_cast<float>(a.bc2);
  s.eps = static_cast<float>(kAdamEps);
  s.step = static_cast<float>(-a.lr / a.bc1);
  s.variant = variant;
  return s;
}

// Device segments for the fused kernels, or empty when a tensor does not qualify (not FP32,
// not contiguous, or a missing gradient: then the LibTorch path runs).
// digest: n accumulators (parameter i adds into digest[i]), or null.
std::vector<kc::AdamSegment> adam_segments(const std::vector<torch::Tensor>& p,
                                           const std::vector<torch::Tensor>& m,
                                           const std::vector<torch::Tensor>& v,
                                           const std::vector<bool>& decay,
                                           unsigned long long* digest = nullptr) {
  std::vector<kc::AdamSegment> segs;
  for (size_t i = 0; i < p.size(); ++i) {
    const torch::Tensor& g = p[i].grad();
    for (const torch::Tensor* t : {&p[i], &g, &m[i], &v[i]})
      if (!t->defined() || !t->is_cuda() || t->scalar_type() != torch::kFloat32 || !t->is_contiguous() ||
          t->numel() != p[i].numel())
        return {};
    if (p[i].numel() == 0) continue;
    segs.push_back({p[i].data_ptr<float>(), g.data_ptr<float>(), m[i].data_ptr<float>(),
                    v[i].data_ptr<float>(), p[i].numel(), decay[i] ? 1 : 0, digest ? digest + i : nullptr});
  }
  return segs;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::equal(a.view(torch::kInt32), b.view(torch::kInt32));
}

// The variant of the fused AdamW kernel that reproduces foreach_adamw (after a per-tensor clip
// multiply, as train_step does) bit for bit on `device`, or -1. Compared on tensors of wide
// dynamic range (values over e^±6) drawn from a generator of its own (the training RNG streams
// stay untouched), at scalars where every variant differs from the others.
int calibrate_fused_adamw(const torch::Device& device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20261125);
  const auto opt = torch::TensorOptions().dtype(torch::kFloat32);
  auto wide = [&](int64_t n, double scale, double spread) {
    return (torch::randn({n}, gen, opt) * torch::exp(spread * torch::randn({n}, gen, opt)) * scale).to(device);
  };
  const std::vector<int64_t> sizes = {70001, 4099, 33000};
  const std::vector<bool> decays = {true, false, true};
  std::vector<torch::Tensor> p0, g0, m0, v0;
  for (int64_t n : sizes) {
    p0.push_back(wide(n, 0.05, 2.0));
    g0.push_back(wide(n, 0.01, 2.0));
    m0.push_back(wide(n, 0.01, 1.0));
    v0.push_back(wide(n, 0.01, 1.0).square());
  }
  const AdamStep a{6e-4, 0.1, 0.9, 0.95, 1.0 - std::pow(0.9, 3.0), 1.0 - std::pow(0.95, 3.0)};
  const double coef = 0.3;
  auto clones = [](const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& t : ts) out.push_back(t.clone());
    return out;
  };
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> rp = clones(p0), rg = clones(g0), rm = clones(m0), rv = clones(v0), rdecay;
  for (size_t i = 0; i < sizes.size(); ++i) {
    rg[i].mul_(coef);
    if (decays[i]) rdecay.push_back(rp[i]);
  }
  foreach_adamw(rp, rg, rm, rv, rdecay, a);
  for (int variant = 0; variant < kc::kAdamVariants; ++variant) {
    std::vector<torch::Tensor> fp = clones(p0), fm = clones(m0), fv = clones(v0), fg = clones(g0);
    for (size_t i = 0; i < sizes.size(); ++i) fp[i].mutable_grad() = fg[i];
    const std::vector<kc::AdamSegment> segs = adam_segments(fp, fm, fv, decays);
    if (segs.size() != sizes.size()) return -1;
    const int rc = kc::adamw_update(segs.data(), static_cast<int>(segs.size()), adam_scalars(a, coef, variant),
                                    at::cuda::getCurrentCUDAStream(device.index()).stream());
    if (rc != 0) return -1;
    bool all = true;
    for (size_t i = 0; i < sizes.size() && all; ++i)
      all = same_bits(fp[i], rp[i]) && same_bits(fm[i], rm[i]) && same_bits(fv[i], rv[i]) && same_bits(fg[i], rg[i]);
    if (all) return variant;
  }
  return -1;
}
#endif

// The variant that reproduces LibTorch's update on `device` (-1: LibTorch's ops), found once
// per process and GPU: the answer depends on the device and the libraries alone, and a
// process may build several trainers (the calibration takes ~0.15 s of the first step).
int fused_adamw_variant(const torch::Device& device) {
#ifdef REWIND_CUDA
  if (!device.is_cuda() || !switches::on(switches::Switch::kFusedOptimizer)) return -1;
  static std::mutex mu;
  static std::map<int, int> found;
  std::lock_guard<std::mutex> lock(mu);
  const int index = device.has_index() ? device.index() : at::cuda::current_device();
  auto it = found.find(index);
  if (it == found.end()) it = found.emplace(index, calibrate_fused_adamw(device)).first;
  return it->second;
#else
  (void)device;
  return -1;
#endif
}

}  // namespace

bool Trainer::fused_optimizer() {
  if (fused_variant_ == -2) fused_variant_ = fused_adamw_variant(device_);
  return fused_variant_ >= 0;
}

std::string Trainer::optimizer_path() {
  return fused_optimizer() ? "fused (variant " + std::to_string(fused_variant_) + ")" : "foreach";
}

torch::Tensor Trainer::grad_norm_queued() {
#ifdef REWIND_CUDA
  if (fused_optimizer()) {
    std::vector<bool> decay(params_.size(), false);
    const std::vector<kc::AdamSegment> segs = adam_segments(params_, exp_avg_, exp_avg_sq_, decay);
    if (!segs.empty()) {
      const int count = static_cast<int>(segs.size());
      const auto dopt = torch::TensorOptions().dtype(torch::kFloat64).device(device_);
      torch::Tensor partials = torch::empty({kc::sumsq_partial_count(segs.data(), count)}, dopt);
      torch::Tensor out = torch::empty({1}, dopt);
      const int rc = kc::grad_sumsq_sqrt(segs.data(), count, partials.data_ptr<double>(), out.data_ptr<double>(),
                                         at::cuda::getCurrentCUDAStream().stream());
      if (rc != 0) throw Error(ExitCode::kInternal, "grad norm: CUDA launch failed (error " + std::to_string(rc) + ")");
      return out;
    }
  }
#endif
  // Accumulated in FP64 over all gradients laid end to end in parameter order: three kernels
  // and one host copy (LibTorch's reductions are deterministic).
  std::vector<torch::Tensor> flat;
  for (auto& p : params_)
    if (p.grad().defined()) flat.push_back(p.grad().reshape({-1}));
  return flat.empty() ? torch::zeros({1}, torch::kFloat64) : torch::cat(flat).to(torch::kFloat64).norm().reshape({1});
}

bool Trainer::adamw_update(double lr, double clip_coef, const torch::Tensor& digest_sums) {
  torch::NoGradGuard no_grad;
  const AdamStep a = adam_step(config_, lr, step_);
  std::vector<bool> decay_of(params_.size());
  // nanoGPT decays only matrices (dim >= 2), decoupled from the gradient.
  for (size_t i = 0; i < params_.size(); ++i)
    decay_of[i] = config_.weight_decay > 0 && params_[i].dim() >= 2;
#ifdef REWIND_CUDA
  if (fused_optimizer()) {
    auto* sums = digest_sums.defined() ? reinterpret_cast<unsigned long long*>(digest_sums.data_ptr<int64_t>()) : nullptr;
    const std::vector<kc::AdamSegment> segs = adam_segments(params_, exp_avg_, exp_avg_sq_, decay_of, sums);
    if (!segs.empty()) {
      const int rc = kc::adamw_update(segs.data(), static_cast<int>(segs.size()),
                                      adam_scalars(a, clip_coef, fused_variant_),
                                      at::cuda::getCurrentCUDAStream().stream());
      if (rc != 0) throw Error(ExitCode::kInternal, "AdamW: CUDA launch failed (error " + std::to_string(rc) + ")");
      return sums != nullptr;
    }
  }
#endif
  std::vector<torch::Tensor> p, g, m, v, decay;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    if (clip_coef > 0) params_[i].mutable_grad().mul_(clip_coef);
    p.push_back(params_[i]);
    g.push_back(params_[i].grad());
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    if (decay_of[i]) decay.push_back(params_[i]);
  }
  if (!p.empty()) foreach_adamw(p, g, m, v, decay, a);
  return false;
}

}  // namespace rwd::train
