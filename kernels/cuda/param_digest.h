// Device side of the parameter digest "d2" (common/hash.h: digest_term): the wrapping sum of
// each tensor's terms, computed where the tensors live. Plain C++ header, no LibTorch.
#pragma once

#include <cstdint>

namespace rwd::kernels::cuda {

// One tensor of a digest: its words (device memory, 4-byte aligned) and where its sum goes
// (device memory, added to).
struct DigestSegment {
  const uint32_t* words;
  int64_t n;
  unsigned long long* sum;
};

// Adds the digest terms of every segment's words[0..n) to its *sum, in one launch per 64
// tensors (gpt2-small's 148 parameters: 3 launches, where one a tensor queued 148 on the host
// of every recorded step). Atomic additions mod 2^64 commute, so the sums are the same on
// every run. Returns 0 or a cudaError_t value; stream is a cudaStream_t (nullptr = default).
int digest_word_sums(const DigestSegment* segs, int count, void* stream);

}  // namespace rwd::kernels::cuda
