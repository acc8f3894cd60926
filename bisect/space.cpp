// Search-space hierarchy (layer -> head -> op), element printing and the candidate -> plan
// mapping used by the bisect driver to turn a probe into a replayable precision plan.
#include "bisect/space.h"

#include <algorithm>

#include "common/error.h"

namespace rwd::bisect {
namespace {

constexpr const char* kAllOps[] = {"qk", "softmax", "pv", "o", "delta", "bwd"};
constexpr const char* kAccOp = "acc";  // the accumulator pseudo-op (HeadFlags::acc_bf16)
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
    if (op_index(op) < 0 && op != kAccOp) throw UsageError("bisect: unknown op '" + op + "' in search space");
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
  if (e.op != "attn" || (e.head < 0 ? depth < 1 : depth < 2)) return out;
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

std::vector<Element> SearchSpace::op_leaves(const Element& e) const {
  if (depth == 2) return leaves(e);
  SearchSpace full = *this;
  full.depth = 2;
  return full.leaves(e);
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

namespace {

// Copies what leaf op `op` of a head stands for from `src` into `dst` (space.h).
void take_op(kernels::HeadFlags& dst, const kernels::HeadFlags& src, const std::string& op) {
  if (op == kAccOp) {
    dst.acc_bf16 = src.acc_bf16;
    dst.acc_sr = src.acc_sr;
    return;
  }
  const int k = op_index(op);
  if (k < 0) throw Error(ExitCode::kInternal, "bisect: unknown element op '" + op + "'");
  dst.prec[k] = src.prec[k];
  dst.fault[k] = src.fault[k];
  if (k == static_cast<int>(kernels::Op::kQk)) {
    dst.s_bf16 = src.s_bf16;
    dst.s_sr = src.s_sr;
  }
  if (k == static_cast<int>(kernels::Op::kPv)) dst.pv_sr = src.pv_sr;
  if (k == static_cast<int>(kernels::Op::kSoftmax)) {
    dst.stable = src.stable;
    dst.beta = src.beta;
    dst.eps = src.eps;
  }
  if (k == static_cast<int>(kernels::Op::kDelta)) dst.delta_dpp = src.delta_dpp;
}

bool same_op(const kernels::HeadFlags& a, const kernels::HeadFlags& b, const std::string& op) {
  if (op == kAccOp) return a.acc_bf16 == b.acc_bf16 && a.acc_sr == b.acc_sr;
  const int k = op_index(op);
  if (a.prec[k] != b.prec[k] || (a.prec[k] == kernels::Prec::kFault && a.fault[k] != b.fault[k]))
    return false;
  if (k == static_cast<int>(kernels::Op::kQk)) return a.s_bf16 == b.s_bf16 && a.s_sr == b.s_sr;
  if (k == static_cast<int>(kernels::Op::kPv)) return a.pv_sr == b.pv_sr;
  if (k == static_cast<int>(kernels::Op::kSoftmax))
    return a.stable == b.stable && (!a.stable || (a.beta == b.beta && a.eps == b.eps));
  if (k == static_cast<int>(kernels::Op::kDelta)) return a.delta_dpp == b.delta_dpp;
  return true;
}

}  // namespace

plan::Plan candidate_plan(const Candidate& c, const SearchSpace& space,
                          const plan::Plan& recorded, const plan::Plan& reference) {
  for (const plan::Plan* p : {&recorded, &reference})
    if (p->n_layer != space.n_layer || p->n_head != space.n_head)
      throw Error(ExitCode::kInternal, "bisect: plan is " + std::to_string(p->n_layer) + "x" +
                                           std::to_string(p->n_head) + ", search space is " +
                                           std::to_string(space.n_layer) + "x" +
                                           std::to_string(space.n_head));
  const bool keep_low = (c.mode == Mode::kKeepLow);
  const plan::Plan& src = keep_low ? recorded : reference;
  plan::Plan p = keep_low ? reference : recorded;
  for (const auto& e : c.elements) {
    for (const auto& leaf : space.op_leaves(e)) {
      const bool head_op = op_index(leaf.op) >= 0 || leaf.op == kAccOp;
      bool bad_layer = leaf.layer >= space.n_layer || (leaf.layer < 0 && leaf.op != "head");
      bool bad_head = leaf.head >= space.n_head || (leaf.head < 0 && head_op);
      if (bad_layer || bad_head)
        throw Error(ExitCode::kInternal, "bisect: element " + to_string(leaf) +
                                             " is outside the model");
      if (leaf.op == "head") {
        p.head_fp32 = src.head_fp32;
        continue;
      }
      int m = module_index(leaf.op);
      if (m >= 0) {
        p.layers[leaf.layer].module_fp32[m] = src.layers[leaf.layer].module_fp32[m];
        continue;
      }
      take_op(p.layers[leaf.layer].heads[leaf.head], src.layers[leaf.layer].heads[leaf.head], leaf.op);
    }
  }
  return p;
}

plan::Plan candidate_plan(const Candidate& c, const SearchSpace& space,
                          const plan::Plan& recorded) {
  return candidate_plan(c, space, recorded, plan::apply(recorded, kFullPrecision));
}

SearchSpace space_between(const SearchSpace& space, const std::vector<plan::Plan>& recorded,
                          const std::vector<plan::Plan>& reference) {
  if (recorded.size() != reference.size())
    throw Error(ExitCode::kInternal, "bisect: space_between needs one reference per plan");
  SearchSpace out = space;
  auto differs = [&](auto&& pred) {
    for (size_t i = 0; i < recorded.size(); ++i)
      if (pred(recorded[i], reference[i])) return true;
    return false;
  };
  out.ops.clear();
  for (const auto& op : space.ops)
    if (differs([&](const plan::Plan& a, const plan::Plan& b) {
          for (int l = 0; l < space.n_layer; ++l)
            for (int h = 0; h < space.n_head; ++h)
              if (!same_op(a.layers[l].heads[h], b.layers[l].heads[h], op)) return true;
          return false;
        }))
      out.ops.push_back(op);
  out.modules.clear();
  for (const auto& m : space.modules) {
    const int k = module_index(m);
    if (differs([&](const plan::Plan& a, const plan::Plan& b) {
          for (int l = 0; l < space.n_layer; ++l)
            if (a.layers[l].module_fp32[k] != b.layers[l].module_fp32[k]) return true;
          return false;
        }))
      out.modules.push_back(m);
  }
  out.model_head = space.model_head &&
                   differs([](const plan::Plan& a, const plan::Plan& b) { return a.head_fp32 != b.head_fp32; });
  return out;
}

}  // namespace rwd::bisect
