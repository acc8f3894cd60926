// GradBuckets: buckets are handed to the exchange thread from the backward's hooks,
// without waiting for finish(), in bucket order, and the gradients end up as the rank-order sums.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/grad_buckets.h"

namespace rwd::train {
namespace {

// Rank 0 of two whose peer computed exactly the same gradients: every collective answers as
// rank 1 would have, and logs its calls (from the exchange thread).
class TwinComm : public Comm {
 public:
  TwinComm() { env_.world = 2; }
  const DistEnv& env() const override { return env_; }
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    log("allgather");
    if (last_a2a_.defined()) {  // the summed shards: ours, then rank 1's (twice its own chunk 1)
      const int64_t shard = last_a2a_.numel() / 2;
      torch::Tensor theirs = last_a2a_.slice(0, shard, 2 * shard) + last_a2a_.slice(0, shard, 2 * shard);
      last_a2a_ = torch::Tensor();
      return {t.clone(), theirs};
    }
    return {t.clone(), t.clone()};
  }
  std::vector<int64_t> host_allgather_int64(int64_t v) override { return {v, v}; }
  torch::Tensor all_to_all(const torch::Tensor& t) override {
    log("all_to_all");
    last_a2a_ = t.clone();
    const int64_t shard = t.numel() / 2;
    return torch::cat({t.slice(0, 0, shard), t.slice(0, 0, shard)});  // our chunk 0 and rank 1's
  }
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }
  // Waits up to `ms` milliseconds for `n` calls; returns how many there were.
  size_t wait_for(size_t n, int ms = 10000) {
    for (int i = 0; i < ms / 10 && calls().size() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return calls().size();
  }

 private:
  void log(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(what);
  }
  DistEnv env_;
  torch::Tensor last_a2a_;
  std::mutex mu_;
  std::vector<std::string> calls_;
};

TEST(GradBuckets, ExchangedFromTheBackwardInOrderWithTheSums) {
  torch::manual_seed(3);
  // Three "layers" of 128x128 weights (64 KiB each, large enough for the sharded exchange) in a
  // chain: the backward completes them last to first; 80 KiB buckets hold one weight each.
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 3; ++i) params.push_back(torch::randn({128, 128}).requires_grad_(true));
  auto loss_of = [&](const torch::Tensor& x) {
    torch::Tensor h = x;
    for (auto& w : params) h = torch::tanh(h.matmul(w));
    return h.square().sum();
  };
  const torch::Tensor x0 = torch::randn({8, 128}), x1 = torch::randn({8, 128});
  // The reference: one process's gradients of both micro-batches, then doubled (twin ranks).
  loss_of(x0).backward();
  loss_of(x1).backward();
  std::vector<torch::Tensor> want;
  for (auto& p : params) {
    want.push_back(p.grad() + p.grad());
    p.mutable_grad() = torch::Tensor();
  }

  TwinComm comm;
  GradBuckets buckets(comm, params, 80 << 10);
  loss_of(x0).backward();  // not armed: an earlier micro-batch exchanges nothing
  EXPECT_EQ(comm.wait_for(1, 200), 0u);
  buckets.arm();
  loss_of(x1).backward();
  // Three buckets, each an all_to_all and an allgather, handed over by the hooks: all of them
  // come without finish() (the last completes with the backward's last node).
  EXPECT_EQ(comm.wait_for(6), 6u) << "the hooks did not start the exchange";
  buckets.finish();
  const std::vector<std::string> calls = comm.calls();
  ASSERT_EQ(calls.size(), 6u);
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], i % 2 ? "allgather" : "all_to_all") << i;
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i].grad(), want[i])) << "parameter " << i;

  // A step that ended between arm() and finish() (its backward threw): after reset() the next
  // step's earlier micro-batch exchanges nothing, and its last one all three buckets.
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  comm.clear();
  buckets.arm();
  buckets.reset();
  loss_of(x0).backward();
  EXPECT_EQ(comm.wait_for(1, 200), 0u) << "a step left armed exchanged an earlier micro-batch";
  buckets.arm();
  loss_of(x1).backward();
  buckets.finish();
  EXPECT_EQ(comm.calls().size(), 6u);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i].grad(), want[i])) << "parameter " << i << " after a reset";

  // A step whose backward leaves a parameter out: finish() still exchanges every bucket.
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  comm.clear();
  buckets.arm();
  torch::tanh(x1.matmul(params[0])).sum().backward();
  buckets.finish();
  EXPECT_EQ(comm.calls().size(), 2u);  // only weight 0 has a gradient
  EXPECT_FALSE(params[1].grad().defined());
}

}  // namespace
}  // namespace rwd::train
