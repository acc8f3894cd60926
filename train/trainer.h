// The training loop: AdamW, cosine LR with warmup, global gradient clipping, gradient
// accumulation, per-step monitors. Bitwise deterministic for a fixed thread count.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/data.h"
#include "train/dist.h"
#include "train/grad_buckets.h"
#include "train/model.h"
#include "train/step_graph.h"
#include "plan/plan.h"

namespace rwd::train {

// Whether a run trained with --monitor-every n records the monitors of `step`.
inline bool monitor_due(int monitor_every, int64_t step) { return monitor_every <= 1 || step % monitor_every == 0; }

// Per-(layer, head) monitors of one step (docs/bisect.md, monitors).
struct HeadMonitor {
  int layer = 0, head = 0;
  double wq_sn = 0;        // spectral norm of the head's W_Q slice (power iteration)
  double max_logit = 0;    // max unmasked S over the step's forward passes
  double repmax_rate = 0;  // fraction of query rows whose max repeats
  double pbar_one = 0;     // count of extra P̄ == 1 entries (ties) per step
  double stable_guard = 0; // stabilized softmax: guard firings
};

struct StepResult {
  int64_t step = 0;
  double lr = 0;
  float loss = 0;        // mean over micro-batches, FP32 bits are what replay compares
  float grad_norm = 0;   // global L2 norm before clipping
  std::vector<std::vector<int64_t>> offsets;  // per micro-batch sample offsets
  uint64_t batch_hash = 0;
  std::vector<HeadMonitor> monitors;
  double seconds = 0;
  // Attention tensors of the layers asked for (first micro-batch), name -> (B,H,T,D)/(B,H,T).
  std::map<int, std::shared_ptr<kernels::AttentionCapture>> captures;
  // train_step with set_want_digest(true): the parameter digest after the update (it may wait
  // for the device when called, on any thread); empty otherwise.
  std::function<std::string()> digest;
};

// A named FP32/int64 tensor of the trainer state (model + optimizer), in a fixed order.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class Trainer {
 public:
  // How a trainer's state starts: drawn from config.seed on the CPU (the same weights on every
  // device) and moved to the device; or for load_state, which overwrites every parameter and
  // moment (allocated uninitialized on the device: a restore skips 124M normal draws on one
  // CPU thread, ~1 s for gpt2-small, and their copy to the GPU).
  enum class Init { kRandom, kForLoad };

  // `data_seed` seeds batch sampling; the model is initialised from config.seed.
  Trainer(const Config& config, const plan::Plan& plan, const TokenFile& data,
          torch::Device device = torch::kCPU, AttentionImpl impl = AttentionImpl::kRewind,
          Init init = Init::kRandom);

  // Runs step `step()` and advances. capture_layers: layers whose attention tensors are kept.
  StepResult train_step(const std::vector<int>& capture_layers = {});
  // Forward+backward of one step without the optimizer update (for `rewind step`).
  StepResult probe_step(const plan::Plan& plan, const std::vector<int>& capture_layers,
                        std::map<std::string, torch::Tensor>* grads);

  int64_t step() const { return step_; }
  void set_plan(const plan::Plan& p) { plan_ = p; }
  const plan::Plan& plan() const { return plan_; }
  const Config& config() const { return config_; }
  GPT& model() { return model_; }

