// Search-space hierarchy (layer -> head -> op), element printing and the candidate -> plan
// mapping used by the bisect driver to turn a probe into a replayable precision plan.
#include "bisect/space.h"

#include <algorithm>

#include "common/error.h"

namespace rwd::bisect {
namespace {

constexpr const char* kAllOps[] = {"qk", "softmax", "pv", "o", "delta", "bwd"};
constexpr const char* kAllModules[] = {"qkv", "proj", "mlp", "ln"};

int index_of(const std::vector<std::string>& v, const std::string& s) {
  auto it = std::find(v.begin(), v.end(), s);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

int op_index(const std::string& op) {
  for (int k = 0; k < kernels::kNumOps; ++k) if (op == kAllOps[k]) return k;
  return -1;
}

int module_index(const std::string& m) {
  for (int k = 0; k < plan::kNumModules; ++k) if (m == kAllModules[k]) return k;
  return -1;
}

}  // namespace

bool operator==(const Element& a, const Element& b) {
  return a.layer == b.layer && a.head == b.head && a.op == b.op;
}
bool operator!=(const Element& a, const Element& b) { return !(a == b); }

std::string to_string(const Element& e) {
  if (e.layer < 0) return e.op;
  std::string s = "L" + std::to_string(e.layer);
  if (e.head >= 0) s += ".H" + std::to_string(e.head);
  if (e.head >= 0 && e.op == "attn") return s;
  return s + "." + e.op;
}

std::string to_string(const std::vector<Element>& set) {
  std::string s = "{";
  for (size_t i = 0; i < set.size(); ++i) s += (i ? "," : "") + to_string(set[i]);
  return s + "}";
}

std::string to_string(const Candidate& c) {
  return (c.mode == Mode::kKeepLow ? "low" : "fp32") + to_string(c.elements);
}

void SearchSpace::validate() const {
  if (n_layer < 0 || n_head < 0) throw UsageError("bisect: negative model size in search space");
  for (const auto& op : ops)
    if (op_index(op) < 0) throw UsageError("bisect: unknown op '" + op + "' in search space");
  for (const auto& m : modules)
    if (module_index(m) < 0) throw UsageError("bisect: unknown module '" + m + "' in search space");
}

bool SearchSpace::covers_everything() const {
  for (const char* op : kAllOps) if (index_of(ops, op) < 0) return false;
  for (const char* m : kAllModules) if (index_of(modules, m) < 0) return false;
  return model_head;
}

std::vector<Element> SearchSpace::top_level() const {
  std::vector<Element> out;
  for (int l = 0; l < n_layer; ++l) {
    if (!ops.empty() && n_head > 0) out.push_back({l, -1, "attn"});
    for (const auto& m : modules) out.push_back({l, -1, m});
  }
  if (model_head) out.push_back({-1, -1, "head"});
  return out;
}

std::vector<Element> SearchSpace::children(const Element& e) const {
  std::vector<Element> out;
  if (e.op != "attn") return out;
  if (e.head < 0) {
    for (int h = 0; h < n_head; ++h) out.push_back({e.layer, h, "attn"});
  } else {
    for (const auto& op : ops) out.push_back({e.layer, e.head, op});
  }
  return out;
}

std::vector<Element> SearchSpace::leaves(const Element& e) const {
  std::vector<Element> kids = children(e);
  if (kids.empty()) return {e};
  std::vector<Element> out;
  for (const auto& k : kids)
    for (auto& leaf : leaves(k)) out.push_back(std::move(leaf));
  return out;
}

int SearchSpace::sweep_size() const {
  return n_layer * (n_head * static_cast<int>(ops.size()) + static_cast<int>(modules.size())) +
         (model_head ? 1 : 0);
}

bool SearchSpace::before(const Element& a, const Element& b) const {
  auto layer_rank = [](const Element& e) { return e.layer < 0 ? 1 << 30 : e.layer; };
  // attention elements sort before modules of the same layer; ops in space order.
  auto op_rank = [&](const Element& e) {
    if (e.op == "attn") return -1;
    int k = index_of(ops, e.op);
    return k >= 0 ? k : static_cast<int>(ops.size()) + index_of(modules, e.op);
  };
  if (layer_rank(a) != layer_rank(b)) return layer_rank(a) < layer_rank(b);
  int ha = a.head < 0 ? (a.op == "attn" ? -1 : 1 << 30) : a.head;
  int hb = b.head < 0 ? (b.op == "attn" ? -1 : 1 << 30) : b.head;
  if (ha != hb) return ha < hb;
  return op_rank(a) < op_rank(b);
}

plan::Plan candidate_plan(const Candidate& c, const SearchSpace& space,
                          const plan::Plan& recorded) {
  if (recorded.n_layer != space.n_layer || recorded.n_head != space.n_head)
    throw Error(ExitCode::kInternal, "bisect: plan is " + std::to_string(recorded.n_layer) + "x" +
                                         std::to_string(recorded.n_head) + ", search space is " +
                                         std::to_string(space.n_layer) + "x" +
                                         std::to_string(space.n_head));
  bool keep_low = (c.mode == Mode::kKeepLow);
  plan::Plan p = keep_low ? plan::apply(recorded, "all=fp32") : recorded;
  for (const auto& e : c.elements) {
    for (const auto& leaf : space.leaves(e)) {
      bool bad_layer = leaf.layer >= space.n_layer || (leaf.layer < 0 && leaf.op != "head");
      bool bad_head = leaf.head >= space.n_head || (leaf.head < 0 && op_index(leaf.op) >= 0);
      if (bad_layer || bad_head)
        throw Error(ExitCode::kInternal, "bisect: element " + to_string(leaf) +
                                             " is outside the model");
      if (leaf.op == "head") {
        p.head_fp32 = keep_low ? recorded.head_fp32 : true;
        continue;
      }
      int m = module_index(leaf.op);
      if (m >= 0) {
        p.layers[leaf.layer].module_fp32[m] =
            keep_low ? recorded.layers[leaf.layer].module_fp32[m] : true;
        continue;
      }
      int op = op_index(leaf.op);
      if (op < 0) throw Error(ExitCode::kInternal, "bisect: unknown element op '" + leaf.op + "'");
      auto& dst = p.layers[leaf.layer].heads[leaf.head];
      const auto& src = recorded.layers[leaf.layer].heads[leaf.head];
      dst.prec[op] = keep_low ? src.prec[op] : kernels::Prec::kFp32;
      dst.fault[op] = keep_low ? src.fault[op] : 0.0f;
    }
  }
  return p;
}

}  // namespace rwd::bisect
