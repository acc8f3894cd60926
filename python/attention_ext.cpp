// rewind._C: the LibTorch extension behind the Python package: rewind's attention as a
// differentiable op (per-head precision flags from the plan language, per-head monitors while
// a recording asks for them) and the module itself.
#include <torch/extension.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/switches.h"
#include "kernels/attention_layout.h"
#include "kernels/attention_op.h"
#include "kernels/stochastic_round.h"
#include "plan/plan.h"
#include "python/monitors.h"
#include "python/record_ext.h"
#include "python/store_ext.h"

namespace rwd::python {

namespace {

// Layers a plan given to attention() or op_fp32() may name: the op sees one layer, the plan
// may be a whole model's (its other layers are ignored).
constexpr int kMaxLayers = 1024;

// The plans parsed for attention() and op_fp32(), by spec and head count: parsing a 1024-layer
// plan on every call cost each attention() call more than its small shapes' math on the host.
// A script runs under a few plans (the recorded one, a replay's); the cache is emptied when it
// holds kMaxCachedPlans. Under g_plans_mu: the compiled ops run without the GIL.
constexpr size_t kMaxCachedPlans = 16;
std::mutex g_plans_mu;
std::map<std::pair<std::string, int>, std::shared_ptr<const plan::Plan>> g_plans;

std::shared_ptr<const plan::Plan> parsed(const std::string& spec, int n_head, const char* what) {
  std::lock_guard<std::mutex> lock(g_plans_mu);
  auto key = std::make_pair(spec, n_head);
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return it->second;
  std::shared_ptr<const plan::Plan> p;
  try {
    p = std::make_shared<const plan::Plan>(plan::parse(spec, kMaxLayers, n_head));
  } catch (const Error& e) {
    throw std::invalid_argument(std::string(what) + ": " + e.what());
  }
  if (g_plans.size() >= kMaxCachedPlans) g_plans.clear();
  g_plans.emplace(std::move(key), p);
  return p;
}

// The layer-level assignments of `spec` (those whose target names no heads: `L3.mlp=fp32`,
// `L*=fp32`, `all=fp32`, `head=fp32`, ...): a module's flag depends on these alone, and they
// parse without knowing the model's head count.
std::string layer_level(const std::string& spec) {
  std::string out;
  size_t b = 0;
  while (b <= spec.size()) {
    size_t e = spec.find(';', b);
    if (e == std::string::npos) e = spec.size();
    const std::string a = spec.substr(b, e - b);
    std::string target;
    for (char c : a.substr(0, a.find('=')))
      if (!std::isspace(static_cast<unsigned char>(c))) target += c;
    if (target.find(".H") == std::string::npos) out += (out.empty() ? "" : ";") + a;
    b = e + 1;
  }
  return out;
}

// Whether the plan runs the block rewind.op(name) wraps in FP32: "L<i>.qkv|proj|mlp|ln" (the
// layer's module flag: `L3.mlp=fp32`, `L3=fp32`, `L*.mlp=fp32`, `all=fp32`), "L<i>.attn" (the
// attention module's linears: qkv and proj both promoted) or "head" (`head=fp32`, `all=fp32`).
bool op_fp32(const std::string& spec, const std::string& name) {
  const std::string usage = "rewind.op: '" + name +
                            "' is no op name (expected L<layer>.qkv, .proj, .mlp, .ln, .attn or head)";
  const plan::Plan& p = *parsed(layer_level(spec), 1, "rewind.op");
  if (name == "head") return p.head_fp32;
  const size_t dot = name.find('.');
  if (name.size() < 4 || name[0] != 'L' || dot == std::string::npos || dot == 1 || dot > 5)
    throw std::invalid_argument(usage);
  int layer = 0;
  for (size_t i = 1; i < dot; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) throw std::invalid_argument(usage);
    layer = layer * 10 + (name[i] - '0');
  }
  if (layer >= kMaxLayers) throw std::invalid_argument(usage);
  const plan::LayerPlan& lp = p.layers[layer];
  const std::string m = name.substr(dot + 1);
  auto flag = [&](plan::Module k) { return lp.module_fp32[static_cast<int>(k)]; };
  if (m == "qkv") return flag(plan::Module::kQkv);
  if (m == "proj") return flag(plan::Module::kProj);
  if (m == "mlp") return flag(plan::Module::kMlp);
  if (m == "ln") return flag(plan::Module::kLn);
  if (m == "attn") return flag(plan::Module::kQkv) && flag(plan::Module::kProj);
  throw std::invalid_argument(usage);
}

// The step rewind.record's loop is in (rec.batch sets it; 0 outside a recording): an sr head's
// random bits are sr_call_key(0, step, 0, layer)'s, so a replay of the step draws them again.
// One batch a step in a script, so the micro-batch is 0.
std::atomic<int64_t> g_sr_step{0};

// The kernels' options for `layer` of the plan `spec` on (B, H, T, D) operands.
kernels::AttentionOptions options_for(const std::string& spec, int n_head, int64_t head_dim, int layer, bool causal) {
  const std::shared_ptr<const plan::Plan> held = parsed(spec, n_head, "rewind.attention");
  const plan::Plan& plan = *held;
  const plan::LayerPlan& lp = plan.layers[layer];
  kernels::AttentionOptions opt;
  opt.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  opt.causal = causal;
  opt.naive = lp.naive;
  opt.block_q = plan.block_q;
  opt.block_k = plan.block_k;
  opt.flags = lp.heads;
  opt.sr_key = kernels::sr_call_key(0, g_sr_step, 0, layer);
  return opt;
}

// Whether rewind.attention on BF16 q, k, v of `layer` takes the kernels' BF16 entry points: the
// plan promotes no op of the layer's heads to FP32 (those need the FP32 path's twins).
bool bf16_ok(const std::string& spec, int n_head, int64_t head_dim, int layer) {
  TORCH_CHECK(layer >= 0 && layer < kMaxLayers, "rewind.attention: layer must be in 0..", kMaxLayers - 1);
  return kernels::bf16_attention_ok(options_for(spec, n_head, head_dim, layer, true).flags);
}

// The BF16 path's forward (what rewind's trainer runs): one copy of q, k, v into the kernels'
// (3, B, H, T, D) layout (stack_heads_bf16: one of our copy kernels for a model's usual views).
// Returns O (BF16), LSE (FP32) and that copy, which the backward reads.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> bf16_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                     const torch::Tensor& v, const std::string& spec,
                                                                     int64_t layer, bool causal) {
  TORCH_CHECK(layer >= 0 && layer < kMaxLayers, "rewind.attention: layer must be in 0..", kMaxLayers - 1);
  const kernels::AttentionOptions opt =
      options_for(spec, static_cast<int>(q.size(1)), q.size(3), static_cast<int>(layer), causal);
  std::shared_ptr<kernels::AttentionCapture> capture = monitor_capture(static_cast<int>(layer));
  const torch::Tensor qkv = kernels::stack_heads_bf16(q, k, v);
  torch::Tensor lse;
  torch::Tensor o = kernels::attention_bf16_forward(qkv, opt, capture.get(), lse);
  return {o, lse, qkv};
}

