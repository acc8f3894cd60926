// kernels/stochastic_round.h on the GPU for the agreement test (sr_device.h): the same
// __host__ __device__ functions the attention kernels and the CPU twin call.
#include "tests/cuda/sr_device.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace rwd::kernels::test {

namespace {

__global__ void sr_kernel(const SrCase* cases, SrResult* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = sr_evaluate(cases[i]);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

std::vector<SrResult> sr_on_device(const std::vector<SrCase>& cases) {
  const int n = static_cast<int>(cases.size());
  SrCase* d_cases = nullptr;
  SrResult* d_out = nullptr;
  std::vector<SrResult> out(cases.size());
  check(cudaMalloc(&d_cases, cases.size() * sizeof(SrCase) + 16), "cudaMalloc");
  check(cudaMalloc(&d_out, out.size() * sizeof(SrResult) + 16), "cudaMalloc");
  cudaError_t err = cudaMemcpy(d_cases, cases.data(), cases.size() * sizeof(SrCase), cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    sr_kernel<<<(n + 255) / 256, 256>>>(d_cases, d_out, n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(out.data(), d_out, out.size() * sizeof(SrResult), cudaMemcpyDeviceToHost);
  cudaFree(d_cases);
  cudaFree(d_out);
  check(err, "sr_kernel");
  return out;
}

}  // namespace rwd::kernels::test
