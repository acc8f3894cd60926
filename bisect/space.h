// The bisect search space: elements (layer attention, heads, ops, layer modules, the model
// head) with their hierarchy, candidates built from them, and the candidate -> plan mapping.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace rwd::bisect {

// One searchable piece of the model. Printed as the plan-language target it stands for:
//   {2, -1, "attn"} -> "L2.attn"  (every op in the space of every head of layer 2)
//   {2,  3, "attn"} -> "L2.H3"    (every op in the space of head 3)
//   {2,  3, "pv"}   -> "L2.H3.pv" (a leaf)
//   {2, -1, "mlp"}  -> "L2.mlp"   (a leaf; likewise qkv, proj, ln)
//   {-1, -1, "head"}-> "head"     (embeddings, final LayerNorm, LM head; a leaf)
struct Element {
  int layer = -1;
  int head = -1;
  std::string op;
};
bool operator==(const Element& a, const Element& b);
bool operator!=(const Element& a, const Element& b);
std::string to_string(const Element& e);
std::string to_string(const std::vector<Element>& set);  // "{L2.H3.pv,L4.mlp}"

// kKeepLow: the elements stay as recorded (low precision), everything else is promoted to FP32,
//           including what lies outside the space. Empty set = the all-FP32 run.
// kPromote: the elements are promoted to FP32, everything else stays as recorded.
//           Empty set = the baseline (recorded) run.
enum class Mode { kKeepLow, kPromote };

struct Candidate {
  Mode mode = Mode::kKeepLow;
  std::vector<Element> elements;
};
std::string to_string(const Candidate& c);  // "low{...}" or "fp32{...}"

// The plan the bisect moves elements towards: everything in FP32, the rounding regimes too (S
// and the running O, l in FP32: `qk=sbf16`/`sr` and `acc=bf16`/`sr` off; a pv=sr flag stays,
// inert under pv=fp32 and bwd=fp32, which round no P); algorithmic choices (stable
// softmax, delta=dpp, naive attention, tiles) stay as recorded. `--reference PLAN` replaces it.
constexpr const char* kFullPrecision = "all=fp32;L*.H*.qk=low;L*.H*.qk=fp32;L*.H*.acc=fp32";

struct SearchSpace {
  int n_layer = 0, n_head = 0;
  // Per head; "acc" is the accumulator pseudo-op (running O and l, HeadFlags::acc_bf16).
  std::vector<std::string> ops = {"qk", "softmax", "pv", "o", "delta", "bwd"};
  std::vector<std::string> modules = {"qkv", "proj", "mlp", "ln"};             // per layer
  bool model_head = true;  // include the model-level "head" element
  // How deep the search descends: 0 a layer's attention is a leaf, 1 a head is, 2 an op is.
  // Long probes (bisect --hold) may stop at layers where heads would not fit in the budget.
  int depth = 2;

  // Throws UsageError for unknown op/module names or a negative size.
  void validate() const;
  // True if every op, every module and the model head are in the space, so that keep-low of
  // everything is the baseline run and promote of everything is the all-FP32 run.
  bool covers_everything() const;
  // Level 0, in order: L0.attn, L0.<modules...>, L1.attn, ..., then head.
  std::vector<Element> top_level() const;
  // attn of a layer -> its heads; a head -> its ops; leaves (at `depth`) -> empty.
  std::vector<Element> children(const Element& e) const;
  // The leaves under e at `depth` (e itself for a leaf), in space order.
  std::vector<Element> leaves(const Element& e) const;
  // The op-level leaves under e whatever the depth: what a plan is made of.
  std::vector<Element> op_leaves(const Element& e) const;
  // Number of leaves: the size of a naive one-probe-per-leaf sweep.
  int sweep_size() const;
  // Total order used for printing sets: layer, head, then op/module in space order, head last.
  bool before(const Element& a, const Element& b) const;
};

// The plan a candidate stands for, between the recorded plan and the reference plan (what
// `all=fp32` means to the search; default kFullPrecision applied to the recorded plan). A leaf
// carries its op's precision, fault strength and the regime of that op (qk: sbf16, sr; pv: sr;
// softmax: stable; delta: dpp; acc: acc=bf16, sr); a module leaf its FP32 flag; `head` the model head's.
//   kPromote: recorded, with every leaf of the elements taken from the reference.
//   kKeepLow: the reference, with every leaf of the elements taken from the recording.
// Naive attention and tiles are those of the base plan of each mode.
plan::Plan candidate_plan(const Candidate& c, const SearchSpace& space,
                          const plan::Plan& recorded, const plan::Plan& reference);
plan::Plan candidate_plan(const Candidate& c, const SearchSpace& space,
                          const plan::Plan& recorded);  // reference: kFullPrecision

// `space` without the op kinds, modules and model head on which every plan of `recorded` and
// its reference (reference[i] for recorded[i]) agree: promoting them changes nothing. The
// recorded plans are those of every step where the window's plan may change.
SearchSpace space_between(const SearchSpace& space, const std::vector<plan::Plan>& recorded,
                          const std::vector<plan::Plan>& reference);

}  // namespace rwd::bisect
