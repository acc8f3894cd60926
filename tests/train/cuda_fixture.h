// A test fixture for GPU tests of the train layer: device_ is the CUDA device set up as training
// sets it up (deterministic cuBLAS, no TF32); the test skips cleanly without one.
#pragma once

#include <gtest/gtest.h>

#include "common/error.h"
#include "train/run_spec.h"

namespace rwd::train {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      device_ = setup_device("cuda");
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
  }
  torch::Device device_ = torch::kCPU;
};

}  // namespace rwd::train
