// Qiu & Yao Figs 4, 5, 13 on a small BF16 run: per step, capture one layer's attention tensors,
// recompute O and delta in FP64; delta bias, dO/O-error signs, (PK)[T]^T X[T] similarity, ties.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/error.h"
#include "experiments/delta_bias/svg_plot.h"
#include "kernels/attention_cpu.h"
#include "train/config.h"
#include "train/data.h"
#include "plan/plan.h"
#include "train/trainer.h"

namespace {

namespace rp = rwd::train;
namespace rk = rwd::kernels;

// FP64 reference output of the captured (FP32) q, k, v; (B, H, T, D).
torch::Tensor reference_o(const rk::AttentionCapture& cap) {
  torch::Tensor q = cap.q.to(torch::kFloat64).contiguous(), k = cap.k.to(torch::kFloat64).contiguous(),
                v = cap.v.to(torch::kFloat64).contiguous();
  rk::AttentionParams p;
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.seq = static_cast<int>(q.size(2));
  p.dim = static_cast<int>(q.size(3));
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.dim));  // as the model (train/model.cpp)
  p.causal = true;
  torch::Tensor o = torch::empty_like(q);
  torch::Tensor lse = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  rk::attention_reference_forward(p, q.data_ptr<double>(), k.data_ptr<double>(),
                                  v.data_ptr<double>(), o.data_ptr<double>(), lse.data_ptr<double>());
  return o;
}

// Qiu & Yao Fig 5b-c. The delta error enters dW_q as sum_T (delta_lp - delta_hp)[T] times the
// rank-1 matrix (PK)[T]^T X[T], with (PK)[T] = sum_j P[T,j] K[j] (D) and X[T] the qkv input (C).
// Per head, over the B*T tokens of one step (u = PK, x = X, hats = unit vectors):
//   tok_cos  mean over token pairs T != T' of the Frobenius cosine of the rank-1 terms,
//            cos(u u'^T-terms) = cos(u, u') cos(x, x'); from |sum_T û x̂^T|^2 = N + sum_pairs
//   u_cos, x_cos  the same for the factors alone
//   coherence |sum_T e_T u_T x_T^T|_F / sum_T |e_T| |u_T| |x_T| with e = delta_lp - delta_hp:
//            1 = every term adds in one direction; coh_null = |w|_2 / |w|_1 (w_T = |e_T||u_T||x_T|)
//            is its value for mutually orthogonal terms (>= 1/sqrt(N)), the no-coherence level
//   dir      sum_T û x̂^T normalised (the token-averaged direction), compared across steps
struct Rank1Stats {
  torch::Tensor tok_cos, u_cos, coherence, coh_null;  // (H)
  double x_cos = 0;
  torch::Tensor dir;                        // (H, D*C), unit rows
};

double pair_mean(const torch::Tensor& sq_norm_of_sum, double n) {
  return (sq_norm_of_sum.item<double>() - n) / (n * (n - 1));
}

Rank1Stats rank1_stats(const rk::AttentionCapture& cap, const torch::Tensor& delta_err) {
  if (!cap.x.defined()) throw rwd::Error(rwd::ExitCode::kInternal, "capture holds no x");
  torch::Tensor q = cap.q.to(torch::kFloat64), k = cap.k.to(torch::kFloat64);
  torch::Tensor x = cap.x.to(torch::kFloat64);                               // (B,T,C)
  const int64_t t = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  torch::Tensor s = torch::matmul(q, k.transpose(-1, -2)) * scale;
  torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
  torch::Tensor u = torch::matmul(torch::softmax(s.masked_fill(future, -INFINITY), -1), k);
  const double n = static_cast<double>(x.size(0) * x.size(1));
  torch::Tensor un = u / u.norm(2, -1, true).clamp_min(1e-300);
  torch::Tensor xn = x / x.norm(2, -1, true).clamp_min(1e-300);
  torch::Tensor g = torch::einsum("bhtd,btc->hdc", {un, xn});              // (H,D,C)
  Rank1Stats r;
  const int64_t heads = g.size(0);
  r.tok_cos = torch::empty({heads}, torch::kFloat64);
  r.u_cos = torch::empty({heads}, torch::kFloat64);
  const std::vector<int64_t> dc_dims{1, 2}, bt_dims{0, 2};
  torch::Tensor g_sq = g.pow(2).sum(torch::IntArrayRef(dc_dims));
  torch::Tensor u_sq = un.sum(torch::IntArrayRef(bt_dims)).pow(2).sum(-1);
  for (int64_t h = 0; h < heads; ++h) {
    r.tok_cos[h] = pair_mean(g_sq[h], n);
    r.u_cos[h] = pair_mean(u_sq[h], n);
  }
  const std::vector<int64_t> b_t_dims{0, 1};
  r.x_cos = pair_mean(xn.sum(torch::IntArrayRef(b_t_dims)).pow(2).sum(), n);
  torch::Tensor w = torch::einsum("bht,bhtd,btc->hdc", {delta_err, u, x});
  torch::Tensor wt = delta_err.abs() * u.norm(2, -1) * x.norm(2, -1).unsqueeze(1);  // (B,H,T)
  torch::Tensor den = wt.sum(torch::IntArrayRef(bt_dims));
  r.coh_null = wt.pow(2).sum(torch::IntArrayRef(bt_dims)).sqrt() / den.clamp_min(1e-300);
  r.coherence = w.pow(2).sum(torch::IntArrayRef(dc_dims)).sqrt() / den.clamp_min(1e-300);
  torch::Tensor flat = g.reshape({heads, -1});
  r.dir = flat / flat.norm(2, -1, true).clamp_min(1e-300);
  return r;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) ma += a[i] / n, mb += b[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return (saa > 0 && sbb > 0) ? sab / std::sqrt(saa * sbb) : std::nan("");  // NaN: constant
}

