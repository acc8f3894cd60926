// Single-step low- vs high-precision comparison.
#include "replay/step_probe.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/error.h"
#include "replay/replayer.h"

namespace rwd::replay {

std::string promote_spec(const std::string& targets) {
  std::string out;
  std::stringstream ss(targets);
  std::string item;
  while (std::getline(ss, item, ';')) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos) continue;
    item = item.substr(a, b - a + 1);
    if (item.find('=') == std::string::npos) item += "=fp32";
    out += (out.empty() ? "" : ";") + item;
  }
  if (out.empty()) throw UsageError("step: --fp32 needs at least one target, e.g. 'L2.H8.pv'");
  return out;
}

namespace {

bool same_flags(const kernels::HeadFlags& a, const kernels::HeadFlags& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Heads whose plan differs between lp and hp; every head when the plans are equal.
std::vector<std::pair<int, int>> changed_heads(const plan::Plan& lp, const plan::Plan& hp) {
  std::vector<std::pair<int, int>> out;
  for (int l = 0; l < lp.n_layer; ++l) {
    bool layer_changed = lp.layers[l].naive != hp.layers[l].naive ||
                         std::memcmp(lp.layers[l].module_fp32, hp.layers[l].module_fp32,
                                     sizeof lp.layers[l].module_fp32) != 0;
    for (int h = 0; h < lp.n_head; ++h)
      if (layer_changed || !same_flags(lp.layers[l].heads[h], hp.layers[l].heads[h])) out.emplace_back(l, h);
  }
  if (out.empty())
    for (int l = 0; l < lp.n_layer; ++l)
      for (int h = 0; h < lp.n_head; ++h) out.emplace_back(l, h);
  return out;
}

}  // namespace

StepProbeResult probe_step(store::Store& s, int64_t run, int64_t step, const std::string& fp32_spec,
                           const std::string& data_path) {
  const std::string spec = promote_spec(fp32_spec);
  train::RunSpec rs = train::RunSpec::load(s, run);
  auto range = s.step_range(rs.run_id);
  if (!range || step < range->first || step > range->second)
    throw UsageError("step " + std::to_string(step) + " is outside the recording" +
                     (range ? " (steps " + std::to_string(range->first) + ".." + std::to_string(range->second) + ")" : ""));
  const train::Config& c = rs.config;
  plan::Plan lp = rs.plan.at(step, c.n_layer, c.n_head);
  plan::Plan hp = plan::apply(lp, spec);
  RestoreOptions ro;
  ro.data_path = data_path;
  Restored st = restore_before(s, rs.run_id, step, ro);
  std::vector<int> layers(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) layers[l] = l;
  std::map<std::string, torch::Tensor> g_lp, g_hp;
  train::StepResult a = st.trainer->probe_step(lp, layers, &g_lp);
  train::StepResult b = st.trainer->probe_step(hp, layers, &g_hp);

  StepProbeResult out;
  out.step = step;
  out.plan_lp = lp.canonical();
  out.plan_hp = hp.canonical();
  out.loss_lp = a.loss;
  out.loss_hp = b.loss;
  out.grad_norm_lp = a.grad_norm;
  out.grad_norm_hp = b.grad_norm;
  const int64_t D = c.head_dim();
  for (auto [l, h] : changed_heads(lp, hp)) {
    HeadDiff d;
    d.layer = l;
    d.head = h;
    const auto& ca = *a.captures.at(l);
    const auto& cb = *b.captures.at(l);
    torch::Tensor od = (ca.o.select(1, h).to(torch::kFloat64) - cb.o.select(1, h).to(torch::kFloat64));
    d.o_mean = od.mean().item<double>();
    d.o_max_abs = od.abs().max().item<double>();
    d.delta_sum = (ca.delta.select(1, h).to(torch::kFloat64) - cb.delta.select(1, h).to(torch::kFloat64)).sum().item<double>();
    const std::string name = "h." + std::to_string(l) + ".c_attn";
    torch::Tensor gw = (g_lp.at(name).slice(0, h * D, (h + 1) * D).to(torch::kFloat64) -
                        g_hp.at(name).slice(0, h * D, (h + 1) * D).to(torch::kFloat64));
    d.dwq_norm = gw.norm().item<double>();
    torch::Tensor sv = at::linalg_svdvals(gw);
    double total = sv.pow(2).sum().item<double>();
    d.dwq_top_share = total > 0 ? sv[0].pow(2).item<double>() / total : 0.0;
    out.heads.push_back(d);
  }
  return out;
}

std::string StepProbeResult::to_json() const {
  nlohmann::ordered_json j;
  j["step"] = step;
  j["plan_lp"] = plan_lp;
  j["plan_hp"] = plan_hp;
  j["loss_lp"] = loss_lp;
  j["loss_hp"] = loss_hp;
  j["grad_norm_lp"] = grad_norm_lp;
  j["grad_norm_hp"] = grad_norm_hp;
  j["heads"] = nlohmann::json::array();
  for (const auto& d : heads) {
    j["heads"].push_back({{"layer", d.layer}, {"head", d.head}, {"o_mean", d.o_mean},
                          {"o_max_abs", d.o_max_abs}, {"delta_sum", d.delta_sum},
                          {"dwq_norm", d.dwq_norm}, {"dwq_top_share", d.dwq_top_share}});
  }
  return j.dump(2);
}

std::string StepProbeResult::to_table() const {
  std::string t;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld\n  low precision: %s\n  high precision: %s\n",
                static_cast<long long>(step), plan_lp.empty() ? "(default)" : plan_lp.c_str(), plan_hp.c_str());
  t += buf;
  std::snprintf(buf, sizeof buf, "  loss      lp %.9g  hp %.9g\n  grad norm lp %.9g  hp %.9g\n\n",
                double(loss_lp), double(loss_hp), double(grad_norm_lp), double(grad_norm_hp));
  t += buf;
  std::snprintf(buf, sizeof buf, "%-8s %14s %12s %14s %12s %10s\n", "head", "O bias(mean)", "O max|d|",
                "sum delta diff", "|dWq diff|", "top-1 share");
  t += buf;
  for (const auto& d : heads) {
    std::snprintf(buf, sizeof buf, "L%d.H%-4d %14.4e %12.4e %14.4e %12.4e %10.3f\n", d.layer, d.head, d.o_mean,
                  d.o_max_abs, d.delta_sum, d.dwq_norm, d.dwq_top_share);
    t += buf;
  }
  return t;
}

}  // namespace rwd::replay
