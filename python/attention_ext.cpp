// rewind._C: the LibTorch extension behind the Python package: rewind's attention as a
// differentiable op (per-head precision flags from the plan language) and the module itself.
#include <torch/extension.h>

#include <cmath>
#include <string>

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
  torch::Tensor o = kernels::attention(q.to(torch::kFloat32), k.to(torch::kFloat32), v.to(torch::kFloat32), opt);
  return o.to(dtype);
}

}  // namespace

}  // namespace rwd::python

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rewind's LibTorch extension (use the `rewind` package, not this module)";
  m.def("attention", &rwd::python::attention, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("plan") = "", pybind11::arg("layer") = 0, pybind11::arg("causal") = true,
        "rewind's attention on (B, H, T, D) tensors with the plan's per-head flags for `layer`");
  rwd::python::bind_store(m);
  rwd::python::bind_record(m);
}