// Fig 5b-c summary: per head, token-pair similarity (mean over steps) and the similarity of the
// token-averaged direction across steps (consecutive steps, all step pairs, first vs last).
void print_rank1_summary(const std::vector<double>& tok_cos, const std::vector<double>& u_cos,
                         double x_cos, const std::vector<double>& coh,
                         const std::vector<double>& coh_null,
                         const std::vector<torch::Tensor>& dirs, double tokens) {
  const int heads = static_cast<int>(tok_cos.size());
  const double steps = static_cast<double>(dirs.size());
  torch::Tensor d = torch::stack(dirs);                         // (S, H, D*C)
  torch::Tensor sum_sq = d.sum(0).pow(2).sum(-1);               // (H)
  torch::Tensor consec = (d.slice(0, 1) * d.slice(0, 0, -1)).sum(-1).mean(0);
  torch::Tensor first_last = (d[0] * d[-1]).sum(-1);
  std::printf("\n(PK)[T]^T X[T] (Qiu & Yao Fig 5b-c; paper: highly similar across tokens and steps,"
              " so the delta error adds up coherently in dW_q). Random directions would give ~0"
              " pair cosine and coherence = coh_null (>= 1/sqrt(N) = %.3f, N = %.0f tokens/step).\n"
              "  tok.cos, PK cos, coherence: means over steps; step columns: cosine of the"
              " token-averaged rank-1 direction between steps.\n",
              1.0 / std::sqrt(tokens), tokens);
  std::printf("  X[T] alone: mean pair cosine across tokens %.4f (layer input, shared by the heads)\n",
              x_cos);
  std::printf("  %-5s %10s %10s %10s %10s | %15s %10s %10s\n", "head", "tok.cos", "PK cos",
              "coherence", "coh_null",
              "step cos(s,s-1)", "all-pairs", "first/last");
  for (int h = 0; h < heads; ++h) {
    const double all_pairs = steps > 1 ? (sum_sq[h].item<double>() - steps) / (steps * (steps - 1))
                                       : std::nan("");
    std::printf("  H%-4d %10.4f %10.4f %10.4f %10.4f | %15.4f %10.4f %10.4f\n", h, tok_cos[h],
                u_cos[h], coh[h], coh_null[h], steps > 1 ? consec[h].item<double>() : std::nan(""), all_pairs,
                first_last[h].item<double>());
  }
}