  // Model parameters, then AdamW moments, then the step counter, in a fixed order.
  NamedTensors state() const;
  // The default generators' states as a checkpoint keeps them beside state(): "rng/cpu", and
  // "rng/cuda" when this trainer runs on a GPU (copies; load_state restores them).
  NamedTensors rng_state() const;
  void load_state(const NamedTensors& s);
  // The cheap per-step parameter digest, "d2:" + 16 hex digits (common/hash.h: digest_term),
  // computed where the parameters live: a GPU reads them once, nothing crosses to the host
  // but one word per tensor. `like`: a recorded digest to compare with; one without the
  // "d2:" prefix was recorded before rewind 0.3 and is computed the old way, FNV-1a over the
  // parameters' bytes on the host (~1 s per gpt2-small step on a GPU host).
  std::string param_digest(const std::string& like = "") const;
  // Whether train_step fills StepResult::digest (the digest after its update; on a GPU summed
  // by the fused AdamW pass itself, which has the parameters in registers).
  void set_want_digest(bool want) { want_digest_ = want; }
  // Sampled monitors: train_step fills StepResult::monitors only on steps monitor_due(n, step)
  // (every n-th, from step 0); the others run the attention without its monitor counts and
  // skip the W_Q norms' read. n = 1 (the default; replays and probes): every step. On a GPU one
  // graph serves both kinds of step (a device flag read by the kernels). The bits of the
  // training are the same for every n.
  void set_monitor_every(int n);
  // With REWIND_TIMES=phase in the environment: mean milliseconds per train step spent in
  // data, forward, backward, loss+stats, grad norm, monitors and optimizer; "" otherwise.
  std::string phase_report() const;
  // Called on the training thread right before each optimizer update, the first write to the
  // parameters and moments in a step (the recorder makes the device wait there for its
  // asynchronous checkpoint copy, which may overlap the forward and backward).
  void set_before_update(std::function<void()> f) { before_update_ = std::move(f); }
  // Data-parallel training over `comm` (not owned; nullptr: one process). The step's
  // gradient_accumulation_steps micro-batches are split into equal contiguous shares, rank r
  // running micro-batches [r*A/N, (r+1)*A/N): the same batches as one process. Gradients, loss
  // and monitors are summed over the ranks in rank order, so the run is bitwise repeatable with
  // the same N (with another N only equal up to rounding). Throws UsageError unless N divides A.
  void set_comm(Comm* comm);
  Comm* comm() const { return comm_; }
  const StepGraph* step_graph() const { return graph_.get(); }  // null: graphs off
  // "fused (variant N)": gradient norm and AdamW in the fused CUDA kernels
  // (kernels/cuda/optimizer.h), or "foreach": LibTorch's ops (CPU, or no variant matched).
  std::string optimizer_path();

 private:
  StepResult forward_backward(const plan::Plan& plan, const std::vector<int>& capture_layers);
  // Queues the forward and backward passes of this rank's micro-batches (token ids on the
  // device), eagerly or inside a graph's capture: nothing in it waits for the device.
  // use_buckets: the last backward exchanges the gradients in buckets as they complete (ranks,
  // eagerly: the exchange waits on the host, which a graph's capture cannot).
  // monitors: false leaves the attention's stats and the W_Q norms out (no taps: a step with
  // capture_layers is always monitored).
  QueuedPasses queue_passes(const plan::Plan& plan, const std::vector<int>& capture_layers,
                            const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys,
                            bool use_buckets, bool monitors = true);
  // clip_coef > 0: the gradients are scaled by it first (clipping). digest_sums (optional, one
  // int64 per parameter on the device, zeroed): the fused update adds the updated parameters'
  // digest word sums into it; returns whether it did (false: LibTorch's ops ran).
  bool adamw_update(double lr, double clip_coef, const torch::Tensor& digest_sums = {});
  // The digest from per-parameter word sums on the device: their copy to pinned memory is
  // queued and the returned function waits for it (see param_digest_queued).
  std::function<std::string()> digest_from_sums(const torch::Tensor& sums) const;
  // The d2 digest of the parameters as they are now, queued behind the device's work: on a
  // GPU the sums come back into pinned memory behind an event and the returned function waits
  // for that copy (on whichever thread calls it: the recorder's step writer), so the training
  // thread goes on queueing the next step; on the CPU it is computed now.
  std::function<std::string()> param_digest_queued() const;
  // The global gradient norm (FP64 sum of squares) as a one-element FP64 tensor on the
  // gradients' device, queued: reading it is the host's only wait.
  torch::Tensor grad_norm_queued();
  // Whether the fused CUDA optimizer runs (decided once: on CUDA, unless
  // REWIND_FUSED_OPTIMIZER=0, a kernel variant reproduces LibTorch's update bit for bit).
  bool fused_optimizer();
  int fused_variant_ = -2;  // -2: not decided yet; -1: LibTorch's multi-tensor ops
  // Every head's W_Q spectral norm (spectral_norms_queued), in layer-major head order.
  torch::Tensor wq_spectral_norms_queued() const;
  std::vector<HeadMonitor> monitors(const std::vector<std::shared_ptr<kernels::AttentionCapture>>& caps,
                                    const torch::Tensor& wq_norms) const;
  // The ranks' shares of a step combined (world > 1): see set_comm. bucketed: the gradients
  // were exchanged during the backward already (trainer_ranks.cpp).
  void reduce_across_ranks(StepResult& r, float& loss_sum, std::vector<uint64_t>& batch_hashes,
                           std::vector<std::shared_ptr<kernels::AttentionCapture>>& caps, bool bucketed);

