// Hopper's tensor memory accelerator (TMA) and shared-memory barriers (mbarrier) for the
// attention kernels, sm_90a only: tiles of a (B*H, T, D) BF16 tensor land in shared memory in
// the 128-byte-swizzled layout wgmma reads (wgmma.cuh), issued by one thread and waited for on
// an mbarrier that counts the bytes, instead of every thread's cp.async. The tensor maps are
// encoded on the host (encode_tma_maps, attention_plan.cu) and passed as __grid_constant__
// kernel parameters.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace rwd::kernels::cuda {

// The maps of Q, K and V: each a 3-D view (D, T, B*H) of its tensor, box 64 x 64 x 1 (one
// swizzle atom column of 64 rows), 128-byte swizzle, rows past T read as zeros.
struct TmaMaps {
  CUtensorMap q, k, v;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An mbarrier expecting `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (the TMA unit) and other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of transactions the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the phase with the given parity (0, 1, 0, ... for its 1st, 2nd, 3rd completion)
// has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// The box at (c0, c1, c2) of `map` into shared memory at dst (1024-byte aligned for the swizzle),
// completing its bytes on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// Rows [row0, row0 + kRows) of head bh of `map` as a swizzle-128 tile of kRows rows (the layout
// of load_tile_sw128: atom column c at c * kRows * 128 bytes): D / 64 x kRows / 64 boxes.
template <int D, int kRows>
__device__ __forceinline__ void tma_load_tile(uint16_t* tile, const CUtensorMap* map, uint64_t* bar, int row0,
                                              int bh) {
#pragma unroll
  for (int c = 0; c < D / 64; ++c) {
#pragma unroll
    for (int rb = 0; rb < kRows / 64; ++rb) {
      tma_load_3d(tile + c * kRows * 64 + rb * 64 * 64, map, bar, c * 64, row0 + rb * 64, bh);
    }
  }
}

// A ring of kStages K/V tile buffers (64 keys x D each, swizzle-128) filled by TMA: bars[0]
// guards Q, bars[1 + s] the arrival of stage s, bars[1 + kStages + s] its release by the
// kWarps consumer warps (one arrival each). Tile t sits in stage t % kStages; its n-th use of
// a stage is phase n of both barriers. kProducerGroup: the loads come from a warpgroup of their
// own (warps kWarps ... kWarps + 3, FlashAttention-3's producer: one of its threads loads,
// waiting for each stage's release while the consumers compute; it gives its registers to the
// consumers, setmaxnreg 24 / 240); else from a consumer thread at the top of each of its tiles.
template <int D, int kStages, int kWarps, bool kProducerGroup = false>
struct KvRing {
  uint64_t* bars;
  uint16_t* k;  // [kStages][64][D]
  uint16_t* v;
  static constexpr uint32_t kTileBytes = 64 * D * sizeof(uint16_t);

  // The thread that loads: the producer warpgroup's first, or the first of the last one, which
  // runs every tile (the first skips the last causal tile), so its waits rarely stall it.
  static constexpr int kProducer = kProducerGroup ? kWarps * 32 : (kWarps / 4 - 1) * 128;

  // Thread 0 sets up the barriers; all threads of the block wait for it. Then the producer
  // loads Q (kRows rows from q0) and K/V tiles 0 ... kStages - 2 of n_kt.
  template <int kRows>
  __device__ __forceinline__ void start(uint16_t* s_q, const TmaMaps* tm, int q0, int bh, int n_kt) const {
    init();
    if (threadIdx.x == kProducer) {
      load_q<kRows>(s_q, tm, q0, bh);
      for (int t = 0; t < kStages - 1; ++t) produce(tm, t, n_kt, bh);
    }
  }
  __device__ __forceinline__ void init() const {
    if (threadIdx.x == 0) {
      mbar_init(&bars[0], 1);
      for (int i = 0; i < kStages; ++i) {
        mbar_init(&bars[1 + i], 1);
        mbar_init(&bars[1 + kStages + i], kWarps);
      }
      mbar_init_fence();
    }
    __syncthreads();
  }
  // The query tile (kRows rows from row q0), by the producer thread.
  template <int kRows>
  __device__ __forceinline__ void load_q(uint16_t* s_q, const TmaMaps* tm, int q0, int bh) const {
    mbar_arrive_expect_tx(&bars[0], kRows * D * sizeof(uint16_t));
    tma_load_tile<D, kRows>(s_q, &tm->q, &bars[0], q0, bh);
  }
  // K and V tile t (of n_kt) into its stage, once the stage's previous tile is released; by the
  // producer thread.
  __device__ __forceinline__ void produce(const TmaMaps* tm, int t, int n_kt, int bh) const {
    if (t >= n_kt) return;
    const int st = t % kStages;
    if (t >= kStages) mbar_wait(&bars[1 + kStages + st], (t / kStages - 1) & 1);
    mbar_arrive_expect_tx(&bars[1 + st], 2 * kTileBytes);
    tma_load_tile<D, 64>(k + st * 64 * D, &tm->k, &bars[1 + st], t * 64, bh);
    tma_load_tile<D, 64>(v + st * 64 * D, &tm->v, &bars[1 + st], t * 64, bh);
  }
  // After start: the producer warpgroup (kProducerGroup) loads tiles kStages - 1 ... n_kt - 1 as
  // their stages are released and is done; true for its threads, which then leave the block's
  // work. The consumers take the registers it gives back.
  __device__ __forceinline__ bool run_producer(const TmaMaps* tm, int n_kt, int bh) const {
    if constexpr (!kProducerGroup) {
      return false;
    } else {
      if (threadIdx.x < kWarps * 32) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
        return false;
      }
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
      if (threadIdx.x == kProducer) {
        for (int t = kStages - 1; t < n_kt; ++t) produce(tm, t, n_kt, bh);
      }
      return true;
    }
  }
  // A consumer warp at the top of tile j: the producer thread among the consumers loads tile
  // j + kStages - 1 (nothing to do with a producer warpgroup).
  __device__ __forceinline__ void produce_ahead(const TmaMaps* tm, int j, int n_kt, int bh) const {
    if constexpr (!kProducerGroup) {
      if (threadIdx.x == kProducer) produce(tm, j + kStages - 1, n_kt, bh);
      __syncwarp();
    }
  }
  __device__ __forceinline__ void wait_q() const { mbar_wait(&bars[0], 0); }
  __device__ __forceinline__ void wait(int t) const { mbar_wait(&bars[1 + t % kStages], (t / kStages) & 1); }
  // This warp is done reading tile t (its products waited for).
  __device__ __forceinline__ void release(int t) const {
    if (threadIdx.x % 32 == 0) mbar_arrive(&bars[1 + kStages + t % kStages]);
  }
};

// Any thread of this warpgroup (128 threads, named barrier `id`, 1..15) with pred set.
__device__ __forceinline__ bool warpgroup_any(bool pred, int id) {
  uint32_t out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\n"
      "bar.red.or.pred q, %2, 128, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(out)
      : "r"(static_cast<uint32_t>(pred)), "r"(id)
      : "memory");
  return out != 0;
}

}  // namespace rwd::kernels::cuda
