// Bucketed gradient exchange started from autograd's accumulate-grad hooks (grad_buckets.h).
// A hook that completes a bucket records an event on the compute stream (the accumulated
// gradients) and hands the bucket to the exchange thread, which makes a side stream wait for
// that event and queues the collectives and the rank-order sums there, so they overlap the rest
// of the backward; finish() makes the compute stream wait for the side stream. On CPUs (Gloo)
// the exchange thread sums while autograd goes on.
#include "train/grad_buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/switches.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace rwd::train {

#ifdef REWIND_CUDA
struct GradBuckets::Stream {
  Stream(c10::DeviceIndex device, size_t buckets)
      : side(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)), compute(side), ready(buckets) {}
  c10::cuda::CUDAStream side;
  c10::cuda::CUDAStream compute;  // the trainer's stream, taken at arm()
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> ready;  // per bucket: its gradients accumulated
};
#else
struct GradBuckets::Stream {};
#endif

namespace {

// Tells the buckets that parameter `index`'s gradient is accumulated (autograd runs post hooks
// of an AccumulateGrad node after it wrote .grad).
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::function<void(size_t)> ready, size_t index) : ready_(std::move(ready)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ready_(index_);
    return outputs;
  }

 private:
  std::function<void(size_t)> ready_;
  size_t index_;
};

}  // namespace

int64_t GradBuckets::bytes_from_env() {
  return static_cast<int64_t>(switches::number(switches::Switch::kGradBucketMb) * (1 << 20));
}

bool GradBuckets::in_graph_from_env() {
  return switches::on(switches::Switch::kGraphBuckets);
}

GradBuckets::GradBuckets(Comm& comm, const std::vector<torch::Tensor>& params, int64_t bucket_bytes,
                         bool on_hooks_thread)
    : comm_(comm), params_(params), bucket_of_(params.size()), inline_(on_hooks_thread) {
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t bytes = params_[k].numel() * static_cast<int64_t>(sizeof(float));
    if (buckets_.empty() || filled + bytes > bucket_bytes) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += bytes;
  }
  waiting_.assign(buckets_.size(), 0);
#ifdef REWIND_CUDA
  if (!params_.empty() && params_[0].is_cuda()) stream_ = std::make_unique<Stream>(params_[0].device().index(), buckets_.size());
#endif
  for (size_t k = 0; k < params_.size(); ++k) {
    NodeRef acc = torch::autograd::impl::grad_accumulator(params_[k]);
    if (!acc) throw Error(ExitCode::kInternal, "gradient buckets: a parameter without a gradient accumulator");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<ReadyHook>([this](size_t i) { ready(i); }, k)));
    accumulators_.push_back(std::move(acc));
  }
  thread_ = std::thread([this] { loop(); });
}

GradBuckets::~GradBuckets() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

void GradBuckets::reset() {
  std::unique_lock<std::mutex> lock(mu_);
  armed_ = false;
  queue_.clear();
  cv_.wait(lock, [&] { return !busy_; });
  error_ = nullptr;
}

void GradBuckets::arm() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].size();
  next_ = 0;
  exchanged_ = 0;
  armed_ = true;
#ifdef REWIND_CUDA
  if (stream_) stream_->compute = c10::cuda::getCurrentCUDAStream(stream_->side.device_index());
#endif
}

void GradBuckets::ready(size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;  // an earlier micro-batch's backward: the gradient is not complete yet
  size_t& w = waiting_[bucket_of_[param]];
  if (w > 0) --w;
  launch_ready_locked();
}

void GradBuckets::launch_ready_locked() {
  while (next_ < buckets_.size() && waiting_[next_] == 0) hand_over_locked(next_++);
}

void GradBuckets::hand_over_locked(size_t bucket) {
#ifdef REWIND_CUDA
  if (stream_) {
    auto& ev = stream_->ready[bucket];
    if (!ev) ev = std::make_unique<at::cuda::CUDAEvent>();
    ev->record(stream_->compute);
  }
#endif
  if (inline_) {  // the caller's thread, under the lock: nothing else runs meanwhile
    exchange(bucket);
    ++exchanged_;
    return;
  }
  queue_.push_back(bucket);
  cv_.notify_all();
}

void GradBuckets::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  // Buckets whose hooks did not all run (a parameter the step did not use) go now, in order:
  // the ranks ran the same graph, so they skip the same gradients.
  while (next_ < buckets_.size()) hand_over_locked(next_++);
  armed_ = false;
  cv_.wait(lock, [&] { return exchanged_ == buckets_.size(); });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
#ifdef REWIND_CUDA
  if (stream_) {
    at::cuda::CUDAEvent done;
    done.record(stream_->side);
    done.block(stream_->compute);
  }
#endif
}

void GradBuckets::loop() {
  torch::NoGradGuard no_grad;  // per thread
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const size_t bucket = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      exchange(bucket);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    busy_ = false;
    ++exchanged_;
    cv_.notify_all();
  }
}

void GradBuckets::exchange(size_t bucket) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads, flat;
  for (size_t k : buckets_[bucket]) {
    const torch::Tensor& g = params_[k].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    flat.push_back(g.reshape({-1}));
  }
  if (grads.empty()) return;
#ifdef REWIND_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> on_side;  // the device and the side stream, this thread
  if (stream_) {
    stream_->ready[bucket]->block(stream_->side);  // the gradients as the compute stream left them
    on_side.emplace(stream_->side);
  }
#endif
  const torch::Tensor sum = comm_.sum_in_rank_order(flat.size() == 1 ? flat[0] : torch::cat(flat));
  int64_t off = 0;
  for (torch::Tensor& g : grads) {
    g.copy_(sum.slice(0, off, off + g.numel()).view_as(g));
    off += g.numel();
  }
}

}  // namespace rwd::train
