// Hopper warpgroup MMA (wgmma) wrappers for the attention kernels: shared-memory matrix
// descriptors for the 128-byte-swizzled layout, and the two shapes the D = 128 forward uses
// (S = Q K^T from shared memory, Ō += P̄ V with P̄ in registers). sm_90a only.
//
// Layout (one "swizzle-128" tile, base 1024-byte aligned): a matrix of R rows whose contiguous
// dimension is 64 BF16 wide per atom column; atom column c (elements 64c ... 64c + 63) holds
// R rows of 128 bytes from c * R * 128, and the 16-byte chunk k of row r sits at chunk
// k ^ (r % 8). Q and K ([row][d], K-major for the products) and V ([key][d], MN-major for
// Ō += P̄ V) all use it, R = their row count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace rwd::kernels::cuda {

// Byte offset of element (row, col) of a swizzle-128 tile with `rows` rows.
__device__ __forceinline__ int sw128_offset(int row, int col, int rows) {
  const int chunk = (col % 64) / 8;
  return (col / 64) * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr >> 4) & 0x3fff);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3fff) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3fff) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
  return d;
}

// The descriptor of the same tile `bytes` further on: only the start address field (bits 0-13,
// address / 16) moves, and shared addresses stay below 256 KB, so the low word takes the add
// without a carry. One add per k-step instead of rebuilding every field.
__device__ __forceinline__ uint64_t wgmma_desc_step(uint64_t d, uint32_t bytes) {
  return (d & ~uint64_t{0xffffffffu}) | static_cast<uint32_t>(static_cast<uint32_t>(d) + (bytes >> 4));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers around a wgmma batch, so that the compiler moves none of them
// between the fence and the wait (ptxas would then serialize the wgmma instructions).
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for A fragments in registers (S = Q K^T with Q in registers, Ō += P̄ V): pinned
// from the issue to the wait, so that no register of an operand the tensor cores still read is
// reused or spilled in between (FlashAttention-3 fences its register operands the same way).
template <int N>
__device__ __forceinline__ void wgmma_fence_operand_u32(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// Shared memory written by the generic proxy (st.shared, cp.async) becomes visible to wgmma.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d (64 x 64 per warpgroup: 32 floats a thread, the mma C layout per 8 columns) (+)= A B,
// A 64 x 16 and B 16 x 64 from shared memory, both K-major. accumulate = 0: d = A B.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

// d (64 x 64: 32 floats a thread) (+)= A B, A 64 x 16 in registers, B 16 x 64 from shared
// memory, MN-major (kTransB: Ō += P̄ V) or K-major (S = Q K^T). accumulate = 0: d = A B.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                                   int accumulate = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(kTransB), "r"(accumulate));
}

// d (64 x 128: 64 floats a thread) += A B, A 64 x 16 in registers (per warp the mma.sync A
// fragment of its 16 rows), B 16 x 128 from shared memory, MN-major (transposed).
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Rows [row0, row0 + kRows) of a (T, D) BF16 matrix into a swizzle-128 tile by cp.async, zeros
// past T (kNThr threads, 16 bytes each at a time). Dg < D: the matrix is (T, Dg), its columns
// past Dg arrive as zeros (a head of dim 80 or 96 on the D = 128 kernels: wgmma_pad_dim).
template <int D, int kRows, int kNThr, int Dg = D>
__device__ __forceinline__ void load_tile_sw128(uint16_t* tile, const uint16_t* g, int row0, int T) {
  constexpr int kChunks = kRows * D / 8;
  static_assert(kChunks % kNThr == 0, "tile/thread mismatch");
#pragma unroll
  for (int i = 0; i < kChunks / kNThr; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kNThr;
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    const bool valid = row0 + r < T && (Dg == D || col < Dg);
    cp_async_16(reinterpret_cast<uint8_t*>(tile) + sw128_offset(r, col, kRows),
                valid ? g + static_cast<size_t>(row0 + r) * Dg + col : g, valid);
  }
}

// S (64 x 64 per warpgroup) = Q K^T over D / 16 k-steps into s (its values are not read: the
// first k-step does not accumulate, which gives the bits of the mma.sync kernels' start from
// zeros and spares the 32 moves that zero s): issued (wgmma_scores_issue), then waited for
// (wgmma_scores_wait). q: this warpgroup's 64 rows of a swizzle-128 Q
// tile of kQRows rows; k: a swizzle-128 tile of 64 keys. kFence false: the caller fences the
// operands and issues wgmma.fence (one for several batches issued together).
template <int D, int kQRows = 64, bool kFence = true>
__device__ __forceinline__ void wgmma_scores_issue(float (&s)[32], const uint16_t* q, const uint16_t* k) {
  const uint64_t dq = wgmma_desc(q, 16, 1024), dk = wgmma_desc(k, 16, 1024);
  if constexpr (kFence) {
    wgmma_fence_operand(s);
    wgmma_fence();
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int col = (kk % 4) * 32;  // bytes into the 128-byte swizzle row
    wgmma_m64n64k16_ss(s, wgmma_desc_step(dq, (kk / 4) * kQRows * 128 + col),
                       wgmma_desc_step(dk, (kk / 4) * 64 * 128 + col), kk > 0);
  }
  wgmma_commit();
}
__device__ __forceinline__ void wgmma_scores_wait(float (&s)[32]) {
  wgmma_wait<0>();
  wgmma_fence_operand(s);
}
// The same with Q from registers: qf[kk] the mma.sync A fragment of this warp's 16 rows for
// k-step kk (ldmatrix from the swizzled tile); dk: the K tile's descriptor, wgmma_desc(k, 16,
// 1024).
template <int D, bool kFence = true>
__device__ __forceinline__ void wgmma_scores_rs_issue(float (&s)[32], uint32_t (&qf)[D / 16][4], uint64_t dk) {
  if constexpr (kFence) {
    wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[D / 4]>(qf));
    wgmma_fence_operand(s);
    wgmma_fence();
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    wgmma_m64n64k16_rs<0>(s, qf[kk], wgmma_desc_step(dk, (kk / 4) * 64 * 128 + (kk % 4) * 32), kk > 0);
  }
  wgmma_commit();
}

