// The names and defaults of the plan language that its parser (plan.cpp) and its canonical
// printer (plan_canonical.cpp) share; private to plan/.
#pragma once

#include "plan/plan.h"

namespace rwd::plan::detail {

inline constexpr const char* kOpNames[kernels::kNumOps] = {"qk", "softmax", "pv", "o", "delta", "bwd"};
inline constexpr const char* kModuleNames[kNumModules] = {"qkv", "proj", "mlp", "ln"};
inline constexpr int kDefaultTile = 64;  // block_q and block_k unless a plan says tile= or tiling=off

}  // namespace rwd::plan::detail