// dQ, dK, dV (BF16) of bf16_forward's call, as one (3, B, H, T, D) tensor with the strides of a
// fused qkv projection's (B, T, 3, H, D) output (qkv_grad_bf16): its gradient needs no transpose.
torch::Tensor bf16_backward(const torch::Tensor& d_o, const torch::Tensor& qkv, const torch::Tensor& o,
                            const torch::Tensor& lse, const std::string& spec, int64_t layer, bool causal) {
  const kernels::AttentionOptions opt =
      options_for(spec, static_cast<int>(qkv.size(2)), qkv.size(4), static_cast<int>(layer), causal);
  const torch::Tensor g = d_o.defined() ? kernels::dense_heads_bf16(d_o) : torch::zeros_like(o);
  return kernels::qkv_grad_bf16(kernels::attention_bf16_backward(qkv, o, lse, g, opt));
}

// rewind.attention on BF16 q, k, v (a model under autocast) where the plan promotes no op of
// the layer's heads: the kernels' BF16 entry points instead of the FP32 path's conversions of
// q, k, v, O and their gradients. Same kernels, same bits as the FP32 path on the widened
// values (tests/python/test_rewind.py). Under torch.compile the same two halves run as the
// operators rewind::attention and rewind::attention_backward (below).
struct Bf16Attention : public torch::autograd::Function<Bf16Attention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const std::string& spec, int64_t layer, bool causal) {
    auto [o, lse, qkv] = bf16_forward(q, k, v, spec, layer, causal);
    ctx->save_for_backward({qkv, o, lse});
    ctx->saved_data["spec"] = spec;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["causal"] = causal;
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    const torch::Tensor d = bf16_backward(grad_out[0], s[0], s[1], s[2], ctx->saved_data["spec"].toStringRef(),
                                          ctx->saved_data["layer"].toInt(), ctx->saved_data["causal"].toBool());
    return {d[0], d[1], d[2], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const std::string& plan_spec, int layer, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "rewind.attention: q, k, v must be (batch, heads, seq, head_dim)");
  TORCH_CHECK(layer >= 0 && layer < kMaxLayers, "rewind.attention: layer must be in 0..", kMaxLayers - 1);
  const kernels::AttentionOptions opt = options_for(plan_spec, static_cast<int>(q.size(1)), q.size(3), layer, causal);
  const bool bf16 = q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
                    v.scalar_type() == torch::kBFloat16 && q.sizes() == k.sizes() && q.sizes() == v.sizes() &&
                    q.device() == k.device() && q.device() == v.device();
  if (bf16 && kernels::bf16_attention_ok(opt.flags) && !switches::on(switches::Switch::kAttentionFp32Path))
    return Bf16Attention::apply(q, k, v, plan_spec, layer, causal);
  // Like F.scaled_dot_product_attention under autocast: any float dtype in, the same out.
  const auto dtype = q.scalar_type();
  std::shared_ptr<kernels::AttentionCapture> capture = monitor_capture(layer);
  torch::Tensor o =
      kernels::attention(q.to(torch::kFloat32), k.to(torch::kFloat32), v.to(torch::kFloat32), opt, capture);
  return o.to(dtype);
}