// o (64 x D per warpgroup) += P V over 4 k-steps of 16 keys, P as mma A fragments pa[kk], V a
// swizzle-128 tile of 64 keys: issued (wgmma_pv_issue; pa and o untouched until waited for),
// or issued and waited for (wgmma_pv). dv0: the V tile's descriptor, wgmma_desc(v, 64 * 128,
// 1024); kFence as for wgmma_scores_rs_issue.
template <int D, bool kFence = true>
__device__ __forceinline__ void wgmma_pv_issue(float (&o)[D / 2], const uint32_t (&pa)[4][4], uint64_t dv0) {
  if constexpr (kFence) {
    wgmma_fence_operand(o);
    wgmma_fence();
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t dv = wgmma_desc_step(dv0, kk * 2048);
    if constexpr (D == 64) {
      wgmma_m64n64k16_rs<1>(o, pa[kk], dv);
    } else {
      wgmma_m64n128k16_rs_tb(o, pa[kk], dv);
    }
  }
  wgmma_commit();
}
template <int D>
__device__ __forceinline__ void wgmma_pv(float (&o)[D / 2], uint32_t (&pa)[4][4], const uint16_t* v) {
  wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(pa));
  wgmma_pv_issue<D>(o, pa, wgmma_desc(v, 64 * 128, 1024));
  wgmma_wait<0>();
  wgmma_fence_operand(o);
  wgmma_fence_operand_u32(reinterpret_cast<uint32_t(&)[16]>(pa));
}

}  // namespace rwd::kernels::cuda
