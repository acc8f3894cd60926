// AdamW training loop with gradient accumulation, clipping and monitors.
#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "common/error.h"
#include "common/switches.h"
#include "common/hash.h"
#include "kernels/head_stats.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include "kernels/cuda/param_digest.h"
#endif

namespace rwd::train {

namespace {

// REWIND_TIMES=phase: the trainer waits for the device at each phase edge and adds up the
// time per phase (see Trainer::phase_report). Off by default: the waits slow a GPU run.
bool phase_times_enabled() { return switches::listed(switches::Switch::kTimes, "phase"); }

// A batch's token ids on `device`. On CUDA from pinned memory without waiting: a pageable
// copy would wait for the previous step's optimizer, and the GPU would then idle while the
// host starts queueing this step's forward.
torch::Tensor batch_on(const std::vector<int64_t>& v, int64_t rows, int64_t cols, const torch::Device& device) {
  TORCH_CHECK(static_cast<int64_t>(v.size()) == rows * cols, "batch of ", v.size(), " tokens for ", rows, " x ", cols);
  if (!device.is_cuda()) return torch::tensor(v, torch::kLong).view({rows, cols});
  return pinned_tokens(v, rows, cols).to(device, /*non_blocking=*/true);
}

}  // namespace

Trainer::Trainer(const Config& config, const plan::Plan& plan, const TokenFile& data,
                 torch::Device device, AttentionImpl impl, Init init)
    : config_(config), plan_(plan), data_(data),
      model_(config, init == Init::kRandom ? ParamAlloc{} : ParamAlloc{device, /*filled=*/false}),
      device_(device),
      phase_enabled_(phase_times_enabled()) {
  if (const int n = StepGraph::eager_steps_before_capture(device_); n > 0) graph_ = std::make_unique<StepGraph>(device_, n);
  if (plan.n_layer != config.n_layer || plan.n_head != config.n_head)
    throw UsageError("plan is for a different model size");
  if (data.max_token() >= config.vocab_size)
    throw Error(ExitCode::kData, "token file '" + data.path() + "' has token " +
                                     std::to_string(data.max_token()) + " >= vocab_size " +
                                     std::to_string(config.vocab_size));
  if (init == Init::kRandom) model_->init_weights(config.seed);
  model_->to(device_);
  model_->set_attention_impl(impl);
  if (impl != AttentionImpl::kRewind && plan != plan::Plan::defaults(config.n_layer, config.n_head))
    throw UsageError("--attention sdpa/torch runs PyTorch's own attention and takes no precision plan");
  for (auto& kv : model_->named_parameters()) {
    param_names_.push_back(kv.key());
    params_.push_back(kv.value());
    exp_avg_.push_back(init == Init::kRandom ? torch::zeros_like(kv.value()) : torch::empty_like(kv.value()));
    exp_avg_sq_.push_back(init == Init::kRandom ? torch::zeros_like(kv.value()) : torch::empty_like(kv.value()));
  }
}

QueuedPasses Trainer::queue_passes(const plan::Plan& plan, const std::vector<int>& capture_layers,
                                   const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys,
                                   bool use_buckets, bool monitors) {
  const int accum = config_.gradient_accumulation_steps;
  const int share = static_cast<int>(xs.size());
  const int first = comm_ ? comm_->rank() * share : 0;
  const bool ranks = comm_ && comm_->world() > 1;
  const KeepBf16Weights casts(model_, share > 1);  // the weights stay unchanged until the update
  GradBuckets* buckets = use_buckets ? buckets_.get() : nullptr;
  if (buckets) buckets->reset();  // an earlier step that threw mid-backward stays behind
  QueuedPasses q;
  q.bucketed = buckets != nullptr;
  // The W_Q spectral norms (the monitors) and the gradient norm are queued behind the first
  // backward and read after the loss: their host time overlaps the GPU's backward.
  for (int i = 0; i < share; ++i) {
    ForwardTap tap;
    if (first + i == 0) tap.tensor_layers = capture_layers;
    model_->set_sr_micro_batch(config_.seed, step_, first + i);
    torch::Tensor loss = model_->loss(xs[i], ys[i], plan, monitors ? &tap : nullptr);
    phase_mark(kPhaseForward);
    const bool last = i == share - 1;
    if (last && buckets) buckets->arm();  // exchange each bucket as its gradients complete
    (loss / accum).backward();
    if (last && buckets) buckets->finish();
    phase_mark(kPhaseBackward);
    if (monitors && !q.wq_norms.defined()) q.wq_norms = wq_spectral_norms_queued();
    if (last && !ranks) q.norm = grad_norm_queued();  // the gradients are complete
    q.losses.push_back(loss.detach());
    q.taps.push_back(std::move(tap));
  }
  return q;
}

StepResult Trainer::forward_backward(const plan::Plan& plan,
                                     const std::vector<int>& capture_layers) {
  StepResult r;
  r.step = step_;
  const int accum = config_.gradient_accumulation_steps;
  // This rank's share of the micro-batches (all of them in one process).
  const int share = comm_ ? accum / comm_->world() : accum;
  const int first = comm_ ? comm_->rank() * share : 0;
  const bool ranks = comm_ && comm_->world() > 1;
  const int64_t rows = config_.batch_size, cols = config_.block_size;
  std::vector<uint64_t> batch_hashes;
  std::vector<std::vector<int64_t>> xs, ys;
  phase_mark(-1);
  for (int micro = first; micro < first + share; ++micro) {
    Batch b = sample_batch(data_, config_.seed, step_, micro, config_.batch_size, config_.block_size);
    batch_hashes.push_back(b.hash);
    r.offsets.push_back(b.offsets);
    xs.push_back(std::move(b.x));
    ys.push_back(std::move(b.y));
  }
  phase_mark(kPhaseData);
  // Each micro-batch's loss and monitor statistics are read after the last one is queued: a
  // read inside the loop would make the host wait for the GPU before it queues the next
  // micro-batch, leaving the GPU idle while it does (the same values, summed in the same order).
  // Ranks capture their bucketed exchange with the passes. The buckets' hooks keep autograd's
  // accumulate-grad nodes alive, and a node is bound to the stream current when it was made: a
  // capture needs them made anew on its own stream, so the buckets are dropped before it and
  // made again inside it. Without them in the graph, ranks exchange after the replay.
  // A graph replays its launches' arguments, and the stochastic-rounding key is one of them: a
  // plan with sr heads runs eagerly, with this step's key (the same bits as its replay).
  const bool graphable = graph_ && capture_layers.empty() && !phase_enabled_ && !plan::rounds_stochastically(plan);
  // Sampled monitors: a graph is captured with them, and the kernels read this step's choice
  // from stats_flag_ (written here, before the replay, on the same stream).
  const bool monitored = !capture_layers.empty() || monitor_due(monitor_every_, step_);
  if (stats_flag_.defined()) stats_flag_.fill_(monitored ? 1 : 0);
  const bool capture_due = graphable && graph_->capture_due(plan, share);
  if (capture_due && buckets_) buckets_.reset();
  const int64_t bucket_bytes = buckets_in_graph_ ? GradBuckets::bytes_from_env() : 0;
  const StepGraph::Queue in_graph = [&](const std::vector<torch::Tensor>& xd, const std::vector<torch::Tensor>& yd) {
    if (bucket_bytes > 0) buckets_ = std::make_unique<GradBuckets>(*comm_, params_, bucket_bytes, /*on_hooks_thread=*/true);
    return queue_passes(plan, capture_layers, xd, yd, /*use_buckets=*/bucket_bytes > 0);
  };
  QueuedPasses q;
  const int64_t captures_before = graphable ? graph_->captures() : 0;
  const bool replayed = graphable && graph_->run(plan, xs, ys, rows, cols, params_, in_graph, q);
  // Every rank's graph must hold the same collectives: where one rank's capture with the
  // exchange failed, all drop theirs and capture the passes alone from the next step on.
  if (capture_due && bucket_bytes > 0) {
    const std::vector<int64_t> ok = comm_->host_allgather_int64(graph_->captures() > captures_before ? 1 : 0);
    if (std::find(ok.begin(), ok.end(), 0) != ok.end()) {
      buckets_in_graph_ = false;
      graph_->discard();
      std::fprintf(stderr, "warning: a rank's gradient exchange could not be captured with its passes; "
                           "the ranks exchange after each graph replay instead (same bits)\n");
    }
  }
  if (!replayed) {
    std::vector<torch::Tensor> xd, yd;
    for (int i = 0; i < share; ++i) {
      xd.push_back(batch_on(xs[i], rows, cols, device_));
      yd.push_back(batch_on(ys[i], rows, cols, device_));
    }
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
    q = queue_passes(plan, capture_layers, xd, yd, buckets_ != nullptr, monitored);
    if (graphable) graph_->ran_eagerly(plan, share);
  }
  torch::Tensor norm = q.norm;
  const std::vector<ForwardTap>& taps = q.taps;
  std::vector<std::shared_ptr<kernels::AttentionCapture>> all_caps;
  float loss_sum = 0;  // FP32, summed in micro-batch order
  // The losses in one copy, then every layer's statistics in another.
  const torch::Tensor host_losses = q.losses.empty() ? torch::Tensor() : torch::stack(q.losses).to(torch::kCPU);
  std::vector<kernels::AttentionCapture*> pending;
  if (monitored)
    for (const ForwardTap& tap : taps)
      for (const auto& c : tap.layers) pending.push_back(c.get());
  kernels::fetch_stats(pending);
  for (size_t m = 0; m < taps.size(); ++m) {
    loss_sum += host_losses[static_cast<int64_t>(m)].item<float>();
    if (!monitored) continue;  // a graph's taps hold stats the kernels left untouched
    const ForwardTap& tap = taps[m];
    for (size_t l = 0; l < tap.layers.size(); ++l) {
      if (m == 0) {
        all_caps.push_back(tap.layers[l]);
        if (tap.layers[l]->keep_tensors) r.captures[static_cast<int>(l)] = tap.layers[l];
      } else {
        kernels::merge_head_stats(all_caps[l]->stats, tap.layers[l]->stats.data(), tap.layers[l]->stats.size());
      }
    }
  }
  phase_mark(kPhaseLoss);
  if (ranks) {
    reduce_across_ranks(r, loss_sum, batch_hashes, all_caps, q.bucketed);
    phase_mark(kPhaseExchange);
  }
  uint64_t h = kFnvOffset;
  for (uint64_t bh : batch_hashes) h = fnv1a64(&bh, sizeof bh, h);
  r.batch_hash = h;
  r.loss = loss_sum / static_cast<float>(accum);
  if (!norm.defined()) norm = grad_norm_queued();
  r.grad_norm = static_cast<float>(norm.item<double>());  // global, in FP64
  phase_mark(kPhaseGradNorm);
  if (monitored) r.monitors = monitors(all_caps, q.wq_norms);
  phase_mark(kPhaseMonitors);
  return r;
}

StepResult Trainer::train_step(const std::vector<int>& capture_layers) {
  // Our kernels launch on the current device's stream: the trainer's GPU is current for the
  // whole step, whatever a library or an earlier call left current (without it: error 700
  // in a bisect's probes on rank 1 of 2 GPUs).
  std::optional<c10::DeviceGuard> on_device;
  if (device_.is_cuda()) on_device.emplace(device_);
  auto t0 = std::chrono::steady_clock::now();
  StepResult r = forward_backward(plan_, capture_layers);
  r.lr = lr_at(config_, step_);
  // Clipping scales the gradients by coef inside the update (the fused pass) or right before
  // it (a per-tensor multiply); the same FP32 product either way.
  double coef = 0.0;
  if (config_.grad_clip > 0 && std::isfinite(r.grad_norm) && r.grad_norm > config_.grad_clip)
    coef = config_.grad_clip / (static_cast<double>(r.grad_norm) + 1e-6);
  if (before_update_) before_update_();
  torch::Tensor sums;
  if (want_digest_ && device_.is_cuda())
    sums = torch::zeros({static_cast<int64_t>(params_.size())}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  const bool summed = adamw_update(r.lr, coef, sums);
  if (want_digest_) r.digest = summed ? digest_from_sums(sums) : param_digest_queued();
  phase_mark(kPhaseOptimizer);
  if (phase_enabled_ && ++phase_warmup_ <= kPhaseWarmupSteps) {
    std::fill(std::begin(phase_seconds_), std::end(phase_seconds_), 0.0);  // lazy init, autotune
    std::fill(std::begin(phase_host_seconds_), std::end(phase_host_seconds_), 0.0);
  } else if (phase_enabled_) {
    ++phase_steps_;
  }
  ++step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

StepResult Trainer::probe_step(const plan::Plan& plan, const std::vector<int>& capture_layers,
                               std::map<std::string, torch::Tensor>* grads) {
  std::optional<c10::DeviceGuard> on_device;  // as train_step
  if (device_.is_cuda()) on_device.emplace(device_);
  StepResult r = forward_backward(plan, capture_layers);
  r.lr = lr_at(config_, step_);
  if (grads) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].grad().defined()) (*grads)[param_names_[i]] = params_[i].grad().clone();
  }
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  return r;
}