// The plans that the compiled ops' `where` tensors name. A source is a rewind.instrument state
// or rewind.attention's plan= argument (python/rewind/_compiled.py registers each, and tells
// the active plan whenever it changes), with a plan of its own or the recording's active one.
// Kept here so that an op called from a compiled graph finds its plan without Python: defined
// in Python (torch.library.custom_op), the operators' dispatch cost 20-27 us a call on the host
// against ~6 here (experiments/instrument_bench/results/cpu_op_host.txt).
struct Source {
  bool follows_active = true;
  std::string plan;
};
std::mutex g_sources_mu;
std::map<int64_t, Source> g_sources;
std::string g_active_plan;

// (plan, layer) of a `where` tensor: int64 [source, layer] on the CPU (a graph input that
// dynamo cannot bake in, so every block of a model shares one compiled graph).
std::pair<std::string, int64_t> plan_of(const torch::Tensor& where) {
  TORCH_CHECK(where.device().is_cpu() && where.scalar_type() == torch::kLong && where.numel() == 2,
              "rewind::attention: `where` must be a CPU int64 tensor [source, layer]");
  const torch::Tensor w = where.contiguous();
  const int64_t source = w.data_ptr<int64_t>()[0];
  const int64_t layer = w.data_ptr<int64_t>()[1];
  std::lock_guard<std::mutex> lock(g_sources_mu);
  const auto it = g_sources.find(source);
  TORCH_CHECK(it != g_sources.end(),
              "rewind: attention of a model that is no longer instrumented (its rewind.instrument state is gone); "
              "instrument the model again");
  return {it->second.follows_active ? g_active_plan : it->second.plan, layer};
}

// rewind::attention and rewind::attention_backward: the BF16 path's two halves as operators of
// the dispatcher (CPU, CUDA and autograd kernels here; their fakes, for tracing, in
// python/rewind/_compiled.py), which inductor calls from a compiled graph.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attention_op(const torch::Tensor& q, const torch::Tensor& k,
                                                                     const torch::Tensor& v,
                                                                     const torch::Tensor& where, bool causal) {
  const auto [spec, layer] = plan_of(where);
  return bf16_forward(q, k, v, spec, layer, causal);
}

torch::Tensor attention_backward_op(const torch::Tensor& d_o, const torch::Tensor& qkv, const torch::Tensor& o,
                                    const torch::Tensor& lse, const torch::Tensor& where, bool causal) {
  const auto [spec, layer] = plan_of(where);
  return bf16_backward(d_o, qkv, o, lse, spec, layer, causal);
}

using OpOutputs = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>;

// The ops' dispatcher handles, found once.
const auto& forward_handle() {
  static const auto h = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("rewind::attention", "")
                            .typed<OpOutputs(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             const torch::Tensor&, bool)>();
  return h;
}

const auto& backward_handle() {
  static const auto h = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("rewind::attention_backward", "")
                            .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                 const torch::Tensor&, const torch::Tensor&, bool)>();
  return h;
}

// rewind::attention's autograd kernel. In C++, as torchvision's ops have theirs, so that a call
// from a compiled graph (which runs without grad) stays in C++; AOTAutograd traces the backward
// through it into the joint graph as a call of rewind::attention_backward.
struct AttentionOp : public torch::autograd::Function<AttentionOp> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                                                const torch::Tensor& k, const torch::Tensor& v,
                                                const torch::Tensor& where, bool causal) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [o, lse, qkv] = forward_handle().call(q, k, v, where, causal);
    ctx->save_for_backward({qkv, o, lse, where});
    ctx->saved_data["causal"] = causal;
    ctx->mark_non_differentiable({lse, qkv});
    return {o, lse, qkv};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    at::AutoDispatchBelowADInplaceOrView below;  // no double backward
    const torch::Tensor d = backward_handle().call(grad_out[0], s[0], s[1], s[2], s[3], ctx->saved_data["causal"].toBool());
    return {d[0], d[1], d[2], torch::Tensor(), torch::Tensor()};
  }
};

