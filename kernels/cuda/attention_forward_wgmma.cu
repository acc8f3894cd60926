// The plain D = 128 forward (forward_variant 0: no stabilized rule, monitors, extras or FP32
// operands) on Hopper's warpgroup MMA: one warpgroup per 64 query rows, Q and the K and V tiles
// (double-buffered, cp.async) in 128-byte-swizzled shared memory read by wgmma, S = Q K^T and
// Ō += P̄ V each one wgmma per 16 of the reduced dimension (P̄ from registers).
//
// Bits: the same as flash_forward_kernel<128, 0> (forward_block). wgmma's k16 products and
// FP32 accumulation give mma.sync's bits (experiments/cuda_bench/wgmma_probe.cu: every element
// of S and P̄V equal over 20 random trials), each accumulator sees the same k-steps in the same
// order, every row the same 64-key tiles (a 64-row tile never holds a key tile that is fully
// masked for some of its rows, which the mma.sync kernel skips per warp), and the softmax below
// is forward_block's with its specializations resolved: the same operations in the same order.
// AttentionCuda.WgmmaForwardEqualsMmaForwardBitwise checks it.
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace rwd::kernels::cuda {

namespace {

constexpr int kWgD = 128, kWgRows = 64;
constexpr int kWgTile = kWgRows * kWgD * 2;     // bytes of a 64 x 128 BF16 tile
constexpr int kWgSmem = 5 * kWgTile + 1024;     // Q, K[2], V[2], and the 1024-byte alignment

// Rows [row0, row0 + 64) of a (T, 128) BF16 matrix into a swizzle-128 tile (zeros past T).
__device__ __forceinline__ void load_tile_sw128(uint8_t* tile, const uint16_t* g, int row0, int T) {
#pragma unroll
  for (int i = 0; i < kWgRows * kWgD / 8 / 128; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * 128;  // 16-byte chunk: row c / 16
    const int r = c / 16, col = (c % 16) * 8;
    const bool valid = row0 + r < T;
    cp_async_16(tile + sw128_offset(r, col, kWgRows),
                valid ? g + static_cast<size_t>(row0 + r) * kWgD + col : g, valid);
  }
}

// Grid (ceil(T/64), B*H), 128 threads (one warpgroup; warp w owns rows q0 + 16w + lane/4 and
// + 8, in the mma C layout). Causal: the last query tiles (most key tiles) start first.
__global__ void __launch_bounds__(128, 2) flash_forward_wgmma_kernel(KernelArgs a) {
  const HeadFlags& hf = a.flags[blockIdx.y % a.heads];
  if (forward_variant(hf, a.stats != nullptr, a.simt_fp32) != 0) return;
  const FlagView f = decode_flags(hf);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* s_q = smem;
  uint8_t* s_k = smem + kWgTile;      // [2]
  uint8_t* s_v = smem + 3 * kWgTile;  // [2]

  const int T = a.seq, n_t = (T + kWgRows - 1) / kWgRows;
  const int q_tile = a.causal ? n_t - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int q0 = q_tile * kWgRows, bh = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t base = static_cast<size_t>(bh) * T * kWgD;
  const int n_kt = a.causal ? q_tile + 1 : (T + kBlockK - 1) / kBlockK;
  const int w_row0 = q0 + warp * 16;

  load_tile_sw128(s_q, a.q + base, q0, T);
  load_tile_sw128(s_k, a.k + base, 0, T);
  load_tile_sw128(s_v, a.v + base, 0, T);
  cp_async_commit();

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < n_kt; ++j) {
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    const int stage = j & 1;
    if (j + 1 < n_kt) {
      load_tile_sw128(s_k + (stage ^ 1) * kWgTile, a.k + base, (j + 1) * kBlockK, T);
      load_tile_sw128(s_v + (stage ^ 1) * kWgTile, a.v + base, (j + 1) * kBlockK, T);
      cp_async_commit();
    }

    // S = Q K_j^T (64 x 64), 8 k-steps of 16 from zero, as mma.sync accumulates.
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    const uint8_t* k_t = s_k + stage * kWgTile;
    wgmma_fence_operand(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgD / 16; ++kk) {
      const int off = (kk / 4) * kWgRows * 128 + (kk % 4) * 32;
      wgmma_m64n64k16_ss(s, wgmma_desc(s_q + off, 16, 1024), wgmma_desc(k_t + off, 16, 1024), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(s);

    // Scale, mask (causal and T tail) -> -inf: forward_block's scores() without extras.
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = __fmul_rn(a.scale, s[i]);
    const bool need_mask = (a.causal && j * kBlockK + kBlockK - 1 > w_row0) || (j + 1) * kBlockK > T;
    if (need_mask) {
      const int col0 = j * kBlockK + (lane % 4) * 2, row_a = w_row0 + lane / 4;
      const int last[2] = {a.causal ? min(row_a, T - 1) : T - 1, a.causal ? min(row_a + 8, T - 1) : T - 1};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = col0 + nb * 8 + (e & 1);
          s[nb * 4 + e] = col > last[e / 2] ? -INFINITY : s[nb * 4 + e];
        }
      }
    }
    // Row max: two partial maxima per row (even / odd n-blocks), then the quad.
    float r_m[2];
    {
      float mx[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e / 2][nb & 1] = fmaxf(mx[e / 2][nb & 1], s[nb * 4 + e]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        r_m[r] = fmaxf(mx[r][0], mx[r][1]);
        r_m[r] = fmaxf(r_m[r], __shfl_xor_sync(0xffffffffu, r_m[r], 1));
        r_m[r] = fmaxf(r_m[r], __shfl_xor_sync(0xffffffffu, r_m[r], 2));
      }
    }
    float m_new[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) m_new[r] = fmaxf(m[r], r_m[r]);

    // P̄ = exp(S - m_new), the row sums of the unrounded P̄, bf16(P̄) as A fragments.
    uint32_t pa[4][4];
    float rowsum[2] = {0.0f, 0.0f};
    const float m_log2[2] = {__fmul_rn(m_new[0], kLog2e), __fmul_rn(m_new[1], kLog2e)};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = fast_exp_shifted(s[nb * 4 + e], m_log2[e / 2]);
        rowsum[e / 2] += p[e];
      }
      pa[nb / 2][(nb % 2) * 2 + 0] = pack_bf16x2(p[0], p[1]);
      pa[nb / 2][(nb % 2) * 2 + 1] = pack_bf16x2(p[2], p[3]);
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      corr[r] = rescale_factor(m[r], m_new[r]);
      m[r] = m_new[r];
      float sum = rowsum[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[r] = l[r] * corr[r] + sum;
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        o[4 * i] *= corr[0];
        o[4 * i + 1] *= corr[0];
        o[4 * i + 2] *= corr[1];
        o[4 * i + 3] *= corr[1];
      }
    }
    // Ō += bf16(P̄) V_j: 4 k-steps of 16 keys. Waited for here: with the wait after the next
    // tile's barrier instead, ptxas serializes the wgmma instructions (C7515).
    const uint8_t* v_t = s_v + stage * kWgTile;
    wgmma_fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_m64n128k16_rs_tb(o, pa[kk], wgmma_desc(v_t + kk * 2048, kWgRows * 128, 1024));
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(o);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = w_row0 + lane / 4 + 8 * r;
    if (row >= T) continue;
    const size_t off = base + static_cast<size_t>(row) * kWgD;
    const float inv_l = 1.0f / l[r];
#pragma unroll
    for (int nb = 0; nb < kWgD / 8; ++nb) {
      const int col = nb * 8 + (lane % 4) * 2;
      const float x0 = o[nb * 4 + 2 * r] * inv_l, x1 = o[nb * 4 + 2 * r + 1] * inv_l;
      const uint32_t packed = static_cast<uint32_t>(float_to_bf16_bits(o_output(x0, f))) |
                              (static_cast<uint32_t>(float_to_bf16_bits(o_output(x1, f))) << 16);
      *reinterpret_cast<uint32_t*>(a.o_out + off + col) = packed;
      if (a.o32_out != nullptr) *reinterpret_cast<float2*>(a.o32_out + off + col) = make_float2(x0, x1);
    }
    if ((lane % 4) == 0) a.lse_out[static_cast<size_t>(bh) * T + row] = m[r] + logf(l[r]);
  }
}

}  // namespace

bool wgmma_forward_on(int dim) {
  if (dim != kWgD) return false;
  const char* env = std::getenv("REWIND_ATTN_WGMMA");
  return env == nullptr || std::string(env) != "0";
}

int launch_wgmma_forward(const KernelArgs& a, cudaStream_t stream) {
  const cudaError_t err = cudaFuncSetAttribute(flash_forward_wgmma_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.seq + kWgRows - 1) / kWgRows, a.batch * a.heads);
  flash_forward_wgmma_kernel<<<grid, 128, kWgSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace rwd::kernels::cuda
