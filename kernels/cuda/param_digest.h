// Device side of the parameter digest "d2" (common/hash.h: digest_term): the wrapping sum of
// one tensor's terms, computed where the tensor lives. Plain C++ header, no LibTorch.
#pragma once

#include <cstdint>

namespace rwd::kernels::cuda {

// Adds the digest terms of words[0..n) (device memory, 4-byte aligned) to *sum (device
// memory). Atomic additions mod 2^64 commute, so the result is the same on every run.
// Returns 0 or a cudaError_t value; stream is a cudaStream_t (nullptr = default stream).
int digest_word_sum(const uint32_t* words, int64_t n, unsigned long long* sum, void* stream);

}  // namespace rwd::kernels::cuda
