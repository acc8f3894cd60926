// Predicted cost of a bisect probe: the step time of a candidate's run relative to the
// recorded step, from the fraction of each op kind it promotes to FP32, so that the search can
// choose the cheaper of two equivalent probes before running either.
#pragma once

#include <map>
#include <string>

#include "bisect/space.h"

namespace rwd::bisect {

// step time / recorded step time = 1 + attn_any (any attention op promoted: the per-head flag
// path) + attn_layers * (layers whose attention has a promoted op) / n_layer (each such layer's
// kernel runs its FP32 path, whatever the number of heads) + sum over kinds of
// kind_extra[kind] * (promoted leaves of the kind) / (leaves of the kind in the model).
// Kinds: the attention ops (qk softmax pv o delta bwd), the layer modules (qkv proj mlp ln) and
// "head" (embeddings, final LayerNorm, LM head). Leaves outside the searched space count too:
// FP32 in keep-low runs, as recorded in promote runs.
struct CostModel {
  std::string name;
  double attn_any = 0;
  double attn_layers = 0;
  std::map<std::string, double> kind_extra;

  // Fitted to gpt2-small BF16 steps on the H100: L2.H{1,7}.pv=fp32 1.16x (model 1.15x),
  // L*.attn=fp32 1.69x, all=fp32 3.65x; the 1.96 of non-attention FP32 split by FLOP share
  // (mlp 8, qkv 3, proj 1 x d^2 per token and layer; LM head d x vocab), LayerNorm a guess.
  static CostModel h100();
  // "h100"; throws UsageError for another name.
  static CostModel named(const std::string& name);

  // Predicted step time of the run a candidate stands for, relative to the recorded step.
  double step_cost(const Candidate& c, const SearchSpace& space) const;
};

}  // namespace rwd::bisect
