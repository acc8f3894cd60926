// The block order of the causal attention launches as a pure function (block_tile in
// attention_common.cuh applies it to blockIdx; tests/kernels/block_order_test.cpp checks it on
// the CPU). A launch of grid (n tiles, n_bh (batch, head) pairs) starts its blocks in linear
// order (x fastest); causal tiles differ in work (query tile k: k + 1 key tiles; key tile k of
// the dK/dV kernel: n - k query tiles), and in head order the last heads' longest tiles end the
// launch on a few SMs (a greedy simulation of the D128 forward, 1024 blocks on 132 SMs: 13.6%
// over the ideal). Longest first across a group of `group` heads (every head's longest tile,
// then every head's next ...) leaves the short tiles for the tail (0.1% in the same
// simulation) while the K/V a group reads stays in L2 (8 heads x 2 MB at T = 4096, D = 128).
// Non-causal launches keep head order (equal tiles). No bits change: a block computes the same
// tile wherever it runs.
#pragma once

#include "common/host_device.h"

// -DREWIND_ORDER_HEADS=1 gives the head order with each head's longest tile first (the order
// before, for timing).
#ifndef REWIND_ORDER_HEADS
#define REWIND_ORDER_HEADS 8
#endif

namespace rwd::kernels::cuda {

constexpr int kOrderHeads = REWIND_ORDER_HEADS;

struct BlockTile {
  int tile, bh;  // tile index, (batch, head) of the launch's grid rows
};

// Block (x, y) of grid (n, n_bh). longest_last: the last tile has the most work (query tiles);
// else the first (key tiles).
RWD_HOST_DEVICE constexpr BlockTile block_tile_of(int x, int y, int n, int n_bh, bool causal, bool longest_last,
                                                 int group = kOrderHeads) {
  if (!causal) return {x, y};
  const int id = y * n + x, g0 = id / (n * group) * group;
  const int g_size = n_bh - g0 < group ? n_bh - g0 : group, r = id - g0 * n;
  const int rank = r / g_size;  // 0: the most work
  return {longest_last ? n - 1 - rank : rank, g0 + r % g_size};
}

}  // namespace rwd::kernels::cuda
