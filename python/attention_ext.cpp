// rewind._C: the LibTorch extension behind the Python package: rewind's attention as a
// differentiable op (per-head precision flags from the plan language, per-head monitors while
// a recording asks for them) and the module itself.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/attention_op.h"
#include "plan/plan.h"
#include "python/record_ext.h"
#include "python/store_ext.h"

namespace rwd::python {

namespace {

// Layers a plan given to attention() may name: the op sees one layer, the plan may be a whole
// model's (its other layers are ignored).
constexpr int kMaxLayers = 1024;

// Per-head monitors (rewind.record asks for them): the captures of every attention() call
// since the last collect_monitors(), by layer. Read when collected, so a CUDA forward never
// waits for its stats (kernels::fetch_stats). Touched only under the GIL.
bool g_monitoring = false;
std::map<int, std::vector<std::shared_ptr<kernels::AttentionCapture>>> g_captures;

// The monitors rewind's trainer records (train::Trainer::monitors, less the W_Q spectral
// norm, which needs to know the model's W_Q) per layer and head over the calls since the last
// collect: max logit (max), repeated-max row rate and P̄ == 1 count (summed), stable-guard count.
// The raw stats of the calls since the last collect, by layer: each call's HeadStats bytes as a
// uint8 tensor where they lie (a CUDA call's still on the device, so the caller may copy them
// without waiting: rewind.record reads a step's monitors a step later).
using LayerStats = std::vector<std::pair<int, std::vector<torch::Tensor>>>;
LayerStats take_monitor_stats() {
  LayerStats out;
  for (auto& [layer, caps] : g_captures) {
    std::vector<torch::Tensor> raw;
    for (const auto& c : caps) {
      if (c->stats_pending.defined()) {
        raw.push_back(c->stats_pending);
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(c->stats.size() * sizeof(kernels::HeadStats));
      raw.push_back(torch::from_blob(c->stats.data(), {bytes}, torch::kUInt8).clone());
    }
    out.emplace_back(layer, std::move(raw));
  }
  g_captures.clear();
  return out;
}

// The monitors rewind's trainer records (train::Trainer::monitors, less the W_Q spectral
// norm, which needs to know the model's W_Q) per layer and head from take_monitor_stats' stats
// (on the host): max logit (max), repeated-max row rate and P̄ == 1 count (summed), stable-guard count.
std::vector<std::pair<std::string, double>> monitors_from_stats(const LayerStats& stats) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [layer, raw] : stats) {
    std::vector<kernels::HeadStats> sum;
    for (const torch::Tensor& r : raw) {
      const torch::Tensor host = r.to(torch::kCPU).contiguous();
      std::vector<kernels::HeadStats> x(static_cast<size_t>(host.numel()) / sizeof(kernels::HeadStats));
      std::memcpy(x.data(), host.data_ptr(), x.size() * sizeof(kernels::HeadStats));
      if (sum.size() < x.size()) sum.resize(x.size());
      for (size_t h = 0; h < x.size(); ++h) {
        sum[h].max_logit = std::max(sum[h].max_logit, x[h].max_logit);
        sum[h].rows += x[h].rows;
        sum[h].repeated_max_rows += x[h].repeated_max_rows;
        sum[h].pbar_one += x[h].pbar_one;
        sum[h].stable_guard += x[h].stable_guard;
      }
    }
    for (size_t h = 0; h < sum.size(); ++h) {
      const std::string p = "L" + std::to_string(layer) + ".H" + std::to_string(h) + ".";
      const kernels::HeadStats& x = sum[h];
      out.emplace_back(p + "max_logit", x.max_logit);
      out.emplace_back(p + "repmax_rate", x.rows ? double(x.repeated_max_rows) / double(x.rows) : 0.0);
      out.emplace_back(p + "pbar_one", double(x.pbar_one));
      if (x.stable_guard > 0) out.emplace_back(p + "stable_guard", double(x.stable_guard));
    }
  }
  return out;
}

// The monitors now (waits for a CUDA forward's stats).
std::vector<std::pair<std::string, double>> collect_monitors() { return monitors_from_stats(take_monitor_stats()); }

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const std::string& plan_spec, int layer, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "rewind.attention: q, k, v must be (batch, heads, seq, head_dim)");
  TORCH_CHECK(layer >= 0 && layer < kMaxLayers, "rewind.attention: layer must be in 0..", kMaxLayers - 1);
  const int n_head = static_cast<int>(q.size(1));
  plan::Plan plan;
  try {
    plan = plan::parse(plan_spec, kMaxLayers, n_head);
  } catch (const Error& e) {
    throw std::invalid_argument(std::string("rewind.attention: ") + e.what());
  }
  const plan::LayerPlan& lp = plan.layers[layer];
  kernels::AttentionOptions opt;
  opt.scale = 1.0f / std::sqrt(static_cast<float>(q.size(3)));
  opt.causal = causal;
  opt.naive = lp.naive;
  opt.block_q = plan.block_q;
  opt.block_k = plan.block_k;
  opt.flags = lp.heads;
  // Like F.scaled_dot_product_attention under autocast: any float dtype in, the same out.
  const auto dtype = q.scalar_type();
  std::shared_ptr<kernels::AttentionCapture> capture;
  if (g_monitoring) {
    capture = std::make_shared<kernels::AttentionCapture>();
    capture->keep_tensors = false;  // the stats alone
    g_captures[layer].push_back(capture);
  }
  torch::Tensor o =
      kernels::attention(q.to(torch::kFloat32), k.to(torch::kFloat32), v.to(torch::kFloat32), opt, capture);
  return o.to(dtype);
}

}  // namespace

}  // namespace rwd::python

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rewind's LibTorch extension (use the `rewind` package, not this module)";
  m.def("attention", &rwd::python::attention, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("plan") = "", pybind11::arg("layer") = 0, pybind11::arg("causal") = true,
        "rewind's attention on (B, H, T, D) tensors with the plan's per-head flags for `layer`");
  m.def("set_monitoring", [](bool on) { rwd::python::g_monitoring = on; rwd::python::g_captures.clear(); },
        "record per-head monitors of every attention() call from now on (rewind.record turns it on)");
  m.def("take_monitor_stats", &rwd::python::take_monitor_stats,
        "the raw per-head stats of the attention() calls since the last collect, by layer, where they lie");
  m.def("monitors_from_stats", &rwd::python::monitors_from_stats, py::arg("stats"),
        "collect_monitors' list from take_monitor_stats' stats (copied to the host)");
  m.def("collect_monitors", &rwd::python::collect_monitors,
        "per-head monitors ('L0.H1.max_logit', ...) over the attention() calls since the last collect");
  rwd::python::bind_store(m);
  rwd::python::bind_record(m);
}
