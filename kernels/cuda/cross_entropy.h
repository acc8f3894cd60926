// Cross-entropy over BF16 logits in two passes, the GPU trainer's loss (train/fast_block.cpp).
//
// Autocast's loss widens the (B*T, V) BF16 logits to FP32 (1.6 GB for gpt2-small at B=8), runs
// log_softmax and its backward over that copy and casts the FP32 gradient back to BF16 for the
// head's GEMMs: about 14 GB of memory traffic a step. These kernels read the BF16 logits once
// forward (online max and sum of exponentials in FP32, then log-sum-exp and the row's loss) and
// once backward, writing the BF16 gradient (softmax - onehot) * scale directly: the same
// rounding points (FP32 math, one rounding of the gradient to BF16), 2.4 GB of traffic. Every
// sum runs in a fixed order (per thread, then a fixed tree), so both are bitwise repeatable.
// Plain C++ header, no LibTorch.
#pragma once

#include <cstdint>

namespace rwd::kernels::cuda {

// logits: rows x vocab BF16 (raw uint16_t), row-major with leading dimension `vocab`;
// targets: rows int64 in [0, vocab). Writes lse[r] = log(sum_j exp(x_rj)) and
// loss[r] = lse[r] - x_r,target (FP32). Returns 0 or a cudaError_t value.
int cross_entropy_forward(const uint16_t* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                          float* lse, float* loss, void* stream);

// dlogits[r, j] = bf16((exp(x_rj - lse[r]) - [j == target_r]) * scale[0]); scale: one FP32 on
// the device (the loss's incoming gradient over the number of rows), so no host sync.
int cross_entropy_backward(const uint16_t* logits, const int64_t* targets, const float* lse,
                           const float* scale, int64_t rows, int64_t vocab, uint16_t* dlogits,
                           void* stream);

}  // namespace rwd::kernels::cuda
