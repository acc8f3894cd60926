// Predicted probe cost from the op kinds a candidate promotes (see cost.h).
#include "bisect/cost.h"

#include <algorithm>
#include <set>
#include <vector>

#include "common/error.h"

namespace rwd::bisect {

namespace {

const std::vector<std::string> kAttnOps = {"qk", "softmax", "pv", "o", "delta", "bwd"};
const std::vector<std::string> kModules = {"qkv", "proj", "mlp", "ln"};

bool in(const std::vector<std::string>& v, const std::string& x) {
  for (const auto& s : v)
    if (s == x) return true;
  return false;
}

}  // namespace

CostModel CostModel::h100() {
  CostModel m;
  m.name = "h100";
  // Attention, 0.69 in all: the flag path 0.11 once, 0.50 for the FP32 kernel path of every
  // layer (one FP32 head makes the kernel ~2x), 0.08 for the ops' own math (bwd the largest).
  m.attn_any = 0.11;
  m.attn_layers = 0.50;
  m.kind_extra = {{"qk", 0.010}, {"softmax", 0.010}, {"pv", 0.015}, {"o", 0.005}, {"delta", 0.005},
                  {"bwd", 0.035}, {"qkv", 0.326}, {"proj", 0.109}, {"mlp", 0.871}, {"ln", 0.060},
                  {"head", 0.594}};
  return m;
}

CostModel CostModel::named(const std::string& name) {
  if (name == "h100") return h100();
  throw UsageError("bisect: unknown cost model '" + name + "' (known: h100)");
}

double CostModel::step_cost(const Candidate& c, const SearchSpace& space) const {
  // Leaves the candidate names, by kind and (for attention) by layer.
  std::map<std::string, int> chosen;
  std::vector<int> chosen_attn(static_cast<size_t>(std::max(space.n_layer, 0)), 0);
  std::set<std::string> seen;
  for (const auto& e : c.elements)
    for (const auto& leaf : space.op_leaves(e)) {
      if (!seen.insert(to_string(leaf)).second) continue;
      ++chosen[leaf.op];
      if (leaf.head >= 0 && in(kAttnOps, leaf.op)) ++chosen_attn[static_cast<size_t>(leaf.layer)];
    }
  const bool keep_low = c.mode == Mode::kKeepLow;
  const double heads = static_cast<double>(space.n_layer) * space.n_head;
  double cost = 1.0;
  auto add = [&](const std::string& kind, bool searched, double total) {
    if (total <= 0) return;
    const double named = chosen.count(kind) ? chosen.at(kind) : 0;
    const double promoted = keep_low ? total - (searched ? named : 0) : (searched ? named : 0);
    auto it = kind_extra.find(kind);
    if (it != kind_extra.end()) cost += it->second * promoted / total;
  };
  for (const auto& op : kAttnOps) add(op, in(space.ops, op), heads);
  for (const auto& m : kModules) add(m, in(space.modules, m), space.n_layer);
  add("head", space.model_head, 1);
  // A layer's attention runs its FP32 path when any of its head ops is promoted: in a keep-low
  // run unless every attention op of the layer (all six, every head) is kept low.
  const int per_layer = space.n_head * static_cast<int>(kAttnOps.size());
  int touched = 0;
  for (int l = 0; l < space.n_layer && space.n_head > 0; ++l) {
    const int named = chosen_attn[static_cast<size_t>(l)];
    touched += keep_low ? (named < per_layer ? 1 : 0) : (named > 0 ? 1 : 0);
  }
  if (touched > 0) cost += attn_any + attn_layers * touched / space.n_layer;
  return cost;
}

}  // namespace rwd::bisect
