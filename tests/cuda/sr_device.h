// The device side of the stochastic-rounding agreement test: kernels/stochastic_round.h
// evaluated by a CUDA kernel (sr_device.cu) on cases the host evaluates too.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/stochastic_round.h"

namespace rwd::kernels::test {

// One draw: the call (seed, step, micro-batch, layer), the stream (site, b, h), the element
// (row, col) and the value rounded with its bits.
struct SrCase {
  uint64_t seed = 0;
  int64_t step = 0;
  int32_t micro = 0, layer = 0, site = 0, b = 0, h = 0, row = 0;
  uint32_t col = 0;
  float x = 0.0f;
};

// What a side computed for one case: the 16 bits and the BF16 pattern of sr(x).
struct SrResult {
  uint32_t bits = 0;
  uint16_t rounded = 0;
};

// One case, as the CPU twin (this header compiled by the host compiler) or a kernel computes it.
RWD_HOST_DEVICE inline SrResult sr_evaluate(const SrCase& c) {
  const uint64_t call = sr_call_key(c.seed, c.step, c.micro, c.layer);
  const uint64_t stream = sr_stream(call, static_cast<SrSite>(c.site), c.b, c.h);
  SrResult r;
  r.bits = sr_element_bits(stream, c.row, c.col);
  r.rounded = float_to_bf16_bits_sr(c.x, r.bits);
  return r;
}

// sr_evaluate of every case on the device (one thread each); throws std::runtime_error on a
// CUDA error.
std::vector<SrResult> sr_on_device(const std::vector<SrCase>& cases);

}  // namespace rwd::kernels::test