  Config config_;
  plan::Plan plan_;
  const TokenFile& data_;
  GPT model_;
  torch::Device device_;
  std::vector<torch::Tensor> params_;      // fixed order: named_parameters()
  std::vector<std::string> param_names_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
  bool want_digest_ = false;  // set_want_digest
  int monitor_every_ = 1;     // set_monitor_every
  torch::Tensor stats_flag_;  // CUDA, monitor_every_ > 1: the kernels' stats_on (one int32)
  Comm* comm_ = nullptr;
  std::unique_ptr<GradBuckets> buckets_;  // world > 1 and REWIND_GRAD_BUCKET_MB > 0 (made anew for a capture)
  bool buckets_in_graph_ = false;         // ranks capture their bucketed exchange (set_comm)
  std::unique_ptr<StepGraph> graph_;      // CUDA graphs of the passes (null: off)

  enum { kPhaseData, kPhaseForward, kPhaseBackward, kPhaseLoss, kPhaseExchange, kPhaseGradNorm,
         kPhaseMonitors, kPhaseOptimizer, kNumPhases };
  void phase_mark(int phase);  // adds the time since the last mark to `phase` (-1: just start)
  bool phase_enabled_ = false;
  std::function<void()> before_update_;
  double phase_seconds_[kNumPhases] = {};
  double phase_host_seconds_[kNumPhases] = {};
  int64_t phase_steps_ = 0;
  static constexpr int kPhaseWarmupSteps = 2;  // not counted
  int phase_warmup_ = 0;
  std::chrono::steady_clock::time_point phase_t0_;
};

// Spectral norm of a matrix in FP64 by power iteration on its Gram matrix from a fixed start
// vector (deterministic; `iters` ~ the number of plain power steps it matches, 30 is ample).
double spectral_norm(const torch::Tensor& w, int iters = 30);
// The same for a batch of matrices (N, D, C) at once, on their device: one host copy.
std::vector<double> spectral_norms(const torch::Tensor& w, int iters = 30);
// The same, queued: the (N) FP64 norms on the matrices' device, nothing waited for.
torch::Tensor spectral_norms_queued(const torch::Tensor& w, int iters = 30);

// The d2 digest of `params` (all on one device) as they are now, queued as
// Trainer::param_digest_queued queues its own: on a GPU by the digest kernel, the sums copied
// into pinned memory behind an event, the returned function waiting for that copy alone; on
// the CPU computed now. rewind.record's digest (python/record_ext.cpp) is this one.
std::function<std::string()> queue_param_digest(const std::vector<torch::Tensor>& params);
// Adds each tensor's d2 word sum (common/hash.h: the wrapping sum of digest_term over its bytes
// as 32-bit words; its size a whole number of words) into sums[offset + k], an int64 tensor on
// the tensors' device: on a GPU queued (the digest kernel, nothing waited for), on the CPU now.
void add_word_sums(const std::vector<torch::Tensor>& tensors, torch::Tensor& sums, int64_t offset);
// The digest from per-parameter word sums on a GPU (int64, `words` 32-bit words each), queued.
std::function<std::string()> queue_digest_of_sums(const torch::Tensor& sums, std::vector<int64_t> words);

}  // namespace rwd::train
