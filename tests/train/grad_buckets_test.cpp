// GradBuckets (issue 32): buckets are exchanged from the backward's hooks, in bucket order,
// before the backward returns, and the gradients end up as the rank-order sums.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "train/grad_buckets.h"

namespace rwd::train {
namespace {

// Rank 0 of two whose peer computed exactly the same gradients: every collective answers as
// rank 1 would have, and logs its calls. `in_backward` tells whether autograd is still running.
class TwinComm : public Comm {
 public:
  TwinComm() { env_.world = 2; }
  const DistEnv& env() const override { return env_; }
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    calls.push_back(std::string("allgather ") + (*in_backward ? "in" : "after"));
    if (last_a2a_.defined()) {  // the summed shards: ours, then rank 1's (twice its own chunk 1)
      const int64_t shard = last_a2a_.numel() / 2;
      torch::Tensor theirs = last_a2a_.slice(0, shard, 2 * shard) + last_a2a_.slice(0, shard, 2 * shard);
      last_a2a_ = torch::Tensor();
      return {t.clone(), theirs};
    }
    return {t.clone(), t.clone()};
  }
  torch::Tensor all_to_all(const torch::Tensor& t) override {
    calls.push_back(std::string("all_to_all ") + (*in_backward ? "in" : "after"));
    last_a2a_ = t.clone();
    const int64_t shard = t.numel() / 2;
    return torch::cat({t.slice(0, 0, shard), t.slice(0, 0, shard)});  // our chunk 0 and rank 1's
  }
  std::vector<std::string> calls;
  const bool* in_backward = nullptr;

 private:
  DistEnv env_;
  torch::Tensor last_a2a_;
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
  bool in_backward = false;
  comm.in_backward = &in_backward;
  GradBuckets buckets(comm, params, 80 << 10);
  loss_of(x0).backward();  // not armed: an earlier micro-batch exchanges nothing
  EXPECT_TRUE(comm.calls.empty());
  buckets.arm();
  in_backward = true;
  loss_of(x1).backward();
  in_backward = false;
  buckets.finish();
  // Three buckets, each an all_to_all and an allgather; the first two (weights 2 and 1) start
  // inside the backward, the last (weight 0, completed last) may only start at its very end.
  ASSERT_EQ(comm.calls.size(), 6u);
  EXPECT_EQ(comm.calls[0], "all_to_all in");
  EXPECT_EQ(comm.calls[1], "allgather in");
  EXPECT_EQ(comm.calls[2], "all_to_all in");
  EXPECT_EQ(comm.calls[3], "allgather in");
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i].grad(), want[i])) << "parameter " << i;

  // A step whose backward leaves a parameter out: finish() still exchanges every bucket.
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  comm.calls.clear();
  buckets.arm();
  torch::tanh(x1.matmul(params[0])).sum().backward();
  buckets.finish();
  EXPECT_EQ(comm.calls.size(), 2u);  // only weight 0 has a gradient
  EXPECT_FALSE(params[1].grad().defined());
}

}  // namespace
}  // namespace rwd::train