NamedTensors Trainer::state() const {
  NamedTensors s;
  for (size_t i = 0; i < params_.size(); ++i) s.emplace_back("param/" + param_names_[i], params_[i].detach());
  for (size_t i = 0; i < params_.size(); ++i) s.emplace_back("adam_m/" + param_names_[i], exp_avg_[i]);
  for (size_t i = 0; i < params_.size(); ++i) s.emplace_back("adam_v/" + param_names_[i], exp_avg_sq_[i]);
  s.emplace_back("step", torch::tensor({step_}, torch::kLong));
  return s;
}

NamedTensors Trainer::rng_state() const {
  NamedTensors s;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.emplace_back("rng/cpu", gen.get_state().clone());
  }
  if (device_.is_cuda()) {  // seed and offset inside its state
    at::Generator cuda = at::globalContext().defaultGenerator(device_);
    std::lock_guard<std::mutex> lock(cuda.mutex());
    s.emplace_back("rng/cuda", cuda.get_state().clone());
  }
  return s;
}

void Trainer::load_state(const NamedTensors& s) {
  std::optional<c10::DeviceGuard> on_device;  // as train_step
  if (device_.is_cuda()) on_device.emplace(device_);
  std::map<std::string, torch::Tensor> m(s.begin(), s.end());
  torch::NoGradGuard no_grad;
  auto fetch = [&](const std::string& name, const torch::Tensor& like) {
    auto it = m.find(name);
    if (it == m.end()) throw Error(ExitCode::kData, "checkpoint lacks tensor '" + name + "'");
    if (it->second.sizes() != like.sizes())
      throw Error(ExitCode::kData, "checkpoint tensor '" + name + "' has the wrong shape (store from a different model config?)");
    return it->second;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].copy_(fetch("param/" + param_names_[i], params_[i]));
    exp_avg_[i].copy_(fetch("adam_m/" + param_names_[i], exp_avg_[i]));
    exp_avg_sq_[i].copy_(fetch("adam_v/" + param_names_[i], exp_avg_sq_[i]));
  }
  auto it = m.find("step");
  if (it == m.end()) throw Error(ExitCode::kData, "checkpoint lacks 'step'");
  step_ = it->second.item<int64_t>();
  // The default generators as the recorder saw them (training draws nothing from them today,
  // no dropout, but whatever does will replay): CPU always, CUDA when this trainer runs there.
  if (auto g = m.find("rng/cpu"); g != m.end()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(g->second);
  }
  if (auto g = m.find("rng/cuda"); g != m.end() && device_.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device_);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(g->second);
  }
}