OpOutputs attention_autograd(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& where, bool causal) {
  const torch::autograd::variable_list r = AttentionOp::apply(q, k, v, where, causal);
  return {r[0], r[1], r[2]};
}

}  // namespace

}  // namespace rwd::python

TORCH_LIBRARY(rewind, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor where, bool causal) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward(Tensor d_o, Tensor qkv, Tensor o, Tensor lse, Tensor where, bool causal) -> Tensor");
}

TORCH_LIBRARY_IMPL(rewind, CPU, m) {
  m.impl("attention", &rwd::python::attention_op);
  m.impl("attention_backward", &rwd::python::attention_backward_op);
}

TORCH_LIBRARY_IMPL(rewind, CUDA, m) {
  m.impl("attention", &rwd::python::attention_op);
  m.impl("attention_backward", &rwd::python::attention_backward_op);
}

TORCH_LIBRARY_IMPL(rewind, Autograd, m) { m.impl("attention", &rwd::python::attention_autograd); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rewind's LibTorch extension (use the `rewind` package, not this module)";
  rwd::switches::check_all();  // a bad REWIND_* value fails the import with its one line
  m.def(
      "timer",
      [](const std::string& item) { return rwd::switches::listed(rwd::switches::Switch::kTimes, item.c_str()); },
      pybind11::arg("item"), "whether REWIND_TIMES lists `item` (phase, restore, bisect, record, probe)");
  m.def("attention", &rwd::python::attention, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("plan") = "", pybind11::arg("layer") = 0, pybind11::arg("causal") = true,
        "rewind's attention on (B, H, T, D) tensors with the plan's per-head flags for `layer`");
  m.def("attention_bf16_ok", &rwd::python::bf16_ok, pybind11::arg("plan"), pybind11::arg("heads"),
        pybind11::arg("head_dim"), pybind11::arg("layer"),
        "whether attention() on BF16 operands of `layer` takes the BF16 kernels under this plan");
  m.def("attention_bf16_forward", &rwd::python::bf16_forward, pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("plan"), pybind11::arg("layer"), pybind11::arg("causal"),
        "the BF16 path's forward: (O, LSE, the (3, B, H, T, D) copy of q, k, v the backward reads)");
  m.def("attention_bf16_backward", &rwd::python::bf16_backward, pybind11::arg("d_o"), pybind11::arg("qkv"),
        pybind11::arg("o"), pybind11::arg("lse"), pybind11::arg("plan"), pybind11::arg("layer"),
        pybind11::arg("causal"), "the BF16 path's backward: dQ, dK, dV as one (3, B, H, T, D) tensor");
  m.def("set_sr_step", [](int64_t step) { rwd::python::g_sr_step = step; }, pybind11::arg("step"),
        "the step whose stochastic-rounding bits rewind.attention draws (rewind.record sets it)");
  m.def(
      "set_source",
      [](int64_t id, bool follows_active, const std::string& plan) {
        std::lock_guard<std::mutex> lock(rwd::python::g_sources_mu);
        rwd::python::g_sources[id] = {follows_active, plan};
      },
      pybind11::arg("id"), pybind11::arg("follows_active"), pybind11::arg("plan"),
      "registers the source `id` of the compiled ops' `where` tensors: the active plan, or `plan`");
  m.def(
      "drop_source",
      [](int64_t id) {
        std::lock_guard<std::mutex> lock(rwd::python::g_sources_mu);
        rwd::python::g_sources.erase(id);
      },
      pybind11::arg("id"), "forgets the source `id` (its rewind.instrument state is gone)");
  m.def(
      "set_active_plan",
      [](const std::string& plan) {
        std::lock_guard<std::mutex> lock(rwd::python::g_sources_mu);
        rwd::python::g_active_plan = plan;
      },
      pybind11::arg("plan"), "the plan that the compiled ops of sources without their own apply");
  m.def("op_fp32", &rwd::python::op_fp32, pybind11::arg("plan"), pybind11::arg("name"),
        "whether the plan runs rewind.op(name)'s block in FP32");
  rwd::python::bind_monitors(m);
  rwd::python::bind_store(m);
  rwd::python::bind_record(m);
}
