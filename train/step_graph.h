// A step's forward and backward passes as one CUDA graph. The host queues
// ~700 launches a gpt2-small step; a graph replays them with one. The trainer runs a plan's
// first steps eagerly (the first sets up cuBLAS, loads modules and uploads the head flags),
// captures the next on static inputs, and replays the graph while the plan and the number of
// micro-batches stay the same. The graph runs the same kernels with the same arguments as the
// eager step, so its bits are the eager step's (GpuTrainer.GraphStepsEqualEagerStepsBitwise).
//
// A capture costs about two eager steps (the capture, the graph's instantiation, its memory),
// and a replay saves the host's share of a step (~1 ms of gpt2-small's 22 ms on an H200): it
// pays over a training run or a long replay, not over a bisect probe of a few steps. So a plan
// is captured after REWIND_CUDA_GRAPHS eager steps in a row (default 16; 0 turns graphs off).
// Steps on a GPU without tensor captures are graphed. With ranks the graph holds each rank's
// passes, and the step exchanges the gradients after the replay in one piece (the same sums in
// the same order, hence the same bits: dist_test). REWIND_GRAPH_BUCKETS=1 captures the bucketed
// exchange too (NCCL's collectives and the rank-order sums on the buckets' side stream, queued
// from the hooks: overlapping the backward as in an eager step; same bits; on 4 H200s no
// clear gain, so it is opt-in); where a rank's capture of it fails, all ranks go back to the
// exchange after the replay. A capture that fails (an op that waits for the host) leaves that
// plan eager for the run.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "plan/plan.h"
#include "train/model.h"

namespace rwd::train {

// Token ids (rows x cols) in pinned host memory: a copy from there to the device is queued on
// the stream without waiting for it (a pageable copy would wait for the previous step).
torch::Tensor pinned_tokens(const std::vector<int64_t>& v, int64_t rows, int64_t cols);

// What queueing a step's micro-batches leaves on the device, read after the last one.
struct QueuedPasses {
  std::vector<torch::Tensor> losses;  // one 0-dim FP32 loss per micro-batch
  std::vector<ForwardTap> taps;       // per micro-batch: the layers' pending monitor stats
  torch::Tensor wq_norms;             // every head's W_Q spectral norm (FP64)
  torch::Tensor norm;                 // the gradient norm, when queued inside (one rank)
  bool bucketed = false;              // ranks: the gradients were exchanged in buckets already
};

class StepGraph {
 public:
  // Queues the passes on the given token batches (device tensors, one pair per micro-batch).
  using Queue = std::function<QueuedPasses(const std::vector<torch::Tensor>& xs,
                                           const std::vector<torch::Tensor>& ys)>;

  // Eager steps of a plan before its capture (REWIND_CUDA_GRAPHS; 0: graphs off, as on the CPU
  // and in builds without CUDA).
  static int eager_steps_before_capture(const torch::Device& device);
  // Whether run() with this plan and number of micro-batches would capture now.
  bool capture_due(const plan::Plan& plan, int micro_batches) const;
  StepGraph(torch::Device device, int eager_steps);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs one step's passes: replays the graph made for (plan, micro-batches), captures one if
  // the last steps ran this key eagerly often enough, or else returns false (the caller runs the step
  // eagerly: call ran_eagerly). xs, ys: host token ids (rows x cols) per micro-batch.
  // `params` get the graph's gradient tensors.
  bool run(const plan::Plan& plan, const std::vector<std::vector<int64_t>>& xs,
           const std::vector<std::vector<int64_t>>& ys, int64_t rows, int64_t cols,
           std::vector<torch::Tensor>& params, const Queue& queue, QueuedPasses& out);
  // The step with (plan, micro-batches) ran eagerly: one more towards the key's capture.
  void ran_eagerly(const plan::Plan& plan, int micro_batches);
  // Drops the graph and forgets failed captures: the next steps run eagerly and capture again
  // (the caller changed what it queues).
  void discard();
  int64_t captures() const { return captures_; }  // graphs made so far
  int64_t replays() const { return replays_; }    // steps run from a graph

 private:
  struct Graph;
  bool capture(const plan::Plan& plan, int64_t rows, int64_t cols, int micro,
               std::vector<torch::Tensor>& params, const Queue& queue);
  torch::Device device_;
  int eager_steps_;                    // before a capture
  int warm_count_ = 0;                 // eager steps in a row with the warm key
  std::unique_ptr<Graph> graph_;       // the current graph, if any
  plan::Plan warm_plan_;               // the last key that ran eagerly
  int warm_micro_ = 0;
  std::vector<plan::Plan> failed_;     // plans whose capture failed: eager for the run
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace rwd::train
