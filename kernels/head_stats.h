// Summing per-head monitor counters over several attention calls (micro-batches, a Python
// step's calls): the one rule every caller shares, so no counter is left out of a sum.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/attention_params.h"

namespace rwd::kernels {

// into[h] += from[h] for every head: the largest logit, every counter summed.
inline void merge_head_stats(std::vector<HeadStats>& into, const HeadStats* from, size_t heads) {
  if (into.size() < heads) into.resize(heads);
  for (size_t h = 0; h < heads; ++h) {
    into[h].max_logit = std::max(into[h].max_logit, from[h].max_logit);
    into[h].rows += from[h].rows;
    into[h].repeated_max_rows += from[h].repeated_max_rows;
    into[h].pbar_one += from[h].pbar_one;
    into[h].stable_pos += from[h].stable_pos;
    into[h].stable_neg += from[h].stable_neg;
    into[h].stable_guard += from[h].stable_guard;
  }
}

}  // namespace rwd::kernels
