// The block order of the causal attention launches (kernels/cuda/block_order.h), which the GPU
// kernels apply to blockIdx: every (tile, head) exactly once, longest tiles first within each
// group of heads, head order with a group of one, and the identity without causality.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "kernels/cuda/block_order.h"

namespace rwd::kernels::cuda {
namespace {

struct Grid {
  int n, n_bh;
};
constexpr Grid kGrids[] = {{32, 32}, {16, 96}, {64, 32}, {5, 3}, {7, 13}, {1, 1}, {3, 17}};

TEST(BlockOrder, EveryTileOfEveryHeadOnce) {
  for (const Grid g : kGrids) {
    for (int group : {1, 3, 8, kOrderHeads, 64}) {
      for (bool causal : {false, true}) {
        for (bool longest_last : {false, true}) {
          std::set<std::pair<int, int>> seen;
          for (int y = 0; y < g.n_bh; ++y) {
            for (int x = 0; x < g.n; ++x) {
              const BlockTile t = block_tile_of(x, y, g.n, g.n_bh, causal, longest_last, group);
              ASSERT_GE(t.tile, 0);
              ASSERT_LT(t.tile, g.n);
              ASSERT_GE(t.bh, 0);
              ASSERT_LT(t.bh, g.n_bh);
              seen.insert({t.tile, t.bh});
            }
          }
          EXPECT_EQ(seen.size(), static_cast<size_t>(g.n) * g.n_bh)
              << "grid " << g.n << " x " << g.n_bh << " group " << group;
        }
      }
    }
  }
}

// In launch order, a group's blocks never take a tile with more work than the block before, and
// the groups come in head order.
TEST(BlockOrder, LongestTilesFirstWithinEachGroupOfHeads) {
  for (const Grid g : kGrids) {
    for (int group : {3, 8, kOrderHeads}) {
      for (bool longest_last : {false, true}) {
        int prev_work = 1 << 30, prev_group = -1;
        for (int id = 0; id < g.n * g.n_bh; ++id) {
          const BlockTile t = block_tile_of(id % g.n, id / g.n, g.n, g.n_bh, true, longest_last, group);
          const int work = longest_last ? t.tile + 1 : g.n - t.tile;
          const int grp = t.bh / group;
          ASSERT_GE(grp, prev_group);
          if (grp == prev_group) {
            EXPECT_LE(work, prev_work) << "block " << id;
          } else {
            EXPECT_EQ(work, g.n) << "a group starts with its longest tiles";
          }
          prev_work = work;
          prev_group = grp;
        }
      }
    }
  }
}

TEST(BlockOrder, GroupOfOneIsHeadOrderAndNonCausalIsTheIdentity) {
  for (const Grid g : kGrids) {
    for (int y = 0; y < g.n_bh; ++y) {
      for (int x = 0; x < g.n; ++x) {
        const BlockTile head = block_tile_of(x, y, g.n, g.n_bh, true, true, 1);
        EXPECT_EQ(head.tile, g.n - 1 - x);
        EXPECT_EQ(head.bh, y);
        const BlockTile key = block_tile_of(x, y, g.n, g.n_bh, true, false, 1);
        EXPECT_EQ(key.tile, x);
        EXPECT_EQ(key.bh, y);
        const BlockTile plain = block_tile_of(x, y, g.n, g.n_bh, false, true);
        EXPECT_EQ(plain.tile, x);
        EXPECT_EQ(plain.bh, y);
      }
    }
  }
}

}  // namespace
}  // namespace rwd::kernels::cuda
