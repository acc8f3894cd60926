// Test helpers for the CUDA attention kernels: RAII device buffers, random inputs, and one-call
// runners for the GPU kernels and their CPU twins (kernels/attention_cpu.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"

namespace rwd::kernels::test {

bool have_gpu();

// Owns one cudaMalloc allocation; never throws from the destructor.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// FP32 model inputs of one attention call, (B, H, T, D); the kernels see bf16(x) plus x.
struct Inputs {
  AttentionParams p;
  std::vector<HeadFlags> flags;
  std::vector<float> q, k, v, d_o;
};

// Random normal q, k, v, dO; q and k are multiplied by `peak` (peakier logits).
Inputs make_inputs(int b, int h, int t, int d, bool causal, float peak, uint64_t seed);

// Outputs in FP32 storage. o holds BF16 values; o32 is Ō/l; grads are FP32 from the GPU, and
// BF16-rounded (or FP32 for bwd=fp32 heads) from the CPU twin.
struct Outputs {
  std::vector<float> o, o32, lse, dq, dk, dv, delta;
  std::vector<HeadStats> stats;
  int fwd_status = 0, bwd_status = 0;
};

// stats = false runs without monitors (the kernels' speculative stabilized path); simt_fp32
// sends heads that promote qk, pv or softmax to the SIMT reference kernels.
// ds_dq: BackwardArgs::ds_dq (-1 default, 0 dQ recomputed, 1 dQ from stored dS tiles).
Outputs run_gpu(const Inputs& in, bool backward = true, bool stats = true, bool simt_fp32 = false,
                int ds_dq = -1);
Outputs run_cpu(const Inputs& in, bool backward = true);
// FP64 reference on the given inputs (rounded to BF16 first when round_inputs).
Outputs run_reference(const Inputs& in, bool round_inputs);

float bf16_round(float x);
std::vector<float> bf16_round(const std::vector<float>& x);

// Max |a - b| over the elements of head h (all heads when h < 0) of a (B, H, T, per) array.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, const Inputs& in,
                    int per_row, int head = -1);
double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// Whether a and b, (B, H, T, per_row) arrays, hold the same bits in every element of head h.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b, const Inputs& in, int per_row,
               int head);
double max_abs(const std::vector<float>& a);

// GPU and CPU emulation round at the same points; only FP32 summation order differs. O is
// allowed 2 BF16 ulps of its magnitude; gradients (BF16-rounded) 2^-6 of the tensor's max,
// which a misplaced rounding point or a wrong formula exceeds by far (see the fault cases:
// a 4-ulp pv fault must not pass as default, checked in FlagsChangeOnlyNamedHeads).
// slack: elements beyond those allowed to differ (a row whose stability decision flipped).
// GoogleTest failures of the calling test.
void expect_agree(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                  const char* what, size_t slack = 0);
// expect_agree on O, LSE, delta, dQ, dK and dV (gradients rounded to BF16, as the caller
// does), with slack_rows whole rows of dim d allowed on top.
void expect_outputs_agree(const Outputs& gpu, const Outputs& cpu, int d, size_t slack_rows = 0);

}  // namespace rwd::kernels::test
