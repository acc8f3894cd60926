// CUDA graphs of a step's passes (see step_graph.h).
#include "train/step_graph.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/switches.h"

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/cuda.h>
#include <torch/version.h>
#endif

namespace rwd::train {

torch::Tensor pinned_tokens(const std::vector<int64_t>& v, int64_t rows, int64_t cols) {
  torch::Tensor host = torch::empty({rows, cols}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(true));
  std::memcpy(host.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return host;
}

struct StepGraph::Graph {
#ifdef REWIND_CUDA
  at::cuda::CUDAGraph graph;
#endif
  plan::Plan plan;
  int micro = 0;
  bool serves(const plan::Plan& p, int m) const { return micro == m && plan == p; }
  std::vector<torch::Tensor> xs, ys;  // the static inputs the graph reads
  QueuedPasses out;                   // the static outputs it writes
  std::vector<torch::Tensor> grads;   // the parameters' gradients it writes
  // Each layer's pending stats tensor: fetch_stats() takes them, the next replay re-arms them.
  std::vector<std::pair<kernels::AttentionCapture*, torch::Tensor>> pending;
};

int StepGraph::eager_steps_before_capture(const torch::Device& device) {
#ifdef REWIND_CUDA
  return device.is_cuda() ? static_cast<int>(switches::integer(switches::Switch::kCudaGraphs)) : 0;
#else
  (void)device;
  return 0;
#endif
}

StepGraph::StepGraph(torch::Device device, int eager_steps) : device_(device), eager_steps_(eager_steps) {}
StepGraph::~StepGraph() = default;

bool StepGraph::capture_due(const plan::Plan& plan, int micro_batches) const {
  if (graph_ && graph_->serves(plan, micro_batches)) return false;
  if (warm_count_ < eager_steps_ || warm_micro_ != micro_batches || !(warm_plan_ == plan)) return false;
  return std::find(failed_.begin(), failed_.end(), plan) == failed_.end();
}

void StepGraph::discard() {
  graph_.reset();
  failed_.clear();
  warm_count_ = 0;
}

void StepGraph::ran_eagerly(const plan::Plan& plan, int micro_batches) {
  if (graph_ && !graph_->serves(plan, micro_batches)) graph_.reset();  // its memory back
  const bool same = warm_micro_ == micro_batches && warm_plan_ == plan;
  warm_count_ = same ? warm_count_ + 1 : 1;
  if (!same) warm_plan_ = plan;
  warm_micro_ = micro_batches;
}

bool StepGraph::run(const plan::Plan& plan, const std::vector<std::vector<int64_t>>& xs,
                    const std::vector<std::vector<int64_t>>& ys, int64_t rows, int64_t cols,
                    std::vector<torch::Tensor>& params, const Queue& queue, QueuedPasses& out) {
#ifdef REWIND_CUDA
  const int micro = static_cast<int>(xs.size());
  if (!(graph_ && graph_->serves(plan, micro))) {
    if (!capture_due(plan, micro)) return false;
    graph_.reset();
    if (!capture(plan, rows, cols, micro, params, queue)) {
      failed_.push_back(plan);
      return false;
    }
  }
  Graph& g = *graph_;
  for (int m = 0; m < micro; ++m) {  // the batches into the static inputs, on the replay's stream
    g.xs[m].copy_(pinned_tokens(xs[m], rows, cols), /*non_blocking=*/true);
    g.ys[m].copy_(pinned_tokens(ys[m], rows, cols), /*non_blocking=*/true);
  }
  g.graph.replay();
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g.grads[i];
  for (auto& [cap, t] : g.pending) {
    cap->stats.clear();
    cap->stats_pending = t;
  }
  out = g.out;
  ++replays_;
  return true;
#else
  (void)plan, (void)xs, (void)ys, (void)rows, (void)cols, (void)params, (void)queue, (void)out;
  return false;
#endif
}

bool StepGraph::capture(const plan::Plan& plan, int64_t rows, int64_t cols, int micro,
                        std::vector<torch::Tensor>& params, const Queue& queue) {
#ifdef REWIND_CUDA
  auto g = std::make_unique<Graph>();
  g->plan = plan;
  g->micro = micro;
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  for (int m = 0; m < micro; ++m) {
    g->xs.push_back(torch::zeros({rows, cols}, opts));
    g->ys.push_back(torch::zeros({rows, cols}, opts));
  }
  for (auto& p : params) p.mutable_grad() = torch::Tensor();  // created inside the graph, as eagerly
  // The graph's pool takes as much memory as an eager step's activations. Where the device
  // lacks that much beside the eager steps' cached blocks, those go back to the device first:
  // a graph must not shrink the batch a user can train.
  const c10::DeviceIndex dev = device_.has_index() ? device_.index() : c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(dev);
  const int64_t cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;  // [0]: aggregate
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess || static_cast<int64_t>(free) < cached + cached / 4 + (1ll << 30)) {
    torch::cuda::synchronize(dev);
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  // Captured on a side stream (the legacy default stream cannot capture) that first waits for
  // the work queued so far; thread-local mode, so the recorder's writer threads may go on
  // copying checkpoints meanwhile. The autograd thread queues the backward onto this stream.
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(dev);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, dev);
  at::cuda::CUDAEvent ready;
  ready.record(main);
  ready.block(side);
  std::string failure;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    try {
#if TORCH_VERSION_MAJOR >= 2
      g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
#else
      g->graph.capture_begin();  // LibTorch 1.13 captures in global mode only (no GPU build uses it)
#endif
      try {
        g->out = queue(g->xs, g->ys);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      g->graph.capture_end();  // ends the capture even after a failure; throws if it was invalidated
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty()) {
    cudaGetLastError();  // the capture's error is not sticky: clear it for the eager step
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    std::fprintf(stderr, "warning: a CUDA graph of this plan's step could not be captured, so its steps run eagerly (same bits): %s\n",
                 failure.substr(0, failure.find('\n')).c_str());
    return false;
  }
  for (auto& p : params) g->grads.push_back(p.grad());
  for (const ForwardTap& tap : g->out.taps)
    for (const auto& c : tap.layers)
      if (c && c->stats_pending.defined()) g->pending.emplace_back(c.get(), c->stats_pending);
  graph_ = std::move(g);
  ++captures_;
  return true;
#else
  (void)plan, (void)rows, (void)cols, (void)micro, (void)params, (void)queue;
  return false;
#endif
}

}  // namespace rwd::train
