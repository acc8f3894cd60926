// The precision plan: (layer, head, op) -> mode, parsed from the override language of
// docs/plan.md, with a canonical string and a stable hash (the probe cache key). No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_params.h"

namespace rwd::plan {

// Non-attention modules that can be promoted to FP32 per layer (and the model-level ones).
enum class Module : uint8_t { kQkv = 0, kProj = 1, kMlp = 2, kLn = 3 };
constexpr int kNumModules = 4;

struct LayerPlan {
  std::vector<kernels::HeadFlags> heads;  // n_head entries
  bool naive = false;                     // attn=naive (materialized S); default flash
  bool module_fp32[kNumModules] = {false, false, false, false};
};

struct Plan {
  int n_layer = 0, n_head = 0;
  std::vector<LayerPlan> layers;  // n_layer entries
  bool head_fp32 = false;         // `head=fp32`: embeddings, final LayerNorm, tied LM head in FP32
  int block_q = 64, block_k = 64; // `tile=QxK`; `tiling=off` sets both to 0 (one tile)

  // The default (recorded-as-nothing) plan: everything low precision, flash, 64x64 tiles.
  static Plan defaults(int n_layer, int n_head);
  // Every op of every head and every module in FP32 (the "all-FP32" probe).
  static Plan all_fp32(int n_layer, int n_head);

  // Canonical text: parse(canonical()) == *this; equal plans give equal strings.
  std::string canonical() const;
  // 64-bit FNV-1a of canonical(), printed as 16 hex digits by hash_hex().
  uint64_t hash() const;
  std::string hash_hex() const;
  bool operator==(const Plan& o) const { return canonical() == o.canonical(); }
  bool operator!=(const Plan& o) const { return !(*this == o); }
};

// Whether some head of the plan rounds stochastically (qk=sr, pv=sr or acc=sr): its attention
// calls then read a key that changes with every step and micro-batch.
bool rounds_stochastically(const Plan& p);

// Parses `spec` (assignments separated by ';') on top of `base` for a model of the given
// size. Throws rwd::UsageError naming the character position and the offending text for
// unknown ops/modes, out-of-range layers/heads and malformed text.
Plan parse(const std::string& spec, int n_layer, int n_head);
Plan apply(const Plan& base, const std::string& spec);

}  // namespace rwd::plan
