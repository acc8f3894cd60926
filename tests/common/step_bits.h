// Shared by the end-to-end tests: two recordings' steps compared bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/store.h"

namespace rwd::testing {

// Every step of `b` has the loss, grad norm, parameter digest and batch hash of the same step
// of `a`, and there are as many; `what` names `b` in a failure.
inline void expect_same_steps(const std::vector<store::StepRecord>& a, const std::vector<store::StepRecord>& b,
                              const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss_bits, b[i].loss_bits) << what << ", step " << i;
    EXPECT_EQ(a[i].grad_norm_bits, b[i].grad_norm_bits) << what << ", step " << i;
    EXPECT_EQ(a[i].param_digest, b[i].param_digest) << what << ", step " << i;
    EXPECT_EQ(a[i].batch_hash, b[i].batch_hash) << what << ", step " << i;
  }
}

}  // namespace rwd::testing
