// The per-head monitors a step reports: each head's W_Q spectral norm (a batched power
// iteration queued on the model's device) beside the attention kernels' head statistics.
#include <cmath>

#include "common/error.h"
#include "kernels/head_stats.h"
#include "train/trainer.h"

namespace rwd::train {

torch::Tensor spectral_norms_queued(const torch::Tensor& w, int iters) {
  // sigma_max(W)^2 = lambda_max(G), G = W W^T (or W^T W, the smaller side; 64 x 64 for a head's
  // W_Q). Power iteration on G^8 (three normalized squarings: same top eigenvector, gap raised
  // to the 8th) from a fixed start vector, then sigma = sqrt(v^T G v). Equivalent to
  // ~iters alternating W / W^T power steps in ~40 kernel launches instead of 8 * iters: this
  // runs every step, and on a GPU each launch costs host time the step waits for.
  torch::NoGradGuard no_grad;
  torch::Tensor a = w.detach().to(torch::kFloat64);  // (N, D, C)
  const int64_t n = a.size(0), c = a.size(2);
  auto unit = [](const torch::Tensor& x, std::vector<int64_t> dims) {
    return x / x.norm(2, dims, true).clamp_min(1e-300);
  };
  // Start where plain power iteration starts: v0 = ones(C), or u0 = W v0 on the D side.
  torch::Tensor v = torch::ones({n, c, 1}, a.options()) / std::sqrt(double(c));
  const bool rows = a.size(1) <= c;
  torch::Tensor g = rows ? torch::bmm(a, a.transpose(1, 2)) : torch::bmm(a.transpose(1, 2), a);
  if (rows) v = unit(torch::bmm(a, v), {1});
  torch::Tensor h = g;
  for (int s = 0; s < 3; ++s) h = unit(torch::bmm(h, h), {1, 2});  // G^2, G^4, G^8 (scaled)
  for (int i = 0; i < (iters + 7) / 8; ++i) v = unit(torch::bmm(h, v), {1});
  torch::Tensor lambda = torch::bmm(v.transpose(1, 2), torch::bmm(g, v)).reshape({n});
  return lambda.clamp_min(0.0).sqrt();
}

std::vector<double> spectral_norms(const torch::Tensor& w, int iters) {
  const torch::Tensor host = spectral_norms_queued(w, iters).to(torch::kCPU).contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

double spectral_norm(const torch::Tensor& w, int iters) {
  return spectral_norms(w.unsqueeze(0), iters)[0];
}

torch::Tensor Trainer::wq_spectral_norms_queued() const {
  const int64_t H = config_.n_head, D = config_.head_dim(), C = config_.n_embd;
  // Every head's W_Q slice of every layer at once, on the model's device: (L*H, D, C).
  std::vector<torch::Tensor> wqs;
  for (int l = 0; l < config_.n_layer; ++l)
    wqs.push_back(model_->layer_c_attn(l).slice(0, 0, C).view({H, D, C}));
  return spectral_norms_queued(torch::cat(wqs));
}

std::vector<HeadMonitor> Trainer::monitors(
    const std::vector<std::shared_ptr<kernels::AttentionCapture>>& caps, const torch::Tensor& wq_norms) const {
  std::vector<HeadMonitor> out;
  const int64_t H = config_.n_head;
  const torch::Tensor host = wq_norms.to(torch::kCPU).contiguous();
  const double* sn = host.data_ptr<double>();
  for (int l = 0; l < config_.n_layer; ++l) {
    for (int hd = 0; hd < H; ++hd) {
      HeadMonitor m;
      m.layer = l;
      m.head = hd;
      m.wq_sn = sn[l * H + hd];
      if (l < static_cast<int>(caps.size()) && caps[l] && hd < static_cast<int>(caps[l]->stats.size())) {
        const kernels::HeadStats& s = caps[l]->stats[hd];
        m.max_logit = s.max_logit;
        m.repmax_rate = s.rows ? double(s.repeated_max_rows) / double(s.rows) : 0.0;
        m.pbar_one = double(s.pbar_one);
        m.stable_guard = double(s.stable_guard);
      }
      out.push_back(m);
    }
  }
  return out;
}

void Trainer::set_monitor_every(int n) {
  if (n < 1) throw UsageError("--monitor-every must be at least 1");
  monitor_every_ = n;
  stats_flag_ = n > 1 && device_.is_cuda()
                    ? torch::ones({1}, torch::TensorOptions().dtype(torch::kInt).device(device_))
                    : torch::Tensor();
  model_->set_stats_flag(stats_flag_);
  if (graph_) graph_->discard();  // a graph captured before reads no flag
}

}  // namespace rwd::train
