// FP16 (IEEE half) variant of the attention emulation for flash_deviation (Golden et al. FP16
// curves): the rounding points of kernels/attention_cpu.h with FP16 in place of BF16.
#pragma once

#include <vector>

namespace rwd::experiments {

// float -> nearest IEEE half (round to nearest even, subnormals, overflow to +-inf) -> float.
float round_fp16(float x);

// Known values and, where the compiler has _Float16, a comparison with its conversion over many
// random floats. Returns an empty string on success, else a description of the first mismatch.
const char* fp16_self_test();

// One causal head, (T, D) row-major, q, k, v already FP16-representable (callers round them).
// Rounding points (as the BF16 kernel, FP16 instead of BF16):
//   S = alpha * (sum_d q*k)  FP32 over d ascending; P̄ = expf(S - m), l, rescale: FP32
//   Ō = rescale * Ō + sum_c fp16(P̄_c) V_c  FP32, keys ascending;  O = fp16(Ō / l)
//   acc_fp16: running Ō and l rounded to FP16 after every key tile (pure-PyTorch flash)
// o: (T, D) FP16 values; o_pre: Ō / l before the final rounding.
struct Fp16Head {
  int t = 0, dim = 0;
  float alpha = 1.0f;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};

// Online softmax over key tiles of `tile` keys (query rows are independent, so no query tiling).
void fp16_flash_forward(const Fp16Head& h, int tile, bool acc_fp16, float* o, float* o_pre);

// Materialized S row and one softmax over it; same rounding points as flash with one tile.
void fp16_naive_forward(const Fp16Head& h, bool acc_fp16, float* o, float* o_pre);

}  // namespace rwd::experiments