int usage() {
  std::fprintf(stderr, "usage: delta_bias [--steps N] [--every K] [--layer L] [--lr X] [--csv PATH]"
                       " [--data PATH]\n                  [--svg PREFIX (writes PREFIX_cum.svg, PREFIX_repmax.svg)]\n                  [--plan SPEC (added to tile=32x32, e.g. 'L*.H*.qk=sbf16')]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300, every = 25, layer = 1;
  double lr = 3e-3;
  std::string csv_path = "delta_bias.csv", data_path = "delta_bias_tokens.bin", extra_plan;
  std::string svg_prefix = "delta_bias";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    if (a == "--steps") steps = std::atoi(argv[++i]);
    else if (a == "--every") every = std::atoi(argv[++i]);
    else if (a == "--layer") layer = std::atoi(argv[++i]);
    else if (a == "--lr") lr = std::atof(argv[++i]);
    else if (a == "--csv") csv_path = argv[++i];
    else if (a == "--data") data_path = argv[++i];
    else if (a == "--plan") extra_plan = argv[++i];
    else if (a == "--svg") svg_prefix = argv[++i];
    else return usage();
  }
  if (steps < 1 || every < 1) return usage();
  try {
    rp::Config cfg = rp::Config::preset("tiny");
    cfg.block_size = 128;
    cfg.batch_size = 8;
    cfg.learning_rate = lr;
    cfg.warmup_iters = 10;
    cfg.lr_decay_iters = steps;
    cfg.max_iters = steps;
    cfg.validate();
    if (layer < 0 || layer >= cfg.n_layer) throw rwd::UsageError("--layer out of range");
    rp::write_synth_tokens(data_path, 1 << 20, cfg.vocab_size, 42);
    rp::TokenFile data(data_path);
    const std::string spec = "tile=32x32" + (extra_plan.empty() ? "" : ";" + extra_plan);
    rwd::plan::Plan plan = rwd::plan::parse(spec, cfg.n_layer, cfg.n_head);
    rp::Trainer trainer(cfg, plan, data);
    const int heads = cfg.n_head;

    FILE* csv = std::fopen(csv_path.c_str(), "w");
    if (!csv) throw rwd::Error(rwd::ExitCode::kData, "cannot write " + csv_path);
    std::fprintf(csv, "step,loss,head,delta_bias,cum_delta_bias,o_err_mean,prod_pos_frac,"
                      "feature_sign_agree,repmax_rate,max_logit,rank1_tok_cos,pk_cos,x_cos,rank1_coherence,coherence_null\n");
    std::printf("plan '%s', GPT %d layers x %d heads, width %d, T=%d, batch %d, lr %g;"
                " captured layer L%d every step.\n", plan.canonical().c_str(), cfg.n_layer, heads,
                cfg.n_embd, cfg.block_size, cfg.batch_size, lr, layer);
    std::printf("delta_bias = sum_{B,T}(delta_lp - delta_hp); hp = FP64 reference O from the captured"
                " q,k,v; delta_hp = rowsum(dO * O_hp).\nPaper (Qiu & Yao Figs 4, 5a): the cumulative"
                " delta bias grows steadily in failing heads; dO and O_lp - O_hp agree in sign.\n\n");
    std::printf("%5s %8s |", "step", "loss");
    for (int h = 0; h < heads; ++h) std::printf("   H%d cum.bias  rep.max", h);
    std::printf("\n");

    std::vector<double> cum(heads, 0.0), same_sign_steps(heads, 0.0);
    std::vector<double> losses, repmax_all, xs;
    std::vector<rwd::experiments::Series> cum_series(heads), rep_series(heads + 1);
    double prod_pos_sum = 0, feat_agree_sum = 0, x_cos_sum = 0;
    std::vector<double> tok_cos_sum(heads, 0.0), u_cos_sum(heads, 0.0), coh_sum(heads, 0.0);
    std::vector<double> coh_null_sum(heads, 0.0);
    std::vector<torch::Tensor> dirs;  // per step: (H, D*C) token-averaged rank-1 direction
    for (int s = 1; s <= steps; ++s) {
      rp::StepResult r = trainer.train_step({layer});
      const rk::AttentionCapture& cap = *r.captures.at(layer);
      torch::Tensor o_hp = reference_o(cap);                                // (B,H,T,D)
      torch::Tensor d_o = cap.d_o.to(torch::kFloat64);
      torch::Tensor err = cap.o.to(torch::kFloat64) - o_hp;                 // O_lp - O_hp
      torch::Tensor delta_hp = (d_o * o_hp).sum(-1);                         // (B,H,T)
      const std::vector<int64_t> bt_dims{0, 2}, btd_dims{0, 2, 3};  // (B, T) and (B, T, D)
      const torch::IntArrayRef bt(bt_dims), btd(btd_dims);
      torch::Tensor delta_err = cap.delta.to(torch::kFloat64) - delta_hp;  // (B,H,T)
      torch::Tensor bias = delta_err.sum(bt);                                // (H)
      const Rank1Stats r1 = rank1_stats(cap, delta_err);
      dirs.push_back(r1.dir);
      x_cos_sum += r1.x_cos / steps;
      torch::Tensor prod = d_o * err;
      torch::Tensor prod_pos = (prod > 0).to(torch::kFloat64).sum(btd) /
                               (prod != 0).to(torch::kFloat64).sum(btd).clamp_min(1);
      // Per feature: sign of sum_{B,T} dO vs sign of sum_{B,T} (O_lp - O_hp).
      torch::Tensor agree = ((d_o.sum(bt) * err.sum(bt)) > 0).to(torch::kFloat64).mean(-1);
      double rep_mean = 0;
      for (const rp::HeadMonitor& m : r.monitors) rep_mean += m.repmax_rate / r.monitors.size();
      losses.push_back(r.loss);
      xs.push_back(s);
      repmax_all.push_back(rep_mean);
      for (int h = 0; h < heads; ++h) {
        const double b = bias[h].item<double>();
        cum[h] += b;
        const rp::HeadMonitor& m = r.monitors[static_cast<size_t>(layer) * heads + h];
        prod_pos_sum += prod_pos[h].item<double>() / (heads * steps);
        feat_agree_sum += agree[h].item<double>() / (heads * steps);
        const double tc = r1.tok_cos[h].item<double>(), uc = r1.u_cos[h].item<double>();
        const double coh = r1.coherence[h].item<double>();
        tok_cos_sum[h] += tc / steps;
        u_cos_sum[h] += uc / steps;
        coh_sum[h] += coh / steps;
        coh_null_sum[h] += r1.coh_null[h].item<double>() / steps;
        std::fprintf(csv, "%d,%.6f,%d,%.6e,%.6e,%.6e,%.4f,%.4f,%.4f,%.3f,%.5f,%.5f,%.5f,%.5f,%.5f\n", s,
                     r.loss, h, b, cum[h], err.select(1, h).mean().item<double>(),
                     prod_pos[h].item<double>(), agree[h].item<double>(), m.repmax_rate,
                     m.max_logit, tc, uc, r1.x_cos, coh, r1.coh_null[h].item<double>());
        same_sign_steps[h] += (b * cum[h] > 0);
        cum_series[h].y.push_back(cum[h]);
        rep_series[h].y.push_back(m.repmax_rate);
      }
      if (s % every == 0 || s == steps) {
        std::printf("%5d %8.4f |", s, r.loss);
        for (int h = 0; h < heads; ++h)
          std::printf("   %+11.3e  %7.4f", cum[h],
                      r.monitors[static_cast<size_t>(layer) * heads + h].repmax_rate);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    std::fclose(csv);
    for (int h = 0; h < heads; ++h) {
      cum_series[h].name = "L" + std::to_string(layer) + ".H" + std::to_string(h);
      rep_series[h].name = cum_series[h].name + " rate";
    }
    rep_series[heads].name = "loss / 100";
    for (double l : losses) rep_series[heads].y.push_back(l / 100.0);
    const std::string svg_cum = svg_prefix + "_cum.svg", svg_rep = svg_prefix + "_repmax.svg";
    const bool svg_ok =
        rwd::experiments::write_svg_lines(svg_cum, "cumulative sum_{B,T}(delta_lp - delta_hp), " +
                                          plan.canonical(), "step", xs, cum_series) &&
        rwd::experiments::write_svg_lines(svg_rep, "repeated-max row rate and loss/100, " +
                                          plan.canonical(), "step", xs, rep_series);
    if (!svg_ok) throw rwd::Error(rwd::ExitCode::kData, "cannot write " + svg_prefix + "_*.svg");
    std::printf("\nper head: fraction of steps whose delta bias has the sign of the running sum"
                " (1 = steady drift, ~0.5 = random walk):");
    for (int h = 0; h < heads; ++h) std::printf(" H%d %.2f", h, same_sign_steps[h] / steps);
    std::printf("\nelements with dO*(O_lp-O_hp) > 0 (of nonzero): %.4f  (0.5 = no sign agreement)\n",
                prod_pos_sum);
    std::printf("features whose sum dO and sum (O_lp-O_hp) agree in sign: %.4f\n", feat_agree_sum);
    print_rank1_summary(tok_cos_sum, u_cos_sum, x_cos_sum, coh_sum, coh_null_sum, dirs,
                        static_cast<double>(cfg.batch_size) * cfg.block_size);
    const double corr = pearson(repmax_all, losses);
    if (std::isnan(corr))
      std::printf("Pearson(repeated-max rate, loss): n/a (the rate is constant)\n");
    else
      std::printf("Pearson(repeated-max rate over all heads, loss) over steps: %+.3f\n", corr);
    std::printf("CSV: %s  SVG: %s %s\n", csv_path.c_str(), svg_cum.c_str(), svg_rep.c_str());
  } catch (const rwd::Error& e) {
    std::fprintf(stderr, "delta_bias: %s\n", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "delta_bias: %s\n", e.what());
    return 1;
  }
  return 0;
}
