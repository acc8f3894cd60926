// Stochastic rounding in the tensor-core attention kernels (qk=sr, pv=sr, acc=sr): the streams
// of a block's head and the rounding passes over a warp's tile in the mma C layout. The bits
// and the rounding are kernels/stochastic_round.h's, shared with the CPU twin, so the GPU draws
// what the CPU draws for every element: (row, column) are absolute query / key indices (acc:
// key tile j * kSrAccStride + d), never positions inside a tile.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/stochastic_round.h"

namespace rwd::kernels::cuda {

// The key tile of the kernels is the 64-key tile acc=sr names its columns by.
static_assert(kSrAccTile == kBlockK, "acc=sr's tile is the kernels' key tile");

// The streams of one (batch, head) of the call (a.sr_key), one per rounding site. bh: the
// head's (batch * heads + head) row.
struct SrStreams {
  uint64_t qk = 0, pv = 0, acc = 0;
};
__device__ __forceinline__ SrStreams sr_streams(uint64_t key, int bh, int heads) {
  const int b = bh / heads, h = bh % heads;
  return {sr_stream(key, SrSite::kQk, b, h), sr_stream(key, SrSite::kPv, b, h), sr_stream(key, SrSite::kAcc, b, h)};
}

// SR of two adjacent columns (even, odd) of one row with their pair's 32-bit draw.
__device__ __forceinline__ void sr_round_pair(float& even, float& odd, uint32_t bits) {
  even = round_bf16_sr(even, bits);
  odd = round_bf16_sr(odd, bits >> 16);
}

// SR of N 8-column blocks of a warp's m16 block in the C layout, rows = the stream's rows:
// x[nb][e] is row row_a + 8 (e / 2), column col0 + 8 nb + (e & 1), col0 even (the tile's first
// column + 2 (lane % 4)). The two columns of a pair share one 32-bit draw: one mix per pair
// and row, plus a word per row and per pair.
template <int N>
__device__ __forceinline__ void sr_round_rows(float (&x)[N][4], uint64_t stream, int row_a, uint32_t col0) {
  const uint32_t rw[2] = {sr_row_word(stream, row_a), sr_row_word(stream, row_a + 8)};
#pragma unroll
  for (int nb = 0; nb < N; ++nb) {
    const uint32_t cw = sr_col_word(stream, col0 + 8u * nb);
#pragma unroll
    for (int r = 0; r < 2; ++r) sr_round_pair(x[nb][2 * r], x[nb][2 * r + 1], sr_pair_bits(rw[r], cw));
  }
}

// The same for a transposed tile (the dK/dV kernel's S^T, P^T): C-layout rows are the stream's
// columns (keys key_a, key_a + 8), C-layout columns its rows (queries q0 + 8 nb + {0, 1}, q0 =
// the query tile's first row + 2 (lane % 4)). Adjacent keys live in other threads here, so each
// element takes its own mix.
__device__ __forceinline__ void sr_round_cols(float (&x)[8][4], uint64_t stream, int key_a, int q0) {
  const uint32_t keys[2] = {static_cast<uint32_t>(key_a), static_cast<uint32_t>(key_a + 8)};
  const uint32_t cw[2] = {sr_col_word(stream, keys[0]), sr_col_word(stream, keys[1])};
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) {
    const uint32_t rw[2] = {sr_row_word(stream, q0 + 8 * nb), sr_row_word(stream, q0 + 8 * nb + 1)};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[nb][e] = round_bf16_sr(x[nb][e], sr_half(sr_pair_bits(rw[e & 1], cw[e / 2]), keys[e / 2]));
    }
  }
}

// pv=sr on a tile of P̄ in FP32 registers (the pipelined loop's pf: p[nb][e], rows as the C
// layout's, columns col0 + 8 nb + (e & 1), col0 even): each value times bias (the pv fault's
// factor, 1 without one), then rounded stochastically in place, as exp_tile rounds the operand.
// rows: sr_row_word of the thread's two rows.
__device__ __forceinline__ void sr_round_p_tile(float (&p)[8][4], float bias, uint64_t stream,
                                                const uint32_t (&rows)[2], uint32_t col0) {
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) {
    const uint32_t cw = sr_col_word(stream, col0 + 8u * nb);
#pragma unroll
    for (int e = 0; e < 4; ++e) p[nb][e] = __fmul_rn(p[nb][e], bias);
#pragma unroll
    for (int r = 0; r < 2; ++r) sr_round_pair(p[nb][2 * r], p[nb][2 * r + 1], sr_pair_bits(rows[r], cw));
  }
}

// acc=sr after key tile j: Ō (kMt m16 blocks of D columns) and l of the warp's rows (first row
// w_row0) rounded stochastically, columns j * kSrAccStride + d and j * kSrAccStride + kSrAccL.
// The four lanes of a row hold the same l and draw the same bits for it.
template <int D, int kMt>
__device__ __forceinline__ void sr_round_acc(float (&o)[kMt][D / 8][4], float (&l)[kMt][2], uint64_t stream,
                                             int w_row0, int j) {
  const int lane = threadIdx.x % 32;
  const uint32_t col0 = static_cast<uint32_t>(j) * kSrAccStride;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const int row_a = w_row0 + mt * 16 + lane / 4;
    sr_round_rows<D / 8>(o[mt], stream, row_a, col0 + 2u * (lane % 4));
#pragma unroll
    for (int r = 0; r < 2; ++r) l[mt][r] = round_bf16_sr(l[mt][r], sr_element_bits(stream, row_a + 8 * r, col0 + kSrAccL));
  }
}

}  // namespace rwd::kernels::cuda
