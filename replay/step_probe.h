// `rewind step`: one recorded step run twice on identical state — the recorded plan (low
// precision) and with chosen ops promoted to FP32 — and the per-head differences the paper
// studies: O bias, delta bias, and the W_Q gradient difference with its rank-1 share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"

namespace rwd::replay {

struct HeadDiff {
  int layer = 0, head = 0;
  double o_mean = 0;        // mean of O_lp - O_hp over (B, T, D): signed bias
  double o_max_abs = 0;     // max |O_lp - O_hp|
  double delta_sum = 0;     // sum over (B, T) of delta_lp - delta_hp
  double dwq_norm = 0;      // Frobenius norm of dW_Q(lp) - dW_Q(hp), the head's (D, C) slice
  double dwq_top_share = 0; // sigma_1^2 / sum sigma_i^2 of that difference (1 = rank one)
};

struct StepProbeResult {
  int64_t step = 0;
  std::string plan_lp, plan_hp;  // canonical plans of the two runs
  float loss_lp = 0, loss_hp = 0;
  float grad_norm_lp = 0, grad_norm_hp = 0;
  std::vector<HeadDiff> heads;
  std::string to_json() const;
  std::string to_table() const;
};

// `fp32_spec`: targets like "L2.H8.pv;L2.H{1,7}.o" (each gets "=fp32" unless it has a mode).
StepProbeResult probe_step(store::Store& s, int64_t run, int64_t step, const std::string& fp32_spec,
                           const std::string& data_path);

// "L2.H8.pv;L3" -> "L2.H8.pv=fp32;L3=fp32"; items that already say `=mode` are kept.
std::string promote_spec(const std::string& targets);

}  // namespace rwd::replay
