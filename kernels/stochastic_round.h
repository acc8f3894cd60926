// Deterministic stochastic rounding (SR) of FP32 to BF16 for the pv=sr, acc=sr and qk=sr
// heads: counter-based random bits, a pure function of the call's key and the element's
// coordinates, so a replay draws the same bits and reproduces the run bit for bit. One header
// for the CPU emulation and, under nvcc, the CUDA kernels (same bits on both).
//
// Why SR: round-to-nearest of P̄ = exp(S - m) is biased where P̄ sits just below 1 (it rounds
// to exactly 1 for repeated row maxima and near-ties); with mostly negative V that bias
// accumulates in Ō (the failure of Qiu & Yao 2025). SR rounds up with probability equal to
// the dropped fraction, so E[sr(x)] = x and the bias is gone.
//
// The bits (sr_element_bits):
//   call key   sr_call_key(seed, step, micro-batch, layer): splitmix64 chained over the four;
//   stream     sr_stream(call, site, b, h): one per rounding site (qk, pv, acc), batch, head;
//   element    16 bits of lowbias32(row_word(row) ^ col_word(col / 2)), the low half for an
//              even column, the high half for an odd one; the row and pair words are lowbias32
//              mixes of the index with the stream's halves. 32-bit integer work only (cheap on
//              a GPU); a (row, column pair) costs one mix where the row and pair words are
//              shared (the GPU's threads hold two adjacent columns of two rows), and the bits
//              depend only on the absolute row and column, never on the tiling.
// Columns: qk and pv use the key index; acc uses key_tile * kSrAccStride + d for Ō[d] and
// key_tile * kSrAccStride + kSrAccL for l, key_tile the index of the 64-key tile
// (kSrAccTile) after which the accumulator is rounded.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hash.h"  // splitmix64, RWD_HOST_DEVICE

namespace rwd::kernels {

// Rounding sites: each draws from its own stream, so S, P̄ and Ō of one element are rounded
// with unrelated bits.
enum class SrSite : uint32_t { kQk = 1, kPv = 2, kAcc = 3 };

// acc=sr rounds after every key tile of this many keys (the CUDA kernels' kBlockK); the
// column of Ō[d] in tile j is j * kSrAccStride + d, that of l j * kSrAccStride + kSrAccL.
constexpr int kSrAccTile = 64;
constexpr uint32_t kSrAccStride = 1u << 16;
constexpr uint32_t kSrAccL = kSrAccStride - 1;

// lowbias32 (C. Wellons' 32-bit integer hash): a bijection with good avalanche.
RWD_HOST_DEVICE inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The per-call key: a pure function of the run's seed, the step, the micro-batch and the layer.
RWD_HOST_DEVICE inline uint64_t sr_call_key(uint64_t seed, int64_t step, int64_t micro, int64_t layer) {
  uint64_t k = splitmix64(seed ^ 0x5352'6b65'7930'0001ull);  // "SRkey0", version 1
  k = splitmix64(k ^ static_cast<uint64_t>(step));
  k = splitmix64(k ^ static_cast<uint64_t>(micro));
  return splitmix64(k ^ static_cast<uint64_t>(layer));
}

// The stream of one rounding site of one (batch, head) of a call.
RWD_HOST_DEVICE inline uint64_t sr_stream(uint64_t call_key, SrSite site, int b, int h) {
  const uint64_t bh = (static_cast<uint64_t>(static_cast<uint32_t>(b)) << 32) | static_cast<uint32_t>(h);
  return splitmix64(splitmix64(call_key ^ (static_cast<uint64_t>(site) << 56)) ^ bh);
}

RWD_HOST_DEVICE inline uint32_t sr_row_word(uint64_t stream, int row) {
  return lowbias32(lowbias32(static_cast<uint32_t>(row) ^ static_cast<uint32_t>(stream)) + 0x9e3779b9u);
}
// The word of the column pair (col / 2) holding `col`.
RWD_HOST_DEVICE inline uint32_t sr_col_word(uint64_t stream, uint32_t col) {
  return lowbias32((col >> 1) + static_cast<uint32_t>(stream >> 32));
}
// 32 bits for the two columns of one pair in one row: low half for the even column.
RWD_HOST_DEVICE inline uint32_t sr_pair_bits(uint32_t row_word, uint32_t col_word) {
  return lowbias32(row_word ^ col_word);
}
RWD_HOST_DEVICE inline uint32_t sr_half(uint32_t pair_bits, uint32_t col) {
  return (col & 1u) ? pair_bits >> 16 : pair_bits & 0xffffu;
}
// The 16 bits of (row, col) given the row's word (sr_row_word): loops along a row.
RWD_HOST_DEVICE inline uint32_t sr_bits_in_row(uint64_t stream, uint32_t row_word, uint32_t col) {
  return sr_half(sr_pair_bits(row_word, sr_col_word(stream, col)), col);
}
// The 16 random bits of element (row, col) of a stream.
RWD_HOST_DEVICE inline uint32_t sr_element_bits(uint64_t stream, int row, uint32_t col) {
  return sr_bits_in_row(stream, sr_row_word(stream, row), col);
}

RWD_HOST_DEVICE inline uint32_t sr_float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
RWD_HOST_DEVICE inline float sr_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// SR of x to BF16 with 16 random bits r (the low 16 bits of `r`): add r to the low 16 bits of
// x's pattern, then truncate them. On the sign-magnitude pattern this rounds |x| up (away from
// zero) with probability (dropped bits) / 2^16, so E[result] = x for every finite x whose
// neighbours are finite, subnormals included (their spacing is uniform too). BF16 values (low
// bits 0) are returned unchanged for every r. Overflow: a finite |x| above the largest finite
// BF16 (0x7f7f) rounds to +-inf with probability (dropped bits) / 2^16, as if infinity were
// the next value up (round-to-nearest's threshold is half of that spacing); an infinity stays
// infinite (the carry never reaches past the low bits). NaN stays NaN: the sign and top
// payload bits are kept and the quiet bit set, as float_to_bf16_bits does, so truncation can
// never turn it into an infinity.
RWD_HOST_DEVICE inline uint16_t float_to_bf16_bits_sr(float x, uint32_t r) {
  uint32_t u = sr_float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += r & 0xffffu;
  return static_cast<uint16_t>(u >> 16);
}
// The same as an FP32 value (the BF16 value in FP32 storage).
RWD_HOST_DEVICE inline float round_bf16_sr(float x, uint32_t r) {
  return sr_bits_float(static_cast<uint32_t>(float_to_bf16_bits_sr(x, r)) << 16);
}

}  // namespace rwd::kernels
