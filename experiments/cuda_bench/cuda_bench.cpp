// Forward/backward TFLOP/s of the rewind CUDA flash kernels (standard, stabilized, mixed plans
// with FP32 heads on the tensor cores and on the SIMT reference) against PyTorch SDPA (flash
// backend) and the all-BF16 kernel in the same run; --sr: what stochastic rounding costs.
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.h"
#include "kernels/stochastic_round.h"

namespace {

using rwd::kernels::AttentionParams;
using rwd::kernels::HeadFlags;
namespace kc = rwd::kernels::cuda;

void check(int err, const char* what) {
  if (err != 0) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(static_cast<cudaError_t>(err)));
    std::exit(1);
  }
}

// Mean time (ms) of one launch in a burst of n back-to-back launches (no host gap between
// them), timed with cudaEvents.
double burst_ms(const std::function<void()>& fn, int n) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < n; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / n;
}

// Median of `reps` single-launch timings (ms) of fn, after warm-up.
double time_ms(const std::function<void()>& fn, int reps = 25) {
  for (int i = 0; i < 3; ++i) fn();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(burst_ms(fn, 1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Time of `x` over time of `base`, measured in alternation: `rounds` pairs of 20-launch bursts,
// the median of the per-pair ratios (clock and thermal drift hit both alike).
double paired_ratio(const std::function<void()>& base, const std::function<void()>& x,
                    int rounds = 41) {
  for (int i = 0; i < 5; ++i) base(), x();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> r;
  for (int i = 0; i < rounds; ++i) {
    const double tb = burst_ms(base, 20), tx = burst_ms(x, 20);
    r.push_back(tx / tb);
  }
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

struct Row {
  std::string name;
  double fwd_ms, bwd_ms;
};

// One shape's summary for the head-dim table (--head-dims): the baseline row and ours.
struct Summary {
  int D = 0;
  Row base, ours;
};

bool g_mixed = true;  // also time the mixed plan (slow SIMT path); off with --no-mixed

// The device tensors of one causal (B, H, T, D) problem: random BF16 inputs, their FP32
// twins, the outputs and the gradients.
struct Problem {
  int B, H, T, D;
  torch::Tensor q, k, v, d_o, q32, k32, v32, o, o32, do32, lse, delta, dq, dk, dv;
  Problem(int b, int h, int t, int d) : B(b), H(h), T(t), D(d) {
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    q = torch::randn({B, H, T, D}, opts), k = torch::randn({B, H, T, D}, opts);
    v = torch::randn({B, H, T, D}, opts), d_o = torch::randn({B, H, T, D}, opts);
    auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
    q32 = q.to(torch::kFloat32), k32 = k.to(torch::kFloat32), v32 = v.to(torch::kFloat32);
    o = torch::empty_like(q), o32 = torch::empty_like(q32), do32 = d_o.to(torch::kFloat32);
    lse = torch::empty({B, H, T}, f32), delta = torch::empty({B, H, T}, f32);
    dq = torch::empty({B, H, T, D}, f32), dk = torch::empty_like(dq), dv = torch::empty_like(dq);
  }
  double fwd_flop() const { return 4.0 * B * H * static_cast<double>(T) * T * D / 2.0; }  // causal
};

// One call of our kernels on a problem: its forward and backward launches, each owning what it
// needs (flags on the device, workspaces).
// monitors: 0 none, 1 collected (p.stats set, as in a recorded training step), 2 requested but
// switched off by the stats_on flag (a step without monitors under --monitor-every, as a CUDA
// graph captured with them runs it).
// simt: FP32 heads on the SIMT reference kernels (the path before the split-BF16 variant).
// ds_dq: BackwardArgs::ds_dq (-1 default; 0 dQ recomputed per tile pair; 1 from stored dS).
// sr_key: AttentionParams::sr_key, read by heads with an sr flag.
struct Launch {
  std::function<void()> fwd, bwd;
};
Launch make_launch(const Problem& t, std::vector<HeadFlags> flag_list, int monitors = 0, bool simt = false,
                   int ds_dq = -1, uint64_t sr_key = 0) {
  const int B = t.B, H = t.H, T = t.T, D = t.D;
  const torch::Tensor &q = t.q, &k = t.k, &v = t.v, &d_o = t.d_o, &q32 = t.q32, &k32 = t.k32, &v32 = t.v32;
  const torch::Tensor &o = t.o, &o32 = t.o32, &do32 = t.do32, &lse = t.lse, &delta = t.delta;
  const torch::Tensor &dq = t.dq, &dk = t.dk, &dv = t.dv;
  auto flags = std::make_shared<std::vector<HeadFlags>>(std::move(flag_list));
  auto flags_d = torch::empty({static_cast<int64_t>(flags->size() * sizeof(HeadFlags))},
                              torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
  cudaMemcpy(flags_d.data_ptr(), flags->data(), flags->size() * sizeof(HeadFlags), cudaMemcpyHostToDevice);
  AttentionParams p;
  p.batch = B;
  p.heads = H;
  p.seq = T;
  p.dim = D;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.causal = true;
  p.sr_key = sr_key;
  p.flags = reinterpret_cast<const HeadFlags*>(flags_d.data_ptr());
  auto stats_d = torch::zeros({static_cast<int64_t>(H * sizeof(rwd::kernels::HeadStats))},
                              torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
  if (monitors) p.stats = reinterpret_cast<rwd::kernels::HeadStats*>(stats_d.data_ptr());
  kc::ForwardArgs fa;
  fa.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  fa.k = reinterpret_cast<const uint16_t*>(k.data_ptr());
  fa.v = reinterpret_cast<const uint16_t*>(v.data_ptr());
  fa.q_f32 = q32.data_ptr<float>();
  fa.k_f32 = k32.data_ptr<float>();
  fa.v_f32 = v32.data_ptr<float>();
  fa.o = reinterpret_cast<uint16_t*>(o.data_ptr());
  fa.o_f32 = o32.data_ptr<float>();
  fa.lse = lse.data_ptr<float>();
  fa.host_flags = flags->data();
  fa.simt_fp32 = simt;
  auto stats_off = torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt32));
  if (monitors == 2) fa.stats_on = stats_off.data_ptr<int>();
  auto ws = torch::empty({static_cast<int64_t>(kc::forward_workspace_bytes(p, flags->data()))},
                         torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
  fa.workspace = ws.numel() ? ws.data_ptr() : nullptr;
  kc::BackwardArgs ba = kc::backward_args_of(fa);
  ba.d_o_f32 = do32.data_ptr<float>();
  ba.d_o = reinterpret_cast<const uint16_t*>(d_o.data_ptr());
  ba.delta = delta.data_ptr<float>();
  ba.dq = dq.data_ptr<float>();
  ba.dk = dk.data_ptr<float>();
  ba.dv = dv.data_ptr<float>();
  ba.ds_dq = ds_dq;
  // dS tiles, then the split planes (q, k, v, dO)
  auto bws = torch::empty({static_cast<int64_t>(kc::backward_workspace_bytes(p, flags->data(), ds_dq))},
                          torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
  ba.workspace = bws.numel() ? bws.data_ptr() : nullptr;
  // Own copies of the parameters and keep the flags and workspaces alive.
  return Launch{[p, fa, flags, flags_d, stats_d, ws, stats_off] { check(kc::attention_forward(p, fa, nullptr), "forward"); },
                [p, ba, flags, flags_d, bws] { check(kc::attention_backward(p, ba, nullptr), "backward"); }};
}

Summary bench(int B, int H, int T, int D) {
  const Problem t(B, H, T, D);
  const double fwd_flop = t.fwd_flop();
  const double bwd_flop = 2.5 * fwd_flop;

  std::vector<Row> rows;
  std::vector<std::function<void()>> fwd_of;  // the forward launch of each of our rows
  auto run_ours = [&](const std::string& name, std::vector<HeadFlags> flag_list, int monitors = 0,
                      bool simt = false, int ds_dq = -1) {
    const Launch l = make_launch(t, std::move(flag_list), monitors, simt, ds_dq);
    fwd_of.push_back(l.fwd);
    const double f = time_ms(l.fwd);
    const double b = time_ms(l.bwd);
    rows.push_back({name, f, b});
  };

  // PyTorch SDPA with one backend forced where the build allows it: flash (FlashAttention-2),
  // then cuDNN's fused attention (skipped, with a note, where SDPA cannot run it).
  size_t n_base = 0;  // baseline rows at the front of `rows`
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  const torch::Tensor &q = t.q, &k = t.k, &v = t.v, &d_o = t.d_o;
  auto sdpa_row = [&](const std::string& name, bool cudnn) {
    at::globalContext().setSDPUseFlash(!cudnn);
    at::globalContext().setSDPUseMemEfficient(false);
    at::globalContext().setSDPUseMath(false);
    at::globalContext().setSDPUseCuDNN(cudnn);
    try {
      auto qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true);
      auto vg = v.detach().requires_grad_(true);
      const double f = time_ms([&] {
        torch::NoGradGuard ng;
        at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
      });
      const double fb = time_ms([&] {
        auto out = at::scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true);
        torch::autograd::grad({out}, {qg, kg, vg}, {d_o});
      });
      rows.insert(rows.begin() + static_cast<long>(n_base++), Row{name, f, fb - f});
    } catch (const std::exception& e) {
      std::printf("%s: not run (%.120s)\n", name.c_str(), e.what());
    }
  };
  sdpa_row("sdpa_flash", false);
  // Its deterministic backward (what torch.use_deterministic_algorithms(True) runs): ours is
  // always deterministic.
  at::globalContext().setDeterministicAlgorithms(true, false);
  sdpa_row("sdpa_flash_determ", false);
  at::globalContext().setDeterministicAlgorithms(false, false);
  sdpa_row("sdpa_cudnn", true);
  at::globalContext().setSDPUseFlash(true);
#endif
  run_ours("rewind_standard", std::vector<HeadFlags>(H));
  std::vector<HeadFlags> stable(H);
  for (auto& fl : stable) fl.stable = true;
  run_ours("rewind_stable", stable);
  run_ours("rewind_stable_monitors", stable, 1);
  run_ours("rewind_std_monitors", std::vector<HeadFlags>(H), 1);  // what training runs
  run_ours("rewind_std_monitors_off", std::vector<HeadFlags>(H), 2);
  // The forwards on mma.sync instead of wgmma (same bits).
  setenv("REWIND_ATTN_WGMMA", "0", 1);
  run_ours("rewind_standard_mma", std::vector<HeadFlags>(H));
  run_ours("rewind_stable_mon_mma", stable, 1);
  unsetenv("REWIND_ATTN_WGMMA");
  // The other way to dQ than the default for this D (recomputing S, dP, dS per tile pair, or
  // reading the dS tiles the dK/dV kernel stored): same bits, different speed.
  {
    AttentionParams shape;
    shape.batch = B, shape.heads = H, shape.seq = T, shape.dim = D, shape.causal = true;
    const bool ds_default = kc::ds_dq_default(shape);
    run_ours(ds_default ? "rewind_std_dq_recompute" : "rewind_std_dq_from_ds", std::vector<HeadFlags>(H),
             false, false, ds_default ? 0 : 1);
  }
  if (g_mixed) {
    std::vector<HeadFlags> mixed(H);
    for (int h = 0; h < H; h += 2) mixed[h].prec[static_cast<int>(rwd::kernels::Op::kPv)] = rwd::kernels::Prec::kFp32;
    run_ours("rewind_mixed_pv32", mixed);
    // Heads with attn=fp32 (every op promoted): one, half, all, on the tensor cores and on the
    // SIMT reference kernels.
    for (int n : {1, H / 2, H}) {
      std::vector<HeadFlags> fl(H);
      for (int h = 0; h < n; ++h) {
        for (auto& pr : fl[h].prec) pr = rwd::kernels::Prec::kFp32;
      }
      const std::string tag = "fp32_heads_" + std::to_string(n);
      run_ours(tag, fl);
      run_ours(tag + "_simt", fl, 0, true);
    }
    // The split matmuls alone: qk and pv promoted in every head, softmax low.
    std::vector<HeadFlags> qkpv(H);
    for (auto& fl : qkpv) {
      fl.prec[static_cast<int>(rwd::kernels::Op::kQk)] = rwd::kernels::Prec::kFp32;
      fl.prec[static_cast<int>(rwd::kernels::Op::kPv)] = rwd::kernels::Prec::kFp32;
    }
    run_ours("fp32_heads_qkpv_" + std::to_string(H), qkpv);
  }

  // rows: [sdpa_flash, sdpa_cudnn,] rewind_standard, rewind_stable, ...; fwd_of starts at
  // rewind_standard.
  const double stable_x = paired_ratio(fwd_of[0], fwd_of[1]);
  const double monitors_x = paired_ratio(fwd_of[0], fwd_of[3]);
  const double monitors_off_x = paired_ratio(fwd_of[0], fwd_of[4]);

  const double base_f = rows[0].fwd_ms, base_b = rows[0].bwd_ms;
  std::printf("\nB=%d H=%d T=%d D=%d causal  (baseline: %s)\n", B, H, T, D, rows[0].name.c_str());
  // fwd_x, bwd_x: speed relative to the baseline; std_f, std_b: time over rewind_standard's.
  const Row& std_row = rows[n_base];
  std::printf("%-22s %10s %10s %10s %10s %8s %8s %8s %8s\n", "kernel", "fwd_ms", "fwd_TF/s",
              "bwd_ms", "bwd_TF/s", "fwd_x", "bwd_x", "std_f", "std_b");
  for (const Row& r : rows) {
    std::printf("%-22s %10.3f %10.1f %10.3f %10.1f %8.2f %8.2f %8.2f %8.2f\n", r.name.c_str(),
                r.fwd_ms, fwd_flop / r.fwd_ms * 1e-9, r.bwd_ms, bwd_flop / r.bwd_ms * 1e-9,
                base_f / r.fwd_ms, base_b / r.bwd_ms, r.fwd_ms / std_row.fwd_ms,
                r.bwd_ms / std_row.bwd_ms);
  }
  std::printf("stable/standard forward, alternating 20-launch bursts: %.3f (median of 41 pairs)\n",
              stable_x);
  std::printf("standard+monitors/standard forward, alternating 20-launch bursts: %.3f (median of 41 pairs)\n",
              monitors_x);
  std::printf("standard, monitors switched off by stats_on / standard forward, alternating bursts: %.3f\n",
              monitors_off_x);
  // The same paired measure for the tensor-core FP32 rows (forward; fwd_of[i] is the forward
  // of rows[i + first], first = n_base).
  const size_t first = rows.size() - fwd_of.size();
  for (size_t i = 0; i < fwd_of.size(); ++i) {
    const std::string& n = rows[i + first].name;
    if (n.rfind("fp32_heads_", 0) != 0 || n.find("_simt") != std::string::npos) continue;
    std::printf("%s/standard forward, alternating bursts: %.3f\n", n.c_str(),
                paired_ratio(fwd_of[0], fwd_of[i]));
  }
  return Summary{D, rows[0], std_row};
}

// --head-dims: every head dim the kernels take (kCudaHeadDims) at the same token count and
// model width (B 4, T 2048, H x D = 2048), the full table of each, then one row per dim.
void bench_head_dims() {
  std::vector<Summary> sums;
  for (int d : rwd::kernels::kCudaHeadDims) sums.push_back(bench(4, 2048 / d, 2048, d));
  std::printf("\nhead dims, B=4 T=2048 H*D=2048 causal: rewind_standard vs the baseline\n");
  std::printf("%-5s %-12s %10s %10s %10s %10s %8s %8s\n", "D", "baseline", "base_fwd", "base_bwd",
              "fwd_ms", "bwd_ms", "fwd_x", "bwd_x");
  for (const Summary& s : sums) {
    std::printf("D%-4d %-12s %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f\n", s.D, s.base.name.c_str(),
                s.base.fwd_ms, s.base.bwd_ms, s.ours.fwd_ms, s.ours.bwd_ms, s.base.fwd_ms / s.ours.fwd_ms,
                s.base.bwd_ms / s.ours.bwd_ms);
  }
}

}  // namespace

// --sr: stochastic rounding's cost at a shape: the forward and backward of a call whose heads
// round stochastically (pv=sr, acc=sr, qk=sr, all three; every head, or half of them) against
// the same call without sr, timed alone (median ms) and in alternation (paired_ratio: the
// ratio to print). acc=bf16 (the extras kernel without random bits) shows what of the cost is
// the variant itself.
void bench_sr(int B, int H, int T, int D) {
  const Problem t(B, H, T, D);
  const uint64_t key = rwd::kernels::sr_call_key(1, 100, 0, 0);
  const Launch base = make_launch(t, std::vector<HeadFlags>(H));
  const double base_f = time_ms(base.fwd), base_b = time_ms(base.bwd);
  std::printf("\nstochastic rounding, B=%d H=%d T=%d D=%d causal: against the same call without sr\n", B, H, T, D);
  std::printf("%-20s %10s %10s %10s %10s %10s %10s\n", "heads", "fwd_ms", "bwd_ms", "fwd_x", "bwd_x", "fwd_pair",
              "bwd_pair");
  std::printf("%-20s %10.3f %10.3f %10.2f %10.2f %10s %10s\n", "none (base)", base_f, base_b, 1.0, 1.0, "-", "-");
  const struct {
    const char* name;
    void (*set)(HeadFlags&);
    bool half;  // only the even heads
  } kCases[] = {{"pv=sr", [](HeadFlags& f) { f.pv_sr = true; }, false},
                {"acc=sr", [](HeadFlags& f) { f.acc_sr = true; }, false},
                {"qk=sr", [](HeadFlags& f) { f.s_sr = true; }, false},
                {"qk,pv,acc=sr", [](HeadFlags& f) { f.s_sr = f.pv_sr = f.acc_sr = true; }, false},
                {"pv=sr half the heads", [](HeadFlags& f) { f.pv_sr = true; }, true},
                {"acc=bf16 (no sr)", [](HeadFlags& f) { f.acc_bf16 = true; }, false}};
  for (const auto& c : kCases) {
    std::vector<HeadFlags> flags(H);
    for (int h = 0; h < H; h += c.half ? 2 : 1) c.set(flags[h]);
    const Launch l = make_launch(t, flags, 0, false, -1, key);
    const double f = time_ms(l.fwd), b = time_ms(l.bwd);
    std::printf("%-20s %10.3f %10.3f %10.2f %10.2f %10.3f %10.3f\n", c.name, f, b, f / base_f, b / base_b,
                paired_ratio(base.fwd, l.fwd), paired_ratio(base.bwd, l.bwd));
  }
}

// Usage: cuda_bench [--shape 0|1] [--no-mixed] [--head-dims] [--sr]   (default: both shapes,
// all kernels; --head-dims: one shape per head dim instead, see bench_head_dims; --sr: the
// stochastic-rounding table of each shape instead, see bench_sr)
int main(int argc, char** argv) {
  int shape = -1;
  bool head_dims = false, sr = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--shape" && i + 1 < argc) {
      shape = std::atoi(argv[++i]);
    } else if (arg == "--no-mixed") {
      g_mixed = false;
    } else if (arg == "--head-dims") {
      head_dims = true;
    } else if (arg == "--sr") {
      sr = true;
    } else {
      std::fprintf(stderr, "usage: cuda_bench [--shape 0|1] [--no-mixed] [--head-dims] [--sr]\n");
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "cuda_bench: no CUDA device\n");
    return 2;
  }
  if (head_dims) {
    bench_head_dims();
    return 0;
  }
  if (sr) {
    if (shape != 1) bench_sr(8, 12, 1024, 64);
    if (shape != 0) bench_sr(2, 16, 4096, 128);
    return 0;
  }
  if (shape != 1) bench(8, 12, 1024, 64);
  if (shape != 0) bench(2, 16, 4096, 128);
  return 0;
}