void Trainer::phase_mark(int phase) {
  if (!phase_enabled_) return;
  const auto issued = std::chrono::steady_clock::now();  // the host is done queueing the phase
  if (device_.is_cuda()) torch::cuda::synchronize(device_.has_index() ? device_.index() : -1);
  const auto now = std::chrono::steady_clock::now();
  if (phase >= 0) {
    phase_seconds_[phase] += std::chrono::duration<double>(now - phase_t0_).count();
    phase_host_seconds_[phase] += std::chrono::duration<double>(issued - phase_t0_).count();
  }
  phase_t0_ = now;
}

std::string Trainer::phase_report() const {
  if (!phase_enabled_ || phase_steps_ == 0) return "";
  static const char* names[kNumPhases] = {"data", "forward", "backward", "loss+stats", "exchange", "grad norm", "monitors",
                                              "optimizer"};
  double total = 0;
  for (double v : phase_seconds_) total += v;
  std::string out = "phase times over " + std::to_string(phase_steps_) + " steps after " +
                    std::to_string(kPhaseWarmupSteps) +
                    " (ms/step, device synchronized at each edge; host: time to queue the work):";
  char buf[128];
  for (int i = 0; i < kNumPhases; ++i) {
    std::snprintf(buf, sizeof buf, " %s %.2f (%.0f%%, host %.2f)", names[i],
                  1e3 * phase_seconds_[i] / phase_steps_,
                  total > 0 ? 100.0 * phase_seconds_[i] / total : 0.0,
                  1e3 * phase_host_seconds_[i] / phase_steps_);
    out += buf;
  }
  out += fused_variant_ >= 0 ? "; optimizer: fused (variant " + std::to_string(fused_variant_) + ")"
                             : std::string("; optimizer: foreach");
  return out;
}

}  // namespace rwd::train
