// rewind._C's per-head monitors (python/monitors.h): set_monitoring, take_monitor_stats,
// monitors_from_stats, collect_monitors.
#include "python/monitors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/head_stats.h"

namespace rwd::python {

namespace {

// The captures of every attention() call since the last take, by layer. Read when taken, so a
// CUDA forward never waits for its stats. Under g_captures_mu: the compiled ops run without the
// GIL (torch.ops calls release it), a backward on autograd's device thread.
std::mutex g_captures_mu;
bool g_monitoring = false;
std::map<int, std::vector<std::shared_ptr<kernels::AttentionCapture>>> g_captures;

}  // namespace

std::shared_ptr<kernels::AttentionCapture> monitor_capture(int layer) {
  std::lock_guard<std::mutex> lock(g_captures_mu);
  if (!g_monitoring) return nullptr;
  auto capture = std::make_shared<kernels::AttentionCapture>();
  capture->keep_tensors = false;  // the stats alone
  g_captures[layer].push_back(capture);
  return capture;
}

LayerStats take_monitor_stats() {
  std::lock_guard<std::mutex> lock(g_captures_mu);
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

std::vector<std::pair<std::string, double>> monitors_from_stats(const LayerStats& stats) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [layer, raw] : stats) {
    std::vector<kernels::HeadStats> sum;
    for (const torch::Tensor& r : raw) {
      const torch::Tensor host = r.to(torch::kCPU).contiguous();
      std::vector<kernels::HeadStats> x(static_cast<size_t>(host.numel()) / sizeof(kernels::HeadStats));
      std::memcpy(x.data(), host.data_ptr(), x.size() * sizeof(kernels::HeadStats));
      kernels::merge_head_stats(sum, x.data(), x.size());
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

void bind_monitors(pybind11::module_& m) {
  namespace py = pybind11;
  m.def(
      "set_monitoring",
      [](bool on) {
        std::lock_guard<std::mutex> lock(g_captures_mu);
        g_monitoring = on;
        g_captures.clear();
      },
      "record per-head monitors of every attention() call from now on (rewind.record turns it on)");
  m.def("take_monitor_stats", &take_monitor_stats,
        "the raw per-head stats of the attention() calls since the last collect, by layer, where they lie");
  m.def("monitors_from_stats", &monitors_from_stats, py::arg("stats"),
        "collect_monitors' list from take_monitor_stats' stats (copied to the host)");
  m.def("collect_monitors", [] { return monitors_from_stats(take_monitor_stats()); },
        "per-head monitors ('L0.H1.max_logit', ...) over the attention() calls since the last collect "
        "(waits for a CUDA forward's stats)");
}

}  // namespace rwd::python
