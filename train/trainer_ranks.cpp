// The data-parallel side of the trainer (see trainer.h, set_comm): the ranks' gradients,
// losses, batch records and monitor statistics combined in rank order.
#include <cstring>

#include "common/error.h"
#include "kernels/head_stats.h"
#include "train/trainer.h"

namespace rwd::train {

void Trainer::set_comm(Comm* comm) {
  if (comm != nullptr && config_.gradient_accumulation_steps % comm->world() != 0)
    throw UsageError("gradient_accumulation_steps (" + std::to_string(config_.gradient_accumulation_steps) +
                     ") must be a multiple of the number of ranks (" + std::to_string(comm->world()) + ")");
  comm_ = comm;
  buckets_.reset();
  const int64_t bucket_bytes = GradBuckets::bytes_from_env();
  if (comm != nullptr && comm->world() > 1 && bucket_bytes > 0)
    buckets_ = std::make_unique<GradBuckets>(*comm, params_, bucket_bytes);
  buckets_in_graph_ = buckets_ != nullptr && GradBuckets::in_graph_from_env();
}

void Trainer::reduce_across_ranks(StepResult& r, float& loss_sum, std::vector<uint64_t>& batch_hashes,
                                  std::vector<std::shared_ptr<kernels::AttentionCapture>>& caps, bool bucketed) {
  torch::NoGradGuard no_grad;
  // Gradients laid end to end in parameter order, summed in rank order (sharded: dist.h).
  // Unless the buckets exchanged them during the backward (not in a graphed step, nor with
  // REWIND_GRAD_BUCKET_MB=0): here, after the backward, in one piece, with the same bits.
  std::vector<torch::Tensor> grads, flat;
  for (auto& p : params_) {
    if (bucketed || !p.grad().defined()) continue;
    grads.push_back(p.grad());
    flat.push_back(p.grad().reshape({-1}));
  }
  if (!flat.empty()) {
    const torch::Tensor sum = comm_->sum_in_rank_order(torch::cat(flat));
    int64_t off = 0;
    for (auto& g : grads) {
      g.copy_(sum.slice(0, off, off + g.numel()).view_as(g));
      off += g.numel();
    }
  }
  // The rest travels in one allgather of 64-bit words per rank (one collective, one host
  // wait): the loss sum's FP32 bits, this rank's sample offsets and batch hashes (rank r holds
  // a contiguous share of the micro-batches, so rank order is micro-batch order and rank 0
  // records the whole step), and the monitor statistics of every (layer, head) as FP64 bits
  // (exact for counts below 2^53).
  const int64_t share = static_cast<int64_t>(r.offsets.size());
  const int64_t rows = share ? static_cast<int64_t>(r.offsets[0].size()) : 0;
  const int64_t L = static_cast<int64_t>(caps.size()), H = config_.n_head;
  constexpr int kStats = 7;
  const int64_t words = 1 + share * rows + share + L * H * kStats;
  torch::Tensor packed = torch::zeros({words}, torch::kInt64);
  int64_t* w = packed.data_ptr<int64_t>();
  uint32_t loss_bits = 0;
  std::memcpy(&loss_bits, &loss_sum, sizeof loss_bits);
  *w++ = static_cast<int64_t>(loss_bits);
  for (int64_t m = 0; m < share; ++m)
    for (int64_t i = 0; i < rows; ++i) *w++ = r.offsets[static_cast<size_t>(m)][static_cast<size_t>(i)];
  for (int64_t m = 0; m < share; ++m) *w++ = static_cast<int64_t>(batch_hashes[static_cast<size_t>(m)]);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t h = 0; h < H; ++h, w += kStats) {
      if (!caps[l] || h >= static_cast<int64_t>(caps[l]->stats.size())) continue;
      const kernels::HeadStats& x = caps[l]->stats[h];
      const double v[kStats] = {x.max_logit, double(x.rows), double(x.repeated_max_rows), double(x.pbar_one),
                                double(x.stable_pos), double(x.stable_neg), double(x.stable_guard)};
      std::memcpy(w, v, sizeof v);
    }
  }
  const torch::Tensor all = torch::stack(comm_->allgather(packed)).to(torch::kCPU).contiguous();
  r.offsets.clear();
  batch_hashes.clear();
  std::vector<std::vector<kernels::HeadStats>> merged(static_cast<size_t>(L));
  for (int64_t rank = 0; rank < all.size(0); ++rank) {
    const int64_t* x = all[rank].data_ptr<int64_t>();
    float part_loss = 0;
    loss_bits = static_cast<uint32_t>(*x++);
    std::memcpy(&part_loss, &loss_bits, sizeof part_loss);
    // In rank order, r0 + r1 + ..., in FP32 (the bits of the device's add).
    loss_sum = rank == 0 ? part_loss : loss_sum + part_loss;
    for (int64_t m = 0; m < share; ++m, x += rows) r.offsets.emplace_back(x, x + rows);
    for (int64_t m = 0; m < share; ++m) batch_hashes.push_back(static_cast<uint64_t>(*x++));
    for (int64_t l = 0; l < L; ++l) {
      std::vector<kernels::HeadStats> part(static_cast<size_t>(H));
      for (int64_t h = 0; h < H; ++h, x += kStats) {
        double v[kStats];
        std::memcpy(v, x, sizeof v);
        part[h].max_logit = static_cast<float>(v[0]);
        part[h].rows = static_cast<int64_t>(v[1]);
        part[h].repeated_max_rows = static_cast<int64_t>(v[2]);
        part[h].pbar_one = static_cast<int64_t>(v[3]);
        part[h].stable_pos = static_cast<int64_t>(v[4]);
        part[h].stable_neg = static_cast<int64_t>(v[5]);
        part[h].stable_guard = static_cast<int64_t>(v[6]);
      }
      if (caps[l]) kernels::merge_head_stats(merged[l], part.data(), part.size());
    }
  }
  for (int64_t l = 0; l < L; ++l)
    if (caps[l]) caps[l]->stats = merged[l];
}

}  // namespace rwd::train
